"""One learner's notebook, run apart (``labkit grade``'s runner; started by ``gradebox``, never
imported by labkit).

Run as a script (``python _gradeone.py SPEC``), so it imports no labkit: only the standard library,
nbformat and nbclient. Inside the sandbox gradebox set up (or as a plain child process), it reads
its spec (a small JSON file), copies the learner's folder in, drops root for the grader's user id,
sets the limits the kernel inherits, runs the notebook with nbclient (a cell past its limit
interrupted once, then the run ended; outputs past the cap dropped) with a last cell that writes the
kernel's grade log, and writes one JSON object to its kept stdout: {"stopped": why or "", "log": the
log's text or None, "errors": the cells' first error lines, "hints": {checker: the message its last
shown result carried}}.

Everything it reports is untrusted: the learner's code ran as the same user. The grader reads it
back with a size limit, checks every field, and judges again what it can (``classgrade``).
"""
import contextlib
import ctypes
import json
import os
import re
import resource
import shutil
import sys

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

LOG_NAME = ".labkit-grade-log.json"
LOG_CAP = 4 << 20  # bytes of the grade log read back: a notebook's checks write a few KiB
# a check's result as its cell shows it (labkit.check._core.CheckResult's text and markdown forms): its message is
# the hint ``labkit grade`` writes beside a check it cannot judge again itself (a function as the answer)
SHOWN = re.compile(r"^(?:[✓✅] PASS|[✗❌] not yet|[…⏳] not attempted yet) \[(\w+)\] (.*)$|"
                   r"^(?:[✓✅] \*\*Pass\*\*|[✗❌] \*\*Not yet\*\*|[…⏳] \*\*Not attempted yet\*\*) — `(\w+)`: (.*)$", re.S)


def _copy_in(src, dst):
    """The learner's files (plain files only) into the working folder."""
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if os.path.isfile(path) and not os.path.islink(path):
            shutil.copyfile(path, os.path.join(dst, name))


def _become(uid, gid, folder):
    """Hand the working folder to ``uid`` and become it: from here no capability is left."""
    for root, dirs, files in os.walk(folder):
        for name in [root] + [os.path.join(root, n) for n in dirs + files]:
            os.chown(name, uid, gid, follow_symlinks=False)
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    _no_new_privileges()


def _no_new_privileges():
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: setuid files grant nothing


def _hints(nb):
    """{checker: the message of its last result the cells showed}, from the executed notebook's outputs."""
    hints = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            data = out.get("data", {})
            for text in (data.get("text/markdown"), data.get("text/plain")):
                found = SHOWN.match(text) if isinstance(text, str) else None
                if found:
                    name, message = (found.group(1), found.group(2)) if found.group(1) else found.group(3, 4)
                    hints[name] = message[:500]
                    break
    return hints


def _limit(spec):
    for name, value in spec.get("rlimits", {}).items():
        which = getattr(resource, name)
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))


def _client(nb, spec, folder):
    cap = spec["output_cap"]

    class Client(NotebookClient):
        """Interrupt a cell past its limit once; a cell still running after a second limit ends the run. Outputs
        past ``cap`` bytes are dropped."""

        kept, timeouts = [0], {}

        async def _async_handle_timeout(self, timeout, cell=None):
            key = id(cell)
            self.timeouts[key] = self.timeouts.get(key, 0) + 1
            if self.timeouts[key] > 1:  # interrupted once and still running: it ignores SIGINT
                raise CellTimeoutError.error_from_timeout_and_cell("the cell ignored an interrupt", timeout, cell)
            return await super()._async_handle_timeout(timeout, cell)

        def output(self, outs, msg, display_id, cell_index):
            size = len(json.dumps(msg.get("content", {}), default=str))
            if self.kept[0] + size > cap:
                return None
            self.kept[0] += size
            return super().output(outs, msg, display_id, cell_index)

    return Client(nb, timeout=spec["cell_timeout_s"], kernel_name="python3", allow_errors=True,
                  interrupt_on_timeout=True, resources={"metadata": {"path": folder}})


FINAL_CELL = (
    "import importlib as _labkit_importlib, sys as _labkit_sys\n"
    "# the module the checks ran in (not a name the notebook may have rebound); imported here if no cell did\n"
    "_labkit_core = (_labkit_sys.modules.get('labkit.check._core')\n"
    "                or _labkit_importlib.import_module('labkit.check._core'))\n"
    "_labkit_core.export_for_grader({path!r}, learner={learner!r})")


def main(spec_path):
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")  # the result's channel, kept from the kernel
    folder = spec["folder"]
    if spec.get("src") and spec["src"] != folder:
        _copy_in(spec["src"], folder)
    if spec.get("uid") is not None and os.getuid() == 0:
        _become(spec["uid"], spec["gid"], folder)
    else:
        _no_new_privileges()
    _limit(spec)
    if spec.get("cpus"):  # the grader's share of the cores for this notebook: the kernel inherits it
        # CPUs this sandbox may not use: run on those it has, as before
        with contextlib.suppress(OSError, ValueError):
            os.sched_setaffinity(0, spec["cpus"])
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.chdir(folder)

    log = os.path.join(folder, LOG_NAME)
    nb = nbformat.read(os.path.join(folder, spec["notebook"]), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(FINAL_CELL.format(path=log, learner=spec["learner"])))
    stopped = ""
    try:
        _client(nb, spec, folder).execute(env=dict(os.environ))
    except CellTimeoutError:
        stopped = "timed out"
    except DeadKernelError:
        stopped = "the notebook's kernel died"
    except Exception as e:  # noqa: BLE001 -- the kernel would not start, the notebook would not run: say why
        stopped = f"the notebook could not be run ({type(e).__name__}: {str(e)[:200]})"
    text = None
    if os.path.isfile(log) and not os.path.islink(log):
        with open(log, "rb") as f:
            text = f.read(LOG_CAP + 1).decode("utf-8", "replace")
    errors = [f"{o.get('ename')}: {str(o.get('evalue'))[:200]}" for c in nb.cells if c.get("cell_type") == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"][:20]
    json.dump({"stopped": stopped, "log": text, "errors": errors, "hints": _hints(nb)}, out)
    out.flush()


if __name__ == "__main__":
    main(sys.argv[1])
