"""Time from a fault to a clean stop: the run has returned (or raised its clear error) and no child
process of it is left. Each fault is tried ``--repeats`` times; the next run in the same process must
then work, or the script says so.

    python benchmarks/faults.py --repeats 3
    -> one line per fault:  fault=<name> stop_s_median=<s> stop_s_max=<s> error=<what the learner sees>
    -> last line:           fault_stop_max_s=<slowest clean stop over every fault and repeat>

Faults: a DataLoader worker SIGKILLed (between batches, and in the middle of backward), a DDP peer
(world size 2) SIGKILLed, the process that started a world-size-2 run SIGKILLed while its ranks are
still importing torch, Ctrl-C in the middle of an accumulation cycle, the panel's Stop mid-run
(``lk.Lab``), an exception raised by the learner's ``on_step`` callback, and fp16 without loss scaling
diverging to inf/NaN. The clock starts when the fault is injected and stops when the run is over *and*
every child process is gone (psutil).

File faults (root: each makes the fault real on a 64 KiB tmpfs, where root's permissions would hide it;
without mount rights a line ``fault=<name> skipped=<why>`` says so): the peak cache and the corpus cache
on a full disk, ``sweep --out`` at /dev/full, a folder or a read-only place (refused before any run), the
disk filling during a sweep (the rows are printed), a process SIGKILLed inside a cache write (its temp
file is swept at the next use), and a planted shared temp folder (mode 0777, or owned by uid 65534). For
these the clock stops when the call has returned *and* no temp file is left; ``error`` is what it said.
"""
from __future__ import annotations

import _thread
import argparse
import contextlib
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

import labkit as lk  # noqa: E402
from labkit.engine.launch import live_children, rank_processes  # noqa: E402

def children():
    return live_children()


def until_no_children(t0, timeout=60.0) -> float:
    """Seconds from t0 until no child is left (raises if some outlive the timeout)."""
    deadline = time.monotonic() + timeout
    while children():
        if time.monotonic() > deadline:
            raise RuntimeError(f"children still alive {timeout:.0f} s after the fault: {children()}")
        time.sleep(0.02)
    return time.monotonic() - t0


def in_thread(cfg, **kw):
    box = {}

    def target():
        try:
            box["result"] = lk.run(cfg, **kw)
        except BaseException as e:  # noqa: BLE001 - the error is what we report
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


def kill_child(cfg, pick, wait_first=120):
    """Start a run, SIGKILL one of its children after the first update, time the clean stop."""
    first = threading.Event()
    t, box = in_thread(cfg, on_step=lambda r: first.set())
    if not first.wait(wait_first):
        raise RuntimeError("the run never finished its first update")
    victim = pick(children())
    t0 = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    t.join(120)
    if t.is_alive():
        raise RuntimeError("the run hung after the kill")
    return until_no_children(t0), box.get("error")


def loader_worker():
    cfg = lk.Config(model="tiny", micro_batch=2, steps=400, workers=2, data_cost_ms=3.0)
    return kill_child(cfg, lambda kids: kids[0])


def loader_worker_in_backward():
    """SIGKILL a loader worker from inside DDP's comm hook, in the middle of the 3rd backward pass:
    PyTorch's SIGCHLD handler then raises there, not in next(batches)."""
    from labkit.engine import ddp as ddp_mod

    real, calls, t0 = ddp_mod.counting_hook, [], []

    def hook(state, bucket):
        calls.append(1)
        if len(calls) == 3:
            t0.append(time.monotonic())
            os.kill(children()[0].pid, signal.SIGKILL)
            time.sleep(5.0)  # the SIGCHLD handler interrupts this at once
        return real(state, bucket)

    ddp_mod.counting_hook = hook
    try:
        lk.run(lk.Config(model="tiny", micro_batch=2, steps=50, workers=2))
    except lk.RunError as e:
        return until_no_children(t0[0]), e
    finally:
        ddp_mod.counting_hook = real
    raise RuntimeError("the killed worker went unnoticed")


def _session(sid):
    """Live processes of session ``sid``, its leader left out."""
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if p.pid != sid and os.getsid(p.pid) == sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (OSError, psutil.Error):
            pass
    return out


def parent_killed_at_start_up():
    """`python -m labkit run --world-size 2 --workers 1` SIGKILLed half a second after its ranks appear
    (they are setting up): ranks, their workers, the warm server and the resource tracker must go."""
    cmd = [sys.executable, "-m", "labkit", "run", "--model", "tiny", "--steps", "300", "--world-size", "2",
           "--workers", "1"]
    cli = subprocess.Popen(cmd, cwd=str(Path(__file__).resolve().parent.parent), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(rank_processes(psutil.Process(cli.pid))) < 2:  # warm: forks of its server; cold: spawned
            if time.monotonic() > deadline or cli.poll() is not None:
                raise RuntimeError("the run never started its ranks")
            time.sleep(0.02)
        time.sleep(0.5)
        n = len(_session(cli.pid))
        t0 = time.monotonic()
        cli.kill()
        cli.wait(10)
        while _session(cli.pid):
            if time.monotonic() - t0 > 60:
                raise RuntimeError(f"processes outlived their killed parent: {_session(cli.pid)}")
            time.sleep(0.02)
        return time.monotonic() - t0, f"CLI killed by SIGKILL; its {n} processes (ranks, resource tracker) gone"
    finally:
        for p in _session(cli.pid):
            p.kill()


def ddp_peer():
    cfg = lk.Config(model="tiny", micro_batch=2, steps=2000, world_size=2)
    return kill_child(cfg, lambda kids: rank_processes()[-1])


def ctrl_c_mid_accumulation():
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started in the background by a shell
        signal.signal(signal.SIGINT, signal.default_int_handler)
    cfg = lk.Config(model="tiny", micro_batch=2, steps=100, accum=8, workers=1, data_cost_ms=2.0)
    fired, armed = [], threading.Event()

    def interrupt_mid_cycle(rec):
        if not armed.is_set():  # once: a few micro-batches into the next accumulation cycle
            armed.set()

            def fire():
                fired.append(time.monotonic())
                _thread.interrupt_main()
            threading.Timer(0.03, fire).start()

    try:
        lk.run(cfg, on_step=interrupt_mid_cycle)
    except KeyboardInterrupt as e:
        return until_no_children(fired[0]), e
    raise RuntimeError("Ctrl-C did not reach the run")


def jupyter_interrupt():
    """Jupyter's *Interrupt kernel* (SIGINT to the kernel's process group) during a run with 2 loader workers."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", cwd=str(Path(__file__).resolve().parent.parent))
    try:
        kernel = psutil.Process(km.provisioner.process.pid)
        run_id = kc.execute("import labkit as lk\n"
                            "lk.run(lk.Config(model='tiny', micro_batch=2, steps=100000, workers=2))")
        deadline = time.monotonic() + 120
        while len(live_children(kernel)) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the kernel's run never started its loader workers")
            time.sleep(0.05)
        time.sleep(1.0)
        t0 = time.monotonic()
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=60)
        while reply["parent_header"].get("msg_id") != run_id:
            reply = kc.get_shell_msg(timeout=60)
        while live_children(kernel):
            if time.monotonic() - t0 > 60:
                raise RuntimeError("loader workers outlived the interrupt")
            time.sleep(0.02)
        dt = time.monotonic() - t0
        c = reply["content"]
        return dt, KeyboardInterrupt(c.get("evalue")) if c.get("ename") == "KeyboardInterrupt" else RuntimeError(c)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def panel_stop():
    lab = lk.Lab(preset="accumulation", steps=200, workers=1, data_cost_ms=2.0)
    lab.start()
    deadline = time.monotonic() + 120
    while not lab._records and time.monotonic() < deadline:  # the first update has been charted
        time.sleep(0.02)
    t0 = time.monotonic()
    lab.stop()
    if not lab.wait(120):
        raise RuntimeError("the panel's run did not end after Stop")
    return until_no_children(t0), None


def on_step_exception():
    t0 = []

    def bad(rec):
        t0.append(time.monotonic())
        raise ZeroDivisionError("a bug in the learner's callback")

    try:
        lk.run(lk.Config(model="tiny", steps=5, workers=1), on_step=bad)
    except ZeroDivisionError as e:
        return until_no_children(t0[0]), e
    raise RuntimeError("the callback's exception was swallowed")


def fp16_diverges():
    seen = []
    cfg = lk.Config(model="tiny", precision="fp16", loss_scaling="off", optimizer="sgd", lr=10.0, grad_clip=None,
                    steps=8)
    t_start = time.monotonic()
    try:
        lk.run(cfg, on_step=lambda r: seen.append(time.monotonic()))
    except lk.NonFiniteError as e:
        # No callback fires for the bad update itself: time from the last good update (or the start).
        return until_no_children(seen[-1] if seen else t_start), e
    raise RuntimeError("fp16 without scaling did not diverge")


# ---- file faults ------------------------------------------------------------------------------------

class Skipped(Exception):
    """This machine cannot make the fault real (no mount rights): said, not faked."""


@contextlib.contextmanager
def tmpfs(size="64k", readonly=False):
    """A small tmpfs in a fresh temp folder, unmounted afterwards."""
    root = Path(tempfile.mkdtemp(prefix="labkit-faults-"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(root)], capture_output=True,
                       text=True)
    if r.returncode:
        os.rmdir(root)
        raise Skipped(f"cannot mount a tmpfs ({r.stderr.strip() or 'not root'})")
    try:
        if readonly:
            subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], capture_output=True)
        os.rmdir(root)


def fill(folder: Path) -> None:
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 512):
            pass
    except OSError:
        pass  # ENOSPC: full
    finally:
        os.close(fd)


def temps(folder: Path) -> list:
    from labkit.base.paths import temp_owner

    return [p.name for p in folder.iterdir() if temp_owner(p.name) is not None]


@contextlib.contextmanager
def env(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def _clean(folder: Path, t0: float, said: str):
    left = temps(folder)
    if left:
        raise RuntimeError(f"temp files left behind: {left}")
    return time.monotonic() - t0, said


def peak_cache_full_disk():
    from labkit.engine import device

    with tmpfs() as mnt, env(LABKIT_DATA_DIR=str(mnt)):
        fill(mnt)
        t0 = time.monotonic()
        device._write_cache("faults", "fp32", {"flops": 1.0})  # each process used to leave a 0-byte <pid>.tmp
        return _clean(mnt, t0, "none: the peak stays in this process; no temp file left")


def corpus_cache_full_disk():
    from labkit.engine import data

    with tmpfs() as mnt, env(LABKIT_DATA_DIR=str(mnt)):
        text = mnt.parent / f"labkit-faults-{os.getpid()}.txt"
        text.write_text("a corpus line\n" * 20_000)
        err = io.StringIO()
        t0 = time.monotonic()
        try:
            with contextlib.redirect_stderr(err):
                out = data.corpus_path(text)
            out.unlink(), out.with_suffix(".json").unlink()
        finally:
            text.unlink()
        return _clean(mnt, t0, err.getvalue().strip())


def _sweep_cli(out: str, *extra):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "labkit", "sweep", "--model", "tiny", "--steps", "1", "--grid",
                        "accum=1,2", "--out", out, *extra], capture_output=True, text=True, timeout=300,
                       cwd=str(Path(__file__).resolve().parent.parent))
    dt = time.monotonic() - t0
    lines = r.stderr.strip().splitlines()
    if r.returncode != 2 or len(lines) != 1:
        raise RuntimeError(f"sweep --out {out}: exit {r.returncode}, stderr {r.stderr[-300:]!r}")
    return dt, lines[0]


def sweep_out_dev_full():
    return _sweep_cli("/dev/full")


def sweep_out_folder():
    return _sweep_cli(tempfile.gettempdir())


def sweep_out_read_only():
    with tmpfs(readonly=True) as mnt:
        return _sweep_cli(str(mnt / "rows.csv"))


def sweep_disk_fills_mid_sweep():
    from labkit import __main__ as cli

    with tmpfs() as mnt:
        real, done = cli.run, []

        def run_then_fill(cfg, **kw):
            res = real(cfg, **kw)
            done.append(1)
            if len(done) == 1:
                fill(mnt)
            return res

        cli.run = run_then_fill
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = cli.main(["sweep", "--model", "tiny", "--steps", "1", "--grid", "accum=1,2", "--out",
                               str(mnt / "rows.csv")])
        finally:
            cli.run = real
        t0 = time.monotonic()  # the fault is the last write; the rows must still be there
        if rc != 1 or len(json.loads(out.getvalue())) != 2:
            raise RuntimeError(f"the rows were lost: exit {rc}, stdout {out.getvalue()[:200]!r}")
        said = next(line for line in err.getvalue().splitlines() if line.startswith("error:"))
        return _clean(mnt, t0, said)


def cache_write_killed():
    from labkit.base import paths

    folder = Path(tempfile.mkdtemp(prefix="labkit-faults-"))
    code = ("import os, signal\nfrom labkit.base import paths\n"
            "def die(fd, blob):\n    os.write(fd, blob[:10])\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            f"paths._write_all = die\npaths.write_atomic({str(folder / 'stdlib-x.bin')!r}, b'x' * 1000)\n")
    try:
        subprocess.run([sys.executable, "-c", code], timeout=120)
        left = temps(folder)
        if len(left) != 1:
            raise RuntimeError(f"expected one temp file from the killed write, found {left}")
        old = time.time() - 2 * paths.STALE_AFTER_S
        os.utime(folder / left[0], (old, old))  # as when the cache is next used, a while later
        t0 = time.monotonic()
        removed = paths.sweep_stale_temps(folder)
        return _clean(folder, t0, f"none: the killed process's {removed[0]} was swept at the next use")
    finally:
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()


def planted_temp_folder():
    from labkit.base import paths

    root = Path(tempfile.mkdtemp(prefix="labkit-faults-"))
    real = paths.tempfile.gettempdir
    paths.tempfile.gettempdir = lambda: str(root)
    try:
        planted = paths.private_root()
        planted.mkdir()
        planted.chmod(0o777)  # another local user got there first
        t0 = time.monotonic()
        try:
            paths.private_dir("cache")
        except OSError as e:
            return _clean(planted, t0, str(e))
        raise RuntimeError("a shared, world-writable folder was accepted as private")
    finally:
        paths.tempfile.gettempdir = real
        for p in sorted(root.rglob("*"), reverse=True):
            p.rmdir()
        root.rmdir()


FILE_FAULTS = {"peak_cache_full_disk": peak_cache_full_disk, "corpus_cache_full_disk": corpus_cache_full_disk,
               "sweep_out_dev_full": sweep_out_dev_full, "sweep_out_folder": sweep_out_folder,
               "sweep_out_read_only": sweep_out_read_only, "sweep_disk_fills_mid_sweep": sweep_disk_fills_mid_sweep,
               "cache_write_killed": cache_write_killed, "planted_temp_folder": planted_temp_folder}

FAULTS = {"loader_worker_sigkill": loader_worker, "loader_worker_sigkill_in_backward": loader_worker_in_backward,
          "ddp_peer_sigkill": ddp_peer, "parent_killed_at_start_up": parent_killed_at_start_up,
          "ctrl_c_mid_accumulation": ctrl_c_mid_accumulation, "jupyter_interrupt": jupyter_interrupt,
          "panel_stop": panel_stop,
          "on_step_exception": on_step_exception, "fp16_nonfinite": fp16_diverges, **FILE_FAULTS}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="*", choices=list(FAULTS), help="a subset of the faults")
    args = ap.parse_args(argv)
    worst = 0.0
    for name in args.only or FAULTS:
        times, error = [], None
        try:
            for _ in range(args.repeats):
                dt, error = FAULTS[name]()
                times.append(dt)
                if lk.run(lk.Config(model="tiny", steps=1)).summary["status"] != "completed":
                    print(f"fault={name}: the next run in this process did not complete", file=sys.stderr)
                    return 1
        except Skipped as why:
            print(f"fault={name} skipped={why}", flush=True)
            continue
        worst = max(worst, max(times))
        said = ("none (stopped, partial result kept)" if error is None else error if isinstance(error, str)
                else f"{type(error).__name__}: {error}")
        said = " ".join(said.split())[:160]
        print(f"fault={name} stop_s_median={statistics.median(times):.2f} stop_s_max={max(times):.2f} "
              f"error={said}", flush=True)
    print(f"fault_stop_max_s={worst:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
