"""Why MFU is low when nothing waits: the tools of chapter 07 (kernels, shapes, torch.compile, optimizers).

    table = labkit.kernels.profile_step(config, trace_path="step.json")  # one profiled training step
    table.top_op(), table.share("matmul"), table.phase_share("optimizer")
    rows = labkit.kernels.mfu_sweep(config, "micro_batch", [1, 2, 4, 8])  # MFU against a knob
    rows = labkit.kernels.attention_sweep([128, 256, 512])               # SDPA backends: time and bytes

Everything here measures on the learner's device; nothing is typed in. Timings are interleaved (A B A B
...) and compared with the course's bootstrap verdict (``labkit.compare.verdict``), so a difference is
claimed only when the repeats show one. Tools that build a model build their own copy.
"""
from __future__ import annotations

import contextlib
import html
import importlib.util
import io
import math
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.profiler import profile, ProfilerActivity, record_function
from torch.utils._python_dispatch import TorchDispatchMode

from . import course
from ..base import paths
from ..tools import reference
from ..tools.compare import verdict
from ..engine.config import Config, _choice, _int, _num  # Config's own ConfigError checks, for this module's arguments
from ..base.errors import ConfigError
from ..base.numfmt import counted, number
from ..engine.data import make_loader
from ..engine.device import capabilities, cores, intra_op_threads, synchronize, torch_device
from ..engine.measure import LoadMeter, attention_backend, machine_load
from .memtrace import Tracer
from ..engine.model import GPT
from ..engine.precision import autocast, matmul_precision
from ..base.progress import Progress
from ..engine.train import make_optimizer, run

__all__ = ["out_dir", "bench_threads", "reference_summaries", "reference_overview", "cxx_compiler",
           "compile_ready", "op_kind", "ProfileTable", "profile_step", "profile_sentence", "compile_room", "mfu_sweep",
           "sweep_sentence", "same_config_sentence", "interleaved", "padding_sentence",
           "head_step", "compare_head_shapes", "fusion_demo", "compile_run", "compile_sentence", "breakeven_sentence",
           "adamw_impls", "fused_supported", "default_adamw", "optimizer_steps",
           "tf32_matmul", "plain", "sdpa_backends", "math_saved_dtype", "attention_sweep", "attention_verdict", "plot_sweeps",
           "plot_shares", "plot_attention", "plot_optimizers"]

# ---- small shared helpers ---------------------------------------------------------------------------


def out_dir() -> Path:
    """Where chapters write files a learner opens elsewhere (traces, snapshots): the repository's out/
    when the notebook runs from notebooks/ (as chapter 01 does), else this user's private temp folder
    (``paths.private_dir("out")``: mode 0o700, refused when another user owns it or could write to it)."""
    here = Path.cwd()
    if here.name != "notebooks":
        # never a fixed shared name under the temp dir: another local user could create it first and plant links
        return paths.private_dir("out")
    d = here.parent / "out"
    d.mkdir(parents=True, exist_ok=True)
    return d


def bench_threads(kind: str | None = None) -> int | None:
    """Intra-op threads for this chapter's runs and micro-benchmarks: one on a busy CPU (waiting threads spin,
    so two threads on two cores that other programs also use can make a step many times slower -- on one
    2-core test machine, 15x) and in CI mode (shared runners), every core on a quiet one; None off the CPU."""
    kind = kind or capabilities("auto").kind
    if kind != "cpu":
        return None
    return 1 if course.smoke() or machine_load(0.5)["busy"] else cores()


def _median(xs):
    return statistics.median(xs) if xs else None


# ---- arguments: refused before any work, in Config's ConfigError style ------------------------------------


def _need_config(name: str, value) -> None:
    if not isinstance(value, Config):
        raise ConfigError(name, value, "a labkit Config, e.g. lk.Config(model='tiny')")


def _need_threads(n_threads) -> None:
    if n_threads is not None:
        _int("n_threads", n_threads, 1, 4096)


def _need_budget(budget_s, allow_none: bool = False, allow_zero: bool = False) -> None:
    if budget_s is None and allow_none:
        return
    _num("budget_s", budget_s, 0.0, 24 * 3600.0, lo_open=not allow_zero)  # NaN and inf are refused too


def _need_ints(name: str, values, lo: int, hi: int) -> list:
    """A non-empty list of distinct integers in [lo, hi] (a repeated value would merge two points into one)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ConfigError(name, values, f"a list of integers from {lo} to {hi}")
    values = list(values)
    if not values:
        raise ConfigError(name, values, f"at least one integer from {lo} to {hi}")
    for v in values:
        _int(name, v, lo, hi)
    if len(set(values)) != len(values):
        raise ConfigError(name, values, "each value once")
    return values


def interleaved(fns: dict, repeats: int = 10, warmup: int = 2, budget_s: float | None = None, device=None) -> dict:
    """Seconds per call of each function, run A B C A B C ... so that a drift in the machine's load hits
    every arm alike. ``warmup`` rounds are dropped (first calls allocate and pick kernels). Stops early
    after ``budget_s`` once 3 rounds are in. Returns {name: [seconds, ...]}."""
    if not isinstance(fns, dict) or not fns or not all(callable(f) for f in fns.values()):
        raise ConfigError("fns", fns, "a non-empty dict {name: function taking no arguments}")
    _int("repeats", repeats, 1, 10**6)
    _int("warmup", warmup, 0, 10**6)
    _need_budget(budget_s, allow_none=True, allow_zero=True)  # 0: stop as soon as three rounds are in
    dev = device or torch_device()
    out = {k: [] for k in fns}
    t_start = time.perf_counter()
    for r in range(warmup + repeats):
        for name, fn in fns.items():
            synchronize(dev)
            t0 = time.perf_counter()
            fn()
            synchronize(dev)  # the call is over when the device has finished it
            if r >= warmup:
                out[name].append(time.perf_counter() - t0)
        done = r - warmup + 1
        if budget_s is not None and done >= 3 and time.perf_counter() - t_start > budget_s:
            break
    return out


def reference_summaries(*ids) -> dict:
    """{point id: summary} of the GPU reference points with these ids that completed; {} when the course
    ships no reference file (the chapters then show the learner's numbers only)."""
    return {p["id"]: p["summary"] for p in course.reference_points() if p.get("id") in ids and p.get("status") == "ok"
            and isinstance(p.get("summary"), dict)}


# The reference suite's sections chapter 07 reads, and where its GPU lines appear.
REFERENCE_SECTIONS = ("kernels", "precision", "best")
REFERENCE_PLACES = ("the MFU sweep", "the profile", "`torch.compile`", "the AdamW implementations", "TF32",
                    "attention")


def reference_overview(sections=REFERENCE_SECTIONS, places=REFERENCE_PLACES, gpu_only=("TF32",)) -> str:
    """One line for a chapter's start: which GPU reference measurements it can show beside the learner's,
    and where -- or that none are shipped, so each section shows the learner's device only (said once,
    not under every section) -- and which sections measure on an NVIDIA GPU only."""
    pts = [p for s in sections for p in course.reference_points(s) if p.get("status") == "ok"]
    where = ", ".join(places[:-1]) + f" and {places[-1]}" if len(places) > 1 else "".join(places)
    only = f" GPU-only sections (they skip elsewhere): {', '.join(gpu_only)}." if gpu_only else ""
    if not pts:
        return (f"*No GPU reference measurements are shipped in `data/reference/` yet: every number in this chapter "
                f"is your device's (the GPU reference lines under {where} are left out).{only}*")
    return (f"*GPU reference measurements: {reference.label(pts[0])} ({len(pts)} points); their lines appear "
            f"under {where}, beside your device's numbers.{only}*")


# ---- the C++ compiler Inductor needs on a CPU ----------------------------------------------------------


def cxx_compiler() -> str | None:
    """Path of the C++ compiler Inductor would call for CPU kernels, or None when there is none.

    Inductor writes C++ for CPU kernels and compiles it with ``torch._inductor.config.cpp.cxx`` (the
    environment's CXX, else g++); without one, torch.compile on a CPU fails at the first call."""
    names = []
    if os.environ.get("CXX"):
        names.append(os.environ["CXX"])
    with contextlib.suppress(Exception):  # a private config: read it where it exists
        import torch._inductor.config as ind  # deferred: torch's compiler, slow to import; private: read where it exists

        names += [c for c in ind.cpp.cxx if c]
    names += ["g++", "c++", "clang++"]
    for n in names:
        path = shutil.which(n)
        if path:
            return path
    return None


def compile_ready(kind: str | None = None) -> tuple:
    """(ok, reason): whether torch.compile can build kernels here. A CPU needs a C++ compiler; a CUDA
    GPU needs Triton; Apple's MPS backend is experimental in Inductor."""
    kind = kind or capabilities("auto").kind
    if kind == "cpu":
        cxx = cxx_compiler()
        if cxx is None:
            return False, ("no C++ compiler found (looked for $CXX, g++, c++, clang++): Inductor writes C++ for CPU "
                           "kernels and needs one to build them. Install one (Debian/Ubuntu: `apt install g++`; "
                           "macOS: `xcode-select --install`), then restart the kernel.")
        return True, f"C++ compiler for Inductor's CPU kernels: {cxx}"
    if kind == "cuda":
        if importlib.util.find_spec("triton") is None:
            return False, "Triton is not installed: Inductor generates GPU kernels in Triton (pip install triton)."
        return True, "Triton found: Inductor generates GPU kernels in it"
    return False, (f"torch.compile's Inductor backend is experimental on {kind}: this chapter compiles on CPU or "
                   "CUDA only")


# ---- reading a profiler table -------------------------------------------------------------------------

# ATen ops that are matrix products (the work tensor cores / AMX / BLAS do fast).
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                        "aten::_addmm_activation", "aten::addbmm", "aten::dot", "aten::mv", "aten::_mm_plus_mm",
                        "aten::_scaled_mm", "aten::_int_mm"})
PHASES = ("step", "forward", "backward", "optimizer")  # the ranges profile_step labels with record_function


def op_kind(name: str) -> str:
    """'matmul', 'attention' (a scaled-dot-product kernel: matmuls and softmax in one), 'other' (element-wise,
    norms, softmax, copies, reductions: memory-bound work), or 'range' (not an op: a labelled phase,
    an autograd node, an optimizer's Python wrapper)."""
    if name in MATMUL_OPS:
        return "matmul"
    if name.startswith("aten::") and ("scaled_dot_product" in name or "flash_attention" in name
                                      or "efficient_attention" in name or "cudnn_attention" in name):
        return "attention"
    if name.startswith("aten::"):
        return "other"
    return "range"


@dataclass(repr=False)
class ProfileTable:
    """One profiled training step, read the way a person reads ``prof.key_averages().table()``.

    ``rows``: one dict per row of the profiler's table (name, self_s, total_s, calls, kind), by self time;
    ``phases``: seconds in each labelled range (step, forward, backward, optimizer). On a GPU the times
    are device (kernel) times, on a CPU the calling thread's time. ``wall_s`` (GPU): the step's wall time,
    timed apart (unprofiled, synchronised); the kernels fill only part of it, and the rest -- the GPU idle
    between kernels while Python, autograd and the launches run -- is the ``idle`` share."""

    rows: list
    phases: dict
    device: str
    time_source: str
    text: str = ""                 # the profiler's own table, as printed
    trace_path: str | None = None
    threads: int | None = None
    config: dict = field(default_factory=dict)
    wall_s: float | None = None

    def ops(self) -> list:
        """Rows that are ATen operations (no ranges), most self time first."""
        return [r for r in self.rows if r["kind"] != "range"]

    def top(self, n: int = 10) -> list:
        return self.ops()[:n]

    def top_op(self) -> str:
        """The operation with the most self time: where the step's time actually went."""
        ops = self.ops()
        return ops[0]["name"] if ops else ""

    def total_s(self) -> float:
        """Self time summed over every row: all the time the profiler attributed to something."""
        return sum(r["self_s"] for r in self.rows)

    def on_wall_time(self) -> bool:
        """Whether the shares are of the step's wall time (a GPU step timed apart) rather than of the time
        the profiler attributed (a CPU's calling thread, which is busy for the whole step)."""
        return self.device == "cuda" and bool(self.wall_s)

    def basis_s(self) -> float:
        """What every share divides: the GPU step's wall time, else all the profiled self time."""
        total = self.total_s()
        # kernels on several streams could overlap past the wall time: never let a share exceed the whole
        return max(self.wall_s, total) if self.on_wall_time() else total

    def basis_words(self) -> str:
        if self.on_wall_time():
            return "of the step's wall time"
        if self.device == "cuda":
            return "of the step's kernel time (the gaps between kernels are not in it)"
        return "of the step's time on the calling thread"

    def kinds(self) -> tuple:
        """The kinds whose shares add up to the whole step: on a GPU timed apart, the idle share too."""
        return ("matmul", "attention", "other", "range") + (("idle",) if self.on_wall_time() else ())

    def share(self, kind: str) -> float:
        """Share of the step (``basis_s``) in ops of one kind ('matmul', 'attention', 'other', 'range'), or
        'idle': the part of a GPU step's wall time in which no kernel ran (0 where there is no wall time)."""
        basis, total = self.basis_s(), self.total_s()
        if not basis:
            return 0.0
        if kind == "idle":
            return max(0.0, 1.0 - total / basis)
        return sum(r["self_s"] for r in self.rows if r["kind"] == kind) / basis

    def calls(self, kind: str) -> int:
        return sum(r["calls"] for r in self.rows if r["kind"] == kind)

    def phase_share(self, phase: str) -> float:
        """A labelled phase's time over the whole step's ('optimizer' / 'step')."""
        step = self.phases.get("step") or 0.0
        return (self.phases.get(phase) or 0.0) / step if step else 0.0

    def phases_markdown(self) -> str:
        """The labelled ranges and their total time (which includes every op inside them)."""
        lines = ["| range | total time | what it covers |", "|---|---|---|"]
        words = {"step": "the whole training step", "forward": "forward pass (with the loss)",
                 "backward": "backward pass", "optimizer": "optimizer.step() and zero_grad()"}
        for p in PHASES:
            if p in self.phases:
                lines.append(f"| `{p}` | {1e3 * self.phases[p]:.2f} ms | {words[p]} |")
        return "\n".join(lines)

    def markdown(self, n: int = 10) -> str:
        """The top ``n`` operations by self time, as a markdown table, with each one's kind."""
        basis = self.basis_s() or 1.0
        col = "% of wall time" if self.on_wall_time() else "% of step"
        lines = [f"| # | operation | kind | self time | {col} | calls |", "|---|---|---|---|---|---|"]
        for i, r in enumerate(self.top(n)):
            lines.append(f"| {i + 1} | `{r['name']}` | {r['kind']} | {1e3 * r['self_s']:.2f} ms | "
                         f"{100 * r['self_s'] / basis:.1f} % | {r['calls']} |")
        return "\n".join(lines)

    def html(self, n: int = 25) -> str:
        """The profiler's table as an HTML table: every row (operations and ranges alike, as the profiler
        prints it), sorted by self time, with self and total time and calls. Numbers never wrap; a long
        name wraps inside its own cell, so no column is cut in two (the printed table's fault at a
        notebook's width)."""
        total = self.total_s() or 1.0
        cell = 'style="text-align:right; white-space:nowrap; padding:0 0.6em"'
        head = "".join(f"<th {cell}>{h}</th>" for h in ("self time", "self %", "total time", "calls"))
        body = []
        for r in self.rows[:n]:
            nums = (f"{1e3 * r['self_s']:,.3f} ms", f"{100 * r['self_s'] / total:.1f} %",
                    f"{1e3 * r['total_s']:,.3f} ms", f"{r['calls']:,}")
            body.append(f'<tr><td style="text-align:left"><code>{html.escape(r["name"])}</code></td>'
                        + "".join(f"<td {cell}>{v}</td>" for v in nums) + "</tr>")
        caption = (f"The profiler's table of one step: {min(n, len(self.rows))} of {len(self.rows)} rows, most "
                   f"self time first ({html.escape(self.time_source)}; self % of all the self time in the table).")
        return (f'<table><caption style="caption-side:top; text-align:left">{caption}</caption>'
                f'<thead><tr><th style="text-align:left">name</th>{head}</tr></thead>'
                f"<tbody>{''.join(body)}</tbody></table>")

    def _repr_html_(self) -> str:
        return self.html()

    def __repr__(self) -> str:  # short: display() in a terminal shows this, a notebook the HTML table
        return f"ProfileTable({self.device}, {len(self.rows)} rows, top operation {self.top_op() or 'none'})"


def _times(evt, cuda: bool) -> tuple:
    """(self seconds, total seconds) of one key_averages row: device time on a GPU, CPU time otherwise.
    (torch renamed cuda_time to device_time; both spellings are read.)"""
    if cuda:
        self_us = getattr(evt, "self_device_time_total", None)
        if self_us is None:
            self_us = getattr(evt, "self_cuda_time_total", 0.0)
        total_us = getattr(evt, "device_time_total", None)
        if total_us is None:
            total_us = getattr(evt, "cuda_time_total", 0.0)
    else:
        self_us, total_us = evt.self_cpu_time_total, evt.cpu_time_total
    return self_us / 1e6, total_us / 1e6


def read_profile(prof, device: str, row_limit: int = 25) -> tuple:
    """(rows, phases, printed table) from a finished ``torch.profiler.profile``.

    Rows are the host-side operations and ranges. On a GPU each one carries the device time of the kernels
    it launched; the profiler also lists the kernels themselves (and GPU copies of the ranges) as rows of
    their own, which are left out here so that no kernel is counted twice."""
    cuda = device == "cuda"
    rows, phases = [], {}
    for evt in prof.key_averages():
        if cuda and getattr(evt, "device_type", DeviceType.CPU) != DeviceType.CPU:
            continue  # a kernel (or an annotation on the GPU's timeline): already in its launching op's time
        self_s, total_s = _times(evt, cuda)
        if evt.key in PHASES:
            # a range's own self time is its Python overhead; its total is the phase
            phases[evt.key] = phases.get(evt.key, 0.0) + total_s
        rows.append({"name": evt.key, "self_s": self_s, "total_s": total_s, "calls": int(evt.count),
                     "kind": op_kind(evt.key)})
    rows.sort(key=lambda r: r["self_s"], reverse=True)
    if cuda and not phases.get("step"):  # no device time on the ranges (an older profiler): use the kernels'
        phases["step"] = sum(r["self_s"] for r in rows)
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    try:
        text = prof.key_averages().table(sort_by=sort, row_limit=row_limit)
    except (KeyError, AttributeError, ValueError):  # older torch spells it self_cuda_time_total
        text = prof.key_averages().table(sort_by="self_cuda_time_total" if cuda else sort, row_limit=row_limit)
    return rows, phases, text


def _build(config: Config, dev):
    """A fresh model, optimizer and one batch of ``config`` on ``dev`` (the engine's own pieces)."""
    torch.manual_seed(config.seed)
    model = GPT(config.spec, config.dropout, config.checkpointing, config.checkpoint_every).to(dev)
    opt = make_optimizer(config, model.parameters())
    loader, _ = make_loader(config)
    x, y = (t.to(dev) for t in next(iter(loader)))
    return model, opt, x, y


def _train_step(model, opt, x, y, config, kind, labelled: bool = False):
    """One plain training step (forward, backward, optimizer), optionally labelled for the profiler."""
    label = record_function if labelled else (lambda _name: contextlib.nullcontext())
    with label("step"):
        with label("forward"), attention_backend(config.attention), autocast(kind, config.precision):
            loss = model(x, y)
        with label("backward"), attention_backend(config.attention):
            loss.backward()
        with label("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
    return loss


# The profiler's C++ side (kineto) logs "USDT:<time> <pid>:<tid> SyncActivityProfilerHandler.cpp:52]
# profiler_start" (and _stop) straight to file descriptor 2, past sys.stderr: a notebook shows it as an error box.
_PROFILER_NOTE = re.compile(r"^(USDT|STAGE):.*(profiler_(start|stop)|Stage|[Pp]rofiler)")


@contextlib.contextmanager
def _quiet_fd2(heard: list):
    """Run the body with file descriptor 2 sent to a temp file; afterwards every line it caught goes to
    ``heard``, and the lines that are not the profiler's start/stop notes are written back to sys.stderr
    (a real error is never swallowed)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no fd 2 to redirect (a closed stderr): nothing to quiet
        yield
        return
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            lines = f.read().decode("utf-8", "replace").splitlines()
            heard.extend(lines)
            rest = [ln for ln in lines if ln.strip() and not _PROFILER_NOTE.search(ln)]
            if rest:
                print("\n".join(rest), file=sys.stderr, flush=True)


def _check_trace_path(trace_path) -> Path | None:
    """Before any work: a trace goes to a regular file or to a name that does not exist yet, in a folder
    that can take a new file -- never onto a folder, a device such as /dev/full, a pipe or a symlink."""
    if trace_path is None:
        return None
    if not isinstance(trace_path, (str, os.PathLike)) or not str(trace_path):
        raise ConfigError("trace_path", trace_path, "a file name (str or pathlib.Path), or None for no trace")
    path = Path(trace_path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        paths.check_writable(path)  # ValueError: exists and is not a regular file; OSError: folder refuses
    except ValueError as e:
        raise ConfigError("trace_path", str(path), f"a regular file or a name that does not exist yet ({e})") from None
    except OSError as e:
        raise OSError(f"trace_path={str(path)!r}: cannot write there ({e})") from None
    return path


def _export_trace(prof, path: Path) -> None:
    """The Chrome/Perfetto trace, onto ``path`` atomically. The profiler writes it into a private temp
    folder first (its own save only logs a failure, in C++, and leaves a stray file); labkit then checks
    that the trace is there and moves it with ``paths.write_atomic``, which raises on any failure."""
    heard = []
    with tempfile.TemporaryDirectory(prefix="labkit-trace-") as tmp:  # mode 0o700; removed, whatever happens
        raw = Path(tmp) / "trace.json"
        with _quiet_fd2(heard):
            prof.export_chrome_trace(str(raw))
        if not raw.is_file() or raw.stat().st_size == 0:
            said = "; ".join(ln.strip() for ln in heard if ln.strip())[:300] or "no message"
            raise OSError(f"the profiler could not write its trace for {path} (it said: {said})")
        paths.write_atomic(path, raw.read_bytes())


def _step_wall_s(model, opt, x, y, config, kind, dev, repeats: int = 3) -> float | None:
    """A CUDA step's wall time, unprofiled and synchronised (median of ``repeats``); None elsewhere (a CPU's
    profiled thread is busy for the whole step, so its self times already add up to it)."""
    if kind != "cuda":
        return None
    times = interleaved({"step": lambda: _train_step(model, opt, x, y, config, kind)}, repeats=repeats, warmup=0,
                        device=dev)["step"]
    return _median(times)


def profile_step(config: Config, trace_path=None, warmup: int = 2, n_threads: int | None = None,
                 row_limit: int = 25) -> ProfileTable:
    """Profile one training step of ``config`` (after ``warmup`` unprofiled steps, which allocate and pick
    kernels) and read the profiler's table. On a GPU the step's wall time is also timed apart (three
    unprofiled steps), so the shares are of the wall time and the GPU's idle share shows. ``trace_path``:
    also export a Chrome/Perfetto trace there (a regular file or a new name; written atomically, and a
    failed write raises)."""
    _need_config("config", config)
    trace = _check_trace_path(trace_path)
    _int("warmup", warmup, 0, 1000)
    _int("row_limit", row_limit, 1, 10**6)
    _need_threads(n_threads)
    kind = capabilities(config.device).kind
    dev = torch_device(kind)
    n_threads = n_threads if n_threads is not None else (config.threads or bench_threads(kind))
    with intra_op_threads(n_threads), matmul_precision(kind, config.precision):
        model, opt, x, y = _build(config, dev)
        for _ in range(warmup):
            _train_step(model, opt, x, y, config, kind)
        wall_s = _step_wall_s(model, opt, x, y, config, kind, dev)
        synchronize(dev)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if kind == "cuda" else [])
        prof, heard = profile(activities=activities), []
        with _quiet_fd2(heard):
            prof.start()
        try:
            _train_step(model, opt, x, y, config, kind, labelled=True)
            synchronize(dev)
        finally:
            with _quiet_fd2(heard):
                prof.stop()
        if trace is not None:
            _export_trace(prof, trace)
        rows, phases, text = read_profile(prof, kind, row_limit)
    del model, opt
    return ProfileTable(rows=rows, phases=phases, device=kind, text=text,
                        time_source="device (kernel) time" if kind == "cuda" else "CPU time of the calling thread",
                        trace_path=str(trace) if trace is not None else None,
                        threads=n_threads, config=config.to_dict(), wall_s=wall_s)


def profile_sentence(table: ProfileTable, other: ProfileTable | None = None, other_label: str = "tiny") -> str:
    """What the profiled step's shares say, on the basis they were taken: on a CPU the calling thread's
    time (with the work outside any operation), on a GPU the step's wall time (with the GPU's idle share:
    the gaps between kernels, invisible in kernel time)."""
    def pct(t, kind):
        return f"{100 * t.share(kind):.0f}%"

    def outside(t):
        if t.on_wall_time():
            return f"the GPU idle between kernels (Python, autograd and launches on the CPU) {pct(t, 'idle')}"
        if t.device == "cuda":
            return "the gaps between kernels: not measured (kernel time only)"
        return f"work outside any operation (Python, autograd) {pct(t, 'range')}"

    text = (f"Matmuls took **{pct(table, 'matmul')}** {table.basis_words()}, attention kernels "
            f"{pct(table, 'attention')}, element-wise ops, norms, softmax, copies and reductions (`other`) "
            f"**{pct(table, 'other')}** in {table.calls('other'):,} calls against {table.calls('matmul'):,} matmul "
            f"calls, and {outside(table)} ({table.time_source}).")
    if other is not None:
        text += f" In `{other_label}`: `other` {pct(other, 'other')}, {outside(other)}."
    return text


def compile_room(table: ProfileTable | None) -> str:
    """What ``torch.compile`` can shorten in a profiled step, on that profile's own basis (empty without one)."""
    if table is None:
        return ""
    other = f"{100 * table.share('other'):.0f}% {table.basis_words()}"
    if table.on_wall_time():
        gaps = (f"the time the GPU sat idle between kernels ({100 * table.share('idle'):.0f}%: fewer, fused kernels "
                "mean fewer launches)")
    elif table.device == "cuda":
        gaps = "the gaps between kernels (not in this profile's kernel time)"
    else:
        gaps = f"the Python between operations ({100 * table.share('range'):.0f}%)"
    return (f" What compile can shorten is the element-wise work ({other} in this model's profile above) and {gaps}; "
            "the matmuls stay with the vendor library.")


# ---- MFU against a knob ------------------------------------------------------------------------------


def _sweep_configs(base, field_name: str, values, steps: int, repeats: int, n_threads) -> dict:
    """Every value's Config, built (and so validated) before the first run: {value: Config}."""
    _need_config("base", base)
    fields = tuple(f for f in base.to_dict() if f not in ("steps", "threads"))  # those two the sweep sets itself
    _choice("field_name", field_name, fields)
    _int("steps", steps, 1, 10**6)
    _int("repeats", repeats, 1, 1000)
    _need_threads(n_threads)
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ConfigError("values", values, f"a list of {field_name} values")
    values = list(values)
    if not values or len(set(map(repr, values))) != len(values):
        raise ConfigError("values", values, f"one or more {field_name} values, each once")
    return {v: base.replace(**{field_name: v, "steps": steps, "threads": n_threads}) for v in values}


def mfu_sweep(base: Config, field_name: str, values, steps: int = 4, n_threads: int | None = None,
              run_fn=None, repeats: int = 1, progress: bool = False) -> list:
    """Short runs at each value of ``field_name`` (e.g. micro_batch or d_model), all else equal: ``repeats``
    rounds, the order reversed every other round (a drift in the machine's load then hits every value
    alike). On a CPU every run uses the same thread count (one on a busy machine), so the knob is the only
    thing that moves. One row per value: medians over the rounds (MFU, tokens/s, step time), MFU's lowest
    and highest run, the model FLOPs per token, the other programs' load during its runs, and each token's
    time split into data wait, compute (forward + backward) and optimizer -- the optimizer's cost is per
    update, so a knob that puts more tokens into an update also spreads it thinner. Every argument is
    checked, and every value's Config built, before the first run."""
    run_fn = run_fn or run
    kind = capabilities(base.device).kind if isinstance(base, Config) else None
    if kind == "cpu" and n_threads is None:
        n_threads = base.threads or bench_threads(kind)
    configs = _sweep_configs(base, field_name, values, steps, repeats, n_threads if kind == "cpu" else None)
    values = list(configs)
    by_value = {v: [] for v in values}
    total = repeats * len(values)
    with Progress(total, f"{field_name.replace('_', '-')} sweep", delay=1.0 if progress else math.inf) as bar:
        for i in range(repeats):
            for v in (values if i % 2 == 0 else values[::-1]):
                meter = LoadMeter()  # other programs' CPU while this run ran: the likeliest reason two runs differ
                summary = run_fn(configs[v]).summary
                by_value[v].append((configs[v].tokens_per_update, summary, meter.read().get("other_cores")))
                bar.update(sum(len(r) for r in by_value.values()), note=f"{field_name} {v}")
    return [_sweep_row(field_name, v, runs, n_threads, steps) for v, runs in by_value.items()]


def _sweep_row(field_name: str, value, runs: list, n_threads, steps: int | None = None) -> dict:
    """One value's runs ([(tokens per update, summary, other programs' cores), ...]) as medians, with the
    per-token split."""
    tokens = runs[0][0]
    summaries = [r[1] for r in runs]
    loads = [r[2] for r in runs if len(r) > 2 and r[2] is not None]

    def med(key):
        return _median([s[key] for s in summaries if s.get(key) is not None])

    mfus = [s["mfu"] for s in summaries if s.get("mfu") is not None]
    split = {f"{k[:-2]}_us_per_token": (None if med(k) is None else 1e6 * med(k) / tokens)
             for k in ("data_wait_s", "compute_s", "optimizer_s")}
    opt_frac = _median([s["optimizer_s"] / s["step_time_s"] for s in summaries
                        if s.get("optimizer_s") is not None and s.get("step_time_s")])
    return {field_name: value, "field": field_name, "value": value, "runs": len(summaries), "mfu": med("mfu"),
            "mfu_low": min(mfus) if mfus else None, "mfu_high": max(mfus) if mfus else None,
            "tokens_per_s": med("tokens_per_s"), "step_time_s": med("step_time_s"), "tokens_per_update": tokens,
            "flops_per_token": summaries[0]["model_flops_per_step"] / tokens, "n_params": summaries[0]["n_params"],
            "optimizer_frac": opt_frac, "threads": n_threads, "steps": steps, "other_cores": _median(loads),
            **split}


def _rows_at(rows: list, value):
    return next((r for r in rows if r["value"] == value), None)


def sweep_sentence(rows: list) -> str:
    """What a micro-batch sweep's per-token split says, from its smallest to its largest value: how much of
    the time saved per token came from compute (bigger matmuls, fewer operations per token) and how much
    from the optimizer (the same per-update step spread over more tokens). Chosen by the numbers."""
    first, last = rows[0], rows[-1]
    c0, c1 = first.get("compute_us_per_token"), last.get("compute_us_per_token")
    o0, o1 = first.get("optimizer_us_per_token"), last.get("optimizer_us_per_token")
    if None in (c0, c1, o0, o1):
        return ""
    f, a, b = first["field"].replace("_", "-"), first["value"], last["value"]
    head = (f"Per token, compute (forward + backward) went from {c0:,.0f} µs at {f} {a} to {c1:,.0f} µs at {b}, "
            f"and the optimizer from {o0:,.0f} to {o1:,.0f} µs")
    opt_words = (f"The optimizer steps once per update whatever the {f}, so with `accum` = 1 a larger {f} spreads "
                 f"the same step over more tokens: at {f} {a} it took {100 * (first['optimizer_frac'] or 0):.0f}% of "
                 f"each update, at {b}, {100 * (last['optimizer_frac'] or 0):.0f}%.")
    saved_c, saved_o = c0 - c1, o0 - o1
    saved = saved_c + saved_o
    if saved <= 0:
        return f"{head}: the larger {f} saved no time per token here. {opt_words}"
    if saved_c <= 0:
        return (f"{head}: all of the time saved per token came from the optimizer; compute per token did not fall. "
                f"{opt_words}")
    return (f"{head}: of the {saved:,.0f} µs saved per token, **{100 * saved_c / saved:.0f}%** came from compute "
            f"(bigger matmuls, fewer operations per token) and **{100 * saved_o / saved:.0f}%** from the optimizer. "
            f"{opt_words} Hold the tokens per update fixed with `accum` to see the matmuls alone.")


def same_config_sentence(summary: dict, load: dict | None, rows: list, value) -> str:
    """The baseline run against the sweep's point at the same configuration (``value`` of the swept field):
    two measurements of one configuration, each with its thread count, runs, timed updates and the other
    programs' load, and whether the baseline falls within the sweep's own run-to-run range. Chosen by the
    numbers; empty when the sweep lacks the value or a number is missing."""
    row = _rows_at(rows, value)
    if row is None or summary.get("mfu") is None or row.get("mfu") is None:
        return ""
    f = row["field"].replace("_", "-")
    b, m = 100 * summary["mfu"], 100 * row["mfu"]
    lo, hi = _pct(row, "mfu_low"), _pct(row, "mfu_high")
    t_base, t_sweep = summary.get("intra_op_threads"), row.get("threads")
    threads = (f"both with {_n(t_base, 'intra-op thread')}" if t_base == t_sweep else
               f"with {_n(t_base, 'intra-op thread')} against the sweep's {t_sweep}: the thread counts differ")
    runs, timed = row.get("runs", 1), summary.get("timed_updates")
    text = (f"The sweep's {f} {value} point is the baseline's configuration: MFU **{m:.1f}%** there (median of "
            f"{_n(runs, 'run')} of {_n(row.get('steps'), 'update')}, runs from {lo:.1f} to {hi:.1f}%), against "
            f"**{b:.1f}%** in the single baseline run above ({_n(timed, 'timed update')}), {threads}.")
    if lo <= b <= hi:
        return text + (" The baseline lies within the sweep's own run-to-run range: one measurement, scattered — "
                       "a single short run on this machine is no more precise than that.")
    side = "below" if b < lo else "above"
    text += f" The baseline lies {side} every run of the sweep's."
    lb, ls = (load or {}).get("other_cores"), row.get("other_cores")
    if lb is None or ls is None:
        return text + " This device reports no load to say why."
    text += f" Other programs used {lb:.1f} cores on average during the baseline and {ls:.1f} during this point's runs"
    if abs(lb - ls) >= 0.3:
        return text + ": the load changed between the two cells, and with it the number — not the configuration."
    if side == "below":
        return text + (", alike: the load does not explain it. A baseline below every later run fits a first "
                       "training in the kernel still paying first-call costs after the engine's one left-out update; "
                       "rerun the baseline cell to see whether the gap stays.")
    return text + (f", alike: the load does not explain it either. {_n(runs, 'run')} of "
                   f"{_n(row.get('steps'), 'update')} and a baseline of {_n(timed, 'timed update')} scatter more than "
                   "this range shows: rerun both cells (outside CI mode: more runs) for a steadier pair.")


def _n(count, word: str) -> str:
    """'1 run', '3 runs', '? runs' (a count that is missing)."""
    if count is None:
        return f"? {word}s"
    return counted(count, word)


# ---- shapes: a padded vocabulary ------------------------------------------------------------------------


def head_step(vocab: int, tokens: int, d_model: int, device=None, dtype=torch.float32, seed: int = 0):
    """A function that runs one training step of an LM head alone: logits = x·Wᵀ, cross-entropy, backward.
    The vocabulary size is the matmul's N dimension, and the softmax's width."""
    _int("vocab", vocab, 2, 10**7)
    _int("tokens", tokens, 1, 10**7)
    _int("d_model", d_model, 1, 65536)
    dev = device or torch_device()
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, d_model, generator=g) * 0.02).to(dev, dtype).requires_grad_()
    w = (torch.randn(vocab, d_model, generator=g) * 0.02).to(dev, dtype).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), generator=g).to(dev)

    def step():
        loss = F.cross_entropy((x @ w.t()).float(), y)
        loss.backward()
        x.grad = w.grad = None

    return step


def compare_head_shapes(vocab_a: int, vocab_b: int, tokens: int, d_model: int, repeats: int = 15,
                        budget_s: float = 10.0, dtype=torch.float32, n_threads: int | None = None):
    """Interleaved head steps at two vocabulary sizes; the course's bootstrap verdict on their times
    (metric step_time_s: one 'update' here is one step of the head alone)."""
    for name, v in (("vocab_a", vocab_a), ("vocab_b", vocab_b)):
        _int(name, v, 2, 10**7)
    _int("tokens", tokens, 1, 10**7)
    _int("d_model", d_model, 1, 65536)
    _int("repeats", repeats, 1, 10**6)
    _need_budget(budget_s)
    _need_threads(n_threads)
    dev = torch_device()
    with intra_op_threads(n_threads if n_threads is not None else bench_threads(dev.type)):
        fns = {"a": head_step(vocab_a, tokens, d_model, dev, dtype),
               "b": head_step(vocab_b, tokens, d_model, dev, dtype)}
        t = interleaved(fns, repeats=repeats, warmup=2, budget_s=budget_s, device=dev)
    return verdict(t["a"], t["b"], "step_time_s", label_a=f"vocabulary {vocab_a:,}", label_b=f"vocabulary {vocab_b:,}")


def padding_sentence(cmp, extra_flops_pct: float = 0.09) -> str:
    """What the padded-vocabulary comparison ``cmp`` (a = unpadded, b = padded, step_time_s) means, in words
    that agree with its own sentence: a difference is called one when the interval excludes 1, even when it
    is below the course's threshold; "no difference could be resolved" only when the interval includes 1."""
    tail = " GPUs' tensor-core kernels are where the padding is known to pay."
    if cmp.ratio is None or not cmp.decided:
        return "Too few repeats for a verdict: raise `repeats` to get one."
    if cmp.better == "b":
        return "The padded head did slightly more work and still finished sooner: its shape suits the matmul kernels."
    if cmp.better == "a":
        return (f"The unpadded head was faster here — by more than its {extra_flops_pct} % fewer FLOPs can explain, so "
                "the shape itself mattered to this device's kernels, the other way round. Padding is a rule for GPU "
                "tensor cores: measure it on the hardware you train on (and look at the repeats: a busy machine can "
                "mislead too).")
    pct, thr = 100 * abs(cmp.ratio - 1), 100 * cmp.threshold
    if cmp.low > 1 or cmp.high < 1:  # resolved, but below the threshold the course counts as an effect
        if cmp.ratio < 1:
            return (f"The padded head was about {pct:.0f} % faster — resolved by the repeats, but below the {thr:.0f} % "
                    "this course counts as an effect: a small gain from its shape on this device." + tail)
        return (f"The padded head was about {pct:.0f} % slower — more than its {extra_flops_pct} % extra FLOPs explain, "
                f"yet below the {thr:.0f} % this course counts as an effect: on this device the ragged edge of 50257 "
                "did not cost time." + tail)
    spread = cmp.spread or 0.0
    if spread > cmp.threshold:
        return (f"No difference could be resolved: the repeats scatter by about ±{100 * spread:.0f}% (interval "
                f"{cmp.low:.2f}–{cmp.high:.2f}), far more than {extra_flops_pct} % extra FLOPs could explain, so they "
                "neither show nor rule out a penalty for the ragged edge of 50257 on this device. Raise `repeats` on "
                "a quieter machine to resolve it." + tail)
    bound = 100 * max(1 - cmp.low, cmp.high - 1)
    return (f"No difference could be resolved: the interval {cmp.low:.2f}–{cmp.high:.2f} includes 1, so whatever the "
            f"ragged edge of 50257 costs on this device, it is within about ±{bound:.0f}% here." + tail)


# ---- what fusion removes, and torch.compile on the engine ------------------------------------------------


def _bias_gelu_residual(x, b, r):
    """Three element-wise ops: eager runs three kernels, each reading and writing the whole tensor."""
    return torch.nn.functional.gelu(x + b) + r


class _CountOps(TorchDispatchMode):
    """Counts the ATen ops a call dispatches (each one a kernel launch and a trip through memory)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _inductor_kernels() -> int | None:
    with contextlib.suppress(Exception):  # a private counter: read it where it exists
        from torch._inductor import metrics  # deferred: torch's compiler, slow to import; private: read where it exists

        return int(metrics.generated_kernel_count)
    return None


def _dynamo_counters() -> dict | None:
    """A copy of Dynamo's and Inductor's event counters ({section: {event: count}}), None where absent."""
    with contextlib.suppress(Exception):  # private counters: read them where they exist
        from torch._dynamo.utils import counters  # deferred: torch's compiler, slow to import; private: read where it exists

        return {sec: dict(c) for sec, c in counters.items()}
    return None


def _counted(before: dict | None, after: dict | None, section: str, key: str) -> int:
    if before is None or after is None:
        return 0
    return after.get(section, {}).get(key, 0) - before.get(section, {}).get(key, 0)


def _cache_state(before: dict | None, after: dict | None) -> dict:
    """What a compile did, from the counters' change: 'cold' (Inductor compiled its graphs: cache misses only),
    'cached' (loaded them from its disk cache: hits only), 'mixed', 'reused' (no graph compiled at all:
    Dynamo reused code it compiled earlier in this process) or None (no counters). The generated-kernel count
    rises on a cache hit too, so only these counters tell a compile from a load."""
    if before is None or after is None:
        return {"cache": None, "cache_hits": None, "cache_misses": None, "frames": None}
    hits = _counted(before, after, "inductor", "fxgraph_cache_hit")
    misses = _counted(before, after, "inductor", "fxgraph_cache_miss")
    bypass = _counted(before, after, "inductor", "fxgraph_cache_bypass")  # cache off or not cacheable: compiled
    frames = _counted(before, after, "frames", "ok")
    if hits and not (misses or bypass):
        state = "cached"
    elif (misses or bypass) and not hits:
        state = "cold"
    elif hits:
        state = "mixed"
    else:
        state = "reused" if frames == 0 else None
    return {"cache": state, "cache_hits": hits, "cache_misses": misses + bypass, "frames": frames}


def _break_reasons(before: dict | None, after: dict | None) -> list:
    """[(reason, count), ...] for the graph breaks Dynamo took between two counter copies, each reason in
    Dynamo's own words (its 'Explanation' line, without file paths), most frequent first."""
    if before is None or after is None:
        return []
    out = {}
    for text, n in after.get("graph_break", {}).items():
        n -= before.get("graph_break", {}).get(text, 0)
        if n <= 0:
            continue
        lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
        expl = next((ln[len("Explanation:"):].strip() for ln in lines if ln.startswith("Explanation:")), lines[0])
        expl = re.sub(r" in file `[^`]*`", "", expl).rstrip(". ")[:200]
        out[expl] = out.get(expl, 0) + n
    return sorted(out.items(), key=lambda kv: -kv[1])


class _DropProfilerNotes:
    """A logging filter for Dynamo's "Profiler record function ... will be ignored": DDP's forward opens a
    profiler range, which Dynamo leaves out of the compiled graph -- harmless, and not this chapter's topic."""

    def filter(self, record) -> bool:
        return not str(record.msg).startswith("Profiler ")


@contextlib.contextmanager
def _quiet_dynamo():
    loggers = [logging.getLogger(n) for n in ("torch._dynamo.variables.ctx_manager", "torch._dynamo.variables.torch")]
    note = _DropProfilerNotes()
    for lg in loggers:
        lg.addFilter(note)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(note)


@contextlib.contextmanager
def _empty_compile_cache():
    """An empty Inductor cache for what runs inside (a cold compile, as on a first run on a new machine), with
    the code Dynamo compiled earlier in this process dropped too (it would be reused otherwise). The cache
    lives in one folder under the temp dir, emptied at the next cold compile (loaded kernels stay usable)."""
    import torch._inductor.utils as ind_utils  # deferred: torch's compiler, slow to import; private: read where it exists

    fresh = getattr(ind_utils, "fresh_cache", None) or getattr(ind_utils, "fresh_inductor_cache", None)
    if fresh is None:
        raise RuntimeError(f"torch {torch.__version__} has no fresh_cache(): cannot empty Inductor's cache")
    # A private per-user folder: a fixed shared name in /tmp could be planted by another user, and it is emptied
    root = paths.private_dir("cold-compile")
    for child in root.iterdir():
        shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    torch._dynamo.reset()
    with fresh(dir=str(root), delete=False):
        yield


def fusion_demo(rows: int = 2048, cols: int = 1024, repeats: int = 15, budget_s: float = 8.0,
                n_threads: int | None = None) -> dict:
    """Compile ``gelu(x + b) + r`` and compare: ATen ops eager runs, kernels Inductor has for it (and whether
    it compiled them or loaded them from its cache), compile time (the first call) and interleaved
    eager/compiled times with their verdict."""
    _int("rows", rows, 1, 1 << 20)
    _int("cols", cols, 1, 1 << 20)
    _int("repeats", repeats, 1, 10**6)
    _need_budget(budget_s)
    _need_threads(n_threads)
    dev = torch_device()
    ok, why = compile_ready(dev.type)
    if not ok:
        return {"ok": False, "reason": why}
    with intra_op_threads(n_threads if n_threads is not None else bench_threads(dev.type)):
        g = torch.Generator().manual_seed(0)
        x, r = (torch.randn(rows, cols, generator=g).to(dev) for _ in range(2))
        b = torch.randn(cols, generator=g).to(dev)
        counter = _CountOps()
        with counter:
            _bias_gelu_residual(x, b, r)
        compiled = torch.compile(_bias_gelu_residual)
        k0, c0 = _inductor_kernels(), _dynamo_counters()
        t0 = time.perf_counter()
        with _quiet_dynamo():
            compiled(x, b, r)
        synchronize(dev)
        compile_s = time.perf_counter() - t0
        k1, c1 = _inductor_kernels(), _dynamo_counters()
        same = torch.allclose(compiled(x, b, r), _bias_gelu_residual(x, b, r), atol=1e-5, rtol=1e-4)
        t = interleaved({"eager": lambda: _bias_gelu_residual(x, b, r), "compiled": lambda: compiled(x, b, r)},
                        repeats=repeats, warmup=2, budget_s=budget_s, device=dev)
    cmp = verdict(t["eager"], t["compiled"], "step_time_s", label_a="eager", label_b="compiled")
    mib = x.numel() * x.element_size() / 2**20
    # 0 new kernels: this process compiled the same function before (Dynamo's cache), so nothing was generated
    return {"ok": True, "reason": why, "eager_ops": counter.names, "kernels": None if k0 is None else k1 - k0,
            "compile_s": compile_s, "same_result": bool(same), "comparison": cmp, "tensor_mib": mib,
            "eager_s": _median(t["eager"]), "compiled_s": _median(t["compiled"]), **_cache_state(c0, c1)}


def compile_run(config: Config, run_fn=None, cold: bool = False) -> dict:
    """The engine's ``compile=True`` knob, with compile time kept apart: the first update pays for tracing
    and code generation (warm-up, left out of the run's step time); compile_s = first update minus the
    median of the others. ``cold``: start from an empty Inductor cache (what a first run on a new machine
    pays); otherwise whatever the cache holds is used. Also: whether Inductor compiled its graphs or loaded
    them from the cache (``cache``: 'cold', 'cached', 'mixed', 'reused'), the kernels its code has, and the
    graph breaks Dynamo took with Dynamo's reasons."""
    _need_config("config", config)
    run_fn = run_fn or run
    cfg = config.replace(compile=True, warmup=max(1, config.warmup))
    with _empty_compile_cache() if cold else contextlib.nullcontext(), _quiet_dynamo():
        k0, c0 = _inductor_kernels(), _dynamo_counters()
        res = run_fn(cfg)
        k1, c1 = _inductor_kernels(), _dynamo_counters()
    recs = res.records
    first = recs[0]["step_time_s"] if recs else None
    steady = _median([r["step_time_s"] for r in recs[1:]])
    reasons = _break_reasons(c0, c1)
    return {"result": res, "first_update_s": first, "steady_step_s": steady,
            "compile_s": max(0.0, first - steady) if first is not None and steady is not None else None,
            "kernels": None if k0 is None or k1 is None else k1 - k0,
            "graph_breaks": None if c1 is None else sum(n for _, n in reasons), "break_reasons": reasons,
            "cold": cold, **_cache_state(c0, c1)}


def compile_sentence(c: dict) -> str:
    """What ``compile_run`` measured, in words chosen by its counters: a compile is called a compile only
    when Inductor compiled (cache misses); a load from the disk cache, or code Dynamo reused, is named so."""
    first, steady, comp = c.get("first_update_s"), c.get("steady_step_s"), c.get("compile_s")
    if first is None or steady is None:
        return "The run recorded no updates: nothing to report."
    k = c.get("kernels")
    kernels_words = "" if k is None else f", {k} kernels"
    what = {
        "cold": (f"Dynamo traced the step and Inductor compiled it from {'an empty' if c.get('cold') else 'its'} "
                 f"cache ({c.get('cache_misses')} graph(s) compiled{kernels_words})"),
        "cached": (f"Dynamo traced the step and Inductor **loaded its {c.get('cache_hits')} compiled graph(s) from "
                   f"its disk cache** (nothing compiled{kernels_words.replace(', ', '; its code has ')}): a cold "
                   "compile, from an empty cache, takes longer"),
        "mixed": (f"Inductor compiled {c.get('cache_misses')} graph(s) and loaded {c.get('cache_hits')} from its "
                  f"disk cache{kernels_words.replace(', ', '; ')}"),
        "reused": ("Dynamo reused the code it compiled earlier in this process: nothing was traced or compiled, "
                   "so this is not a compile time"),
    }.get(c.get("cache"), "whether Inductor compiled or loaded from its cache is unknown (no counters here)")
    text = (f"First update **{first:.1f} s** — {what}. Then {1e3 * steady:.1f} ms per update; the first update "
            f"minus a steady one, kept apart: **{comp:.1f} s**.")
    n = c.get("graph_breaks")
    if c.get("cache") == "reused" or n is None:
        return text
    if n == 0:
        return text + " Dynamo took no graph breaks: the step compiled as whole graphs."
    reasons = "; ".join(f"{m}× {why}" for why, m in c.get("break_reasons") or [])
    return (text + f" Dynamo took **{n} graph break(s)** (each splits the step into separately compiled pieces, "
            f"with Python running between them). Dynamo's reasons: {reasons}.")


def breakeven_sentence(compiled: dict, cmp, breakeven) -> str:
    """The compile's payback with this chapter's own numbers: ``breakeven(compile_s, eager_s, compiled_s)``
    (the learner's function) on the compile ``compile_run`` measured and the step-time medians of the eager
    against compiled comparison ``cmp``. Says whether the compile was cold or a cache load, and claims no
    payback where the comparison measured no speed-up."""
    eager_s, compiled_s = (_median([r.summary["step_time_s"] for r in rs]) for rs in (cmp.results_a, cmp.results_b))
    if eager_s is None or compiled_s is None or compiled.get("compile_s") is None:
        return "No step times to work with: nothing to pay back."
    n = breakeven(compiled["compile_s"], eager_s, compiled_s)
    how = {"cold": "compiled from an empty cache, as a first run pays",
           "cached": "only a load from Inductor's disk cache: a cold compile costs more and pays back later",
           "mixed": "partly loaded from Inductor's disk cache: a cold compile costs more",
           "reused": "no compile at all — Dynamo reused this session's code — so this is no breakeven"}.get(
        compiled.get("cache"), "whether it compiled or loaded from the cache is unknown")
    finite = isinstance(n, (int, float)) and not isinstance(n, bool) and n == n and abs(n) != float("inf")
    when = f"it pays back after **{n:,.0f}** updates" if finite else "it **never** pays back"
    if cmp.better != "b":  # the formula on medians is no evidence of a speed-up the comparison did not find
        when = ("the comparison above measured no speed-up, so on this evidence it does not pay back (the medians "
                f"alone would say: {when.replace('**', '')})")
    return (f"Here: compile {compiled['compile_s']:.1f} s ({how}); eager {1e3 * eager_s:.2f} ms, compiled "
            f"{1e3 * compiled_s:.2f} ms per update (medians of the comparison above) → {when}.")


# ---- fused and foreach AdamW ----------------------------------------------------------------------------

ADAMW_IMPLS = {"for-loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}


def fused_supported(kind: str | None = None) -> tuple:
    """(ok, reason): whether ``AdamW(fused=True)`` steps on this device type (it needs a fused kernel for
    the device: CUDA since torch 2.0, CPU since 2.4, MPS later)."""
    kind = kind or capabilities("auto").kind
    dev = torch_device(kind)
    p = torch.nn.Parameter(torch.zeros(4, device=dev))
    p.grad = torch.ones(4, device=dev)
    try:
        torch.optim.AdamW([p], lr=1e-3, fused=True).step()
    except (RuntimeError, ValueError, NotImplementedError) as e:
        return False, f"AdamW(fused=True) is not supported on {kind} with torch {torch.__version__}: {str(e)[:160]}"
    return True, f"AdamW(fused=True) runs on {kind} with torch {torch.__version__}"


def default_adamw(params) -> str:
    """Which implementation ``torch.optim.AdamW(params)`` picks by itself: foreach for CUDA tensors, the
    for-loop elsewhere (torch's own rule, asked rather than assumed)."""
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach  # deferred: a private torch API, read only where it exists

        fused, foreach = _default_to_fused_or_foreach(list(params), False, False)
    except Exception:  # noqa: BLE001 -- a private helper: fall back to the documented rule
        foreach, fused = all(p.is_cuda for p in params), False
    return "fused" if fused else "foreach" if foreach else "for-loop"


def adamw_impls(kind: str | None = None) -> list:
    """The AdamW implementations to compare on this device: fused only where it is supported."""
    impls = ["for-loop", "foreach"]
    if fused_supported(kind)[0]:
        impls.append("fused")
    return impls


def optimizer_steps(config: Config, impls=None, repeats: int = 10, budget_s: float = 10.0,
                    n_threads: int | None = None) -> dict:
    """Seconds per ``optimizer.step()`` of AdamW over ``config``'s model parameters, for each
    implementation, interleaved. Each implementation gets its own copy of the weights (its own state)
    and the same random gradients. Returns {"times": {impl: [s, ...]}, "default": impl, "n_params": N}."""
    _need_config("config", config)
    for impl in impls or ():
        _choice("impls", impl, tuple(ADAMW_IMPLS))
    _int("repeats", repeats, 1, 10**6)
    _need_budget(budget_s)
    _need_threads(n_threads)
    kind = capabilities(config.device).kind
    dev = torch_device(kind)
    impls = list(impls or adamw_impls(kind))
    opts = {}
    with intra_op_threads(n_threads if n_threads is not None else (config.threads or bench_threads(kind))):
        for impl in impls:
            torch.manual_seed(config.seed)
            model = GPT(config.spec).to(dev)
            g = torch.Generator().manual_seed(1)
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=g).to(dev)
            opts[impl] = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01, **ADAMW_IMPLS[impl])
        default = default_adamw(list(next(iter(opts.values())).param_groups[0]["params"]))
        times = interleaved({k: o.step for k, o in opts.items()}, repeats=repeats, warmup=1, budget_s=budget_s,
                            device=dev)
    n = sum(p.numel() for p in next(iter(opts.values())).param_groups[0]["params"])
    return {"times": times, "default": default, "n_params": n}


# ---- TF32 ------------------------------------------------------------------------------------------------


def tf32_matmul(n: int = 4096, reps: int = 10) -> dict:
    """On CUDA: an n×n matmul's FLOP/s in fp32 (TF32 off), TF32 and bf16, and each one's relative error
    against an fp64 product of the same inputs. Raises RuntimeError elsewhere (TF32 is a tensor-core mode)."""
    _int("n", n, 1, 1 << 16)
    _int("reps", reps, 1, 10**6)
    kind = capabilities("auto").kind
    if kind != "cuda":
        raise RuntimeError(f"TF32 needs NVIDIA tensor cores (Ampere or newer); this device is {kind}")
    dev = torch_device(kind)
    g = torch.Generator().manual_seed(0)
    a64, b64 = (torch.randn(n, n, generator=g, dtype=torch.float64) for _ in range(2))
    ref = (a64 @ b64).to(dev)
    a, b = a64.float().to(dev), b64.float().to(dev)
    out = {}
    for name, prec in (("fp32", "fp32"), ("tf32", "tf32"), ("bf16", "fp32")):
        x, y = (a.bfloat16(), b.bfloat16()) if name == "bf16" else (a, b)
        with matmul_precision(kind, prec):
            c = x @ y
            t = interleaved({name: lambda: x @ y}, repeats=reps, warmup=2, device=dev)[name]
        err = float((c.double() - ref).norm() / ref.norm())
        out[name] = {"tflops": 2 * n**3 / _median(t) / 1e12, "rel_error": err, "seconds": _median(t)}
    return {"n": n, **out}


# ---- attention backends ------------------------------------------------------------------------------------


def sdpa_backends(kind: str | None = None) -> list:
    """Backend names of torch's scaled_dot_product_attention to try on this device: math everywhere,
    flash (CPU and CUDA), efficient and cudnn on CUDA only."""
    kind = kind or capabilities("auto").kind
    if kind == "cuda":
        return ["math", "flash", "efficient", "cudnn"]
    if kind == "cpu":
        return ["math", "flash"]
    return ["math"]


def _backend(name: str):
    return sdpa_kernel([{"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
                         "efficient": SDPBackend.EFFICIENT_ATTENTION,
                         "cudnn": SDPBackend.CUDNN_ATTENTION}[name]])


class _Attention(torch.nn.Module):
    """Causal SDPA and a sum as the loss (a sum keeps nothing for backward): what the tracer sees is the
    attention kernel's own memory."""

    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).float().sum()


def _attention_bytes(q, k, v, backend: str) -> tuple:
    """(bytes kept for backward, peak bytes held during forward + backward) of one attention call.
    CUDA: from the allocator (memory_allocated / max_memory_allocated); elsewhere counted storage by
    storage with labkit's dispatch tracer (memtrace)."""
    mod = _Attention()
    if q.is_cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with _backend(backend):
            loss = mod(q, k, v)
            kept = torch.cuda.memory_allocated() - base
            loss.backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del loss
        q.grad = k.grad = v.grad = None
        return kept, peak

    tracer = Tracer(mod)
    with _backend(backend), tracer:
        loss = mod(q, k, v)
        tracer.end_forward()
        loss.backward()
        del loss
        trace = tracer.finish(mod)
    q.grad = k.grad = v.grad = None
    return trace.kept_bytes(), trace.peak_bytes()


def math_saved_dtype(dtype) -> torch.dtype:
    """The dtype of the T×T probabilities the math SDPA backend keeps for backward, asked of torch at run
    time: fp16/bf16 inputs are upcast to fp32 (torch 2.13) unless
    ``torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)`` was set -- then they stay 16-bit."""
    if dtype not in (torch.float16, torch.bfloat16):
        return dtype
    allowed = getattr(torch.backends.cuda, "fp16_bf16_reduction_math_sdp_allowed", None)
    return dtype if allowed is not None and allowed() else torch.float32


def _check_attention_args(seq_lens, backends, batch, n_head, head_dim, dtype, repeats, n_threads) -> tuple:
    seq_lens = _need_ints("seq_lens", seq_lens, 1, 65536)
    if backends is not None:
        backends = list(backends) if not isinstance(backends, str) else [backends]
        for be in backends:
            _choice("backends", be, ("math", "flash", "efficient", "cudnn"))
    for name, v, hi in (("batch", batch, 65536), ("n_head", n_head, 4096), ("head_dim", head_dim, 4096)):
        _int(name, v, 1, hi)
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ConfigError("dtype", dtype, "None or a floating-point torch dtype, e.g. torch.bfloat16")
    _int("repeats", repeats, 1, 10**6)
    _need_threads(n_threads)
    return seq_lens, backends


def attention_sweep(seq_lens, backends=None, batch: int = 1, n_head: int = 4, head_dim: int = 64,
                    dtype=None, repeats: int = 5, n_threads: int | None = None) -> list:
    """Forward + backward of causal attention at each sequence length with each SDPA backend: median
    seconds (interleaved across backends), bytes kept for backward and the peak. A backend the device
    cannot run at that shape gives a row with ``error`` set, never a number. ``scores_bytes``: the T×T
    probabilities the math backend keeps, in the dtype it saves them in (``math_saved_dtype``)."""
    seq_lens, backends = _check_attention_args(seq_lens, backends, batch, n_head, head_dim, dtype, repeats, n_threads)
    dev = torch_device()
    backends = list(backends or sdpa_backends(dev.type))
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    saved = math_saved_dtype(dtype)  # asked once per sweep: a flag set later in the kernel is a new sweep's business
    saved_size = torch.empty((), dtype=saved).element_size()
    rows = []
    with intra_op_threads(n_threads if n_threads is not None else bench_threads(dev.type)):
        for T in seq_lens:
            g = torch.Generator().manual_seed(T)
            q, k, v = (torch.randn(batch, n_head, T, head_dim, generator=g).to(dev, dtype).requires_grad_()
                       for _ in range(3))
            fns, mem, errors = {}, {}, {}
            for be in backends:
                try:
                    mem[be] = _attention_bytes(q, k, v, be)
                except RuntimeError as e:  # "No available kernel": this backend cannot serve this case
                    errors[be] = str(e).splitlines()[0][:200]
                    continue

                def fn(be=be):
                    with _backend(be):
                        _Attention()(q, k, v).backward()
                    q.grad = k.grad = v.grad = None

                fns[be] = fn
            times = interleaved(fns, repeats=repeats, warmup=1, device=dev) if fns else {}
            for be in backends:
                row = {"seq_len": T, "backend": be, "batch": batch, "n_head": n_head, "head_dim": head_dim,
                       "dtype": str(dtype).replace("torch.", ""), "scores_dtype": str(saved).replace("torch.", "")}
                if be in errors:
                    row["error"] = errors[be]
                else:
                    row.update(time_s=_median(times[be]), samples=times[be], kept_bytes=mem[be][0],
                               peak_bytes=mem[be][1], scores_bytes=batch * n_head * T * T * saved_size)
                rows.append(row)
    return rows


def attention_verdict(rows, a: str = "math", b: str = "flash"):
    """The course's verdict on backend ``b`` against ``a`` at the longest sequence both ran."""
    ok = {(r["seq_len"], r["backend"]): r for r in rows if "error" not in r}
    common = [T for T in sorted({r["seq_len"] for r in rows}) if (T, a) in ok and (T, b) in ok]
    if not common:
        return None
    T = common[-1]
    return verdict(ok[(T, a)]["samples"], ok[(T, b)]["samples"], "step_time_s",
                   label_a=f"{a} (T={T})", label_b=f"{b} (T={T})")


# ---- pictures (matplotlib Figures, no pyplot) -------------------------------------------------------------


# Font sizes in points. Figures are drawn at 80 dpi and shown at their own width (720 px for 9 inches, inside
# JupyterLab's ~800-900 px output), so 9.5 pt is about 10.5 px on screen: the course's smallest readable text.
FS_SMALL, FS_LABEL, FS_TITLE = 9.5, 10, 11
DPI = 80


def _figure(width: float, height: float):
    """A matplotlib Figure with its own Agg canvas (no pyplot) that shows itself as a PNG in a notebook."""
    # deferred: matplotlib is heavy
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # deferred: matplotlib is optional; loaded only to draw
    from matplotlib.figure import Figure  # deferred: matplotlib is optional; loaded only to draw

    class PngFigure(Figure):
        def _repr_png_(self):
            buf = io.BytesIO()
            self.savefig(buf, format="png")
            return buf.getvalue()

    fig = PngFigure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def plain(x: float, digits: int = 2) -> str:
    """A number with ``digits`` significant digits and no e-notation (0.00012, not 1.2e-04): how this
    chapter shows relative errors to a learner -- the course's one format (labkit.numfmt)."""
    return number(x, digits)


def log_ticks(lo: float, hi: float, most: int = 7) -> list:
    """Ticks for a log axis from ``lo`` to ``hi``: the densest of 1…9, 1-2-5, 1-3 and 1 per decade that
    gives at most ``most`` ticks -- so a range inside one decade still gets several labels, a wide one no
    crowd."""
    if not (lo > 0 and hi > lo):
        return []
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    ticks = []
    for mantissas in (tuple(range(1, 10)), (1, 2, 5), (1, 3), (1,)):
        ticks = [m * 10.0**e for e in decades for m in mantissas if lo <= m * 10.0**e <= hi]
        if len(ticks) <= most:
            return ticks
    return ticks


def _log_y(ax, values) -> None:
    """A log y axis that shows its values with readable plain-number ticks (not only 10⁰ and 10¹)."""
    vals = [v for v in values if v and v > 0]
    ax.set_yscale("log")
    if not vals:
        return
    lo, hi = min(vals) / 1.25, max(vals) * 1.25  # a margin, so the end points do not sit on the frame
    ax.set_ylim(lo, hi)
    ticks = log_ticks(lo, hi)
    if len(ticks) < 2:  # a range narrower than 1-2-3: label its two ends (two significant digits)
        ticks = [float(f"{v:.2g}") for v in (lo * 1.1, hi / 1.1)]
    ax.set_yticks(ticks, [number(t, 6) for t in ticks])
    ax.yaxis.set_minor_formatter(_null_formatter())


def _pct(row: dict, key: str) -> float:
    """A row's MFU figure in percent (its median where the lowest/highest run is missing)."""
    v = row.get(key)
    return 100 * (v if v is not None else (row.get("mfu") or 0.0))


def plot_sweeps(sweeps: dict, width: float = 9.0, height: float = 4.6):
    """One column per sweep ({title: rows from mfu_sweep}). Top: MFU (median, whiskers from the lowest to the
    highest run; left axis) and model FLOPs per token (right axis, dashed) against the knob's value. Bottom:
    where each token's time went -- compute (forward + backward), optimizer, data wait (medians)."""
    fig = _figure(width, height)
    axes = fig.subplots(2, len(sweeps), squeeze=False)
    parts = (("compute", "compute", "#4c72b0"), ("optimizer", "optimizer", "#dd8452"),
             ("data_wait", "data wait", "#c44e52"))
    for col, (title, rows) in enumerate(sweeps.items()):
        ax, bx = axes[0][col], axes[1][col]
        xs = [r["value"] for r in rows]
        mfu = [_pct(r, "mfu") for r in rows]
        low = [m - _pct(r, "mfu_low") for m, r in zip(mfu, rows)]    # single runs: no whisker
        high = [_pct(r, "mfu_high") - m for m, r in zip(mfu, rows)]
        ax.errorbar(xs, mfu, yerr=[low, high], fmt="o-", color="#4c72b0", ecolor="#555555", capsize=3, label="MFU")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_ylabel("MFU (%)", fontsize=FS_LABEL, color="#4c72b0")
        ax.set_ylim(bottom=0)
        ax2 = ax.twinx()
        ax2.plot(xs, [r["flops_per_token"] / 1e6 for r in rows], "s--", color="#999999", label="FLOPs per token")
        ax2.set_ylabel("model MFLOP per token", fontsize=FS_LABEL, color="#777777")
        ax2.set_ylim(bottom=0)
        runs = rows[0].get("runs", 1) if rows else 1
        ax.set_title(f"{title} (median of {counted(runs, 'run')})", fontsize=FS_TITLE)
        ax2.tick_params(labelsize=FS_SMALL)
        pos = list(range(len(rows)))
        bottom = [0.0] * len(rows)
        for key, words, color in parts:
            vals = [r.get(f"{key}_us_per_token") or 0.0 for r in rows]
            bx.bar(pos, vals, bottom=bottom, color=color, label=words)
            bottom = [b + v for b, v in zip(bottom, vals)]
        bx.set_xticks(pos, [str(x) for x in xs])
        bx.set_xlabel(rows[0]["field"] if rows else "", fontsize=FS_LABEL)
        bx.set_ylabel("µs per token", fontsize=FS_LABEL)
        for a in (ax, bx):
            a.tick_params(labelsize=FS_SMALL)
    # one legend under the figure, not inside a panel: inside, it covers the tallest bar (micro-batch 1's)
    handles, labels = axes[1][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=FS_SMALL, loc="outside lower center", ncols=len(parts),
               title="each token's time (medians)", title_fontsize=FS_SMALL)
    return fig


KIND_COLORS = {"matmul": "#4c72b0", "attention": "#8172b3", "other": "#dd8452", "range": "#bbbbbb",
               "idle": "#e8e8e8"}
KIND_WORDS = {"matmul": "matmuls", "attention": "attention kernels", "other": "element-wise, norms, copies",
              "range": "outside ops (Python, autograd)", "idle": "GPU idle between kernels"}


def plot_shares(tables: dict, width: float = 7.5, height: float = 2.8):
    """One horizontal bar per profiled step ({label: ProfileTable}), split by kind of operation -- and, for a
    GPU step timed apart, the share of its wall time in which the GPU ran no kernel."""
    fig = _figure(width, height)
    ax = fig.add_subplot()
    labels = list(tables)
    kinds = [k for k in KIND_COLORS if any(k in t.kinds() for t in tables.values())]
    for i, name in enumerate(labels):
        left = 0.0
        for kind in kinds:
            share = 100 * tables[name].share(kind) if kind in tables[name].kinds() else 0.0
            ax.barh(i, share, left=left, color=KIND_COLORS[kind], label=KIND_WORDS[kind] if i == 0 else None,
                    edgecolor="#999999" if kind == "idle" else None, linewidth=0.5)
            if share >= 7:
                ax.text(left + share / 2, i, f"{share:.0f}%", ha="center", va="center", fontsize=FS_SMALL,
                        color="#333333" if kind in ("idle", "range") else "white")
            left += share
    ax.set_yticks(range(len(labels)), labels, fontsize=FS_LABEL)
    ax.set_xlim(0, 100)
    bases = {t.basis_words() for t in tables.values()}
    basis = (bases.pop() if len(bases) == 1 else
             "of each step: a CPU bar of its calling thread's time, a GPU bar of its wall time or kernel time")
    ax.set_xlabel(f"% {basis}", fontsize=FS_LABEL)
    ax.tick_params(labelsize=FS_SMALL)
    fig.legend(fontsize=FS_SMALL, loc="outside lower center", ncols=3)
    ax.invert_yaxis()
    return fig


def plot_attention(rows, width: float = 9.0, height: float = 3.4):
    """Time and peak memory of forward + backward against sequence length, one line per backend (log-log,
    labelled with plain numbers)."""
    fig = _figure(width, height)
    a1, a2 = fig.subplots(1, 2)
    colors = {"math": "#c44e52", "flash": "#4c72b0", "efficient": "#55a868", "cudnn": "#8172b3"}
    ys = {a1: [], a2: []}
    for be in dict.fromkeys(r["backend"] for r in rows):
        pts = [r for r in rows if r["backend"] == be and "error" not in r]
        if not pts:
            continue
        xs = [r["seq_len"] for r in pts]
        ms, mib = [1e3 * r["time_s"] for r in pts], [r["peak_bytes"] / 2**20 for r in pts]
        a1.plot(xs, ms, "o-", color=colors.get(be), label=be)
        a2.plot(xs, mib, "o-", color=colors.get(be), label=be)
        ys[a1] += ms
        ys[a2] += mib
    lens = sorted({r["seq_len"] for r in rows})
    for ax, what in ((a1, "ms per forward + backward"), (a2, "peak MiB held")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lens, [str(t) for t in lens])
        ax.xaxis.set_minor_formatter(_null_formatter())
        _log_y(ax, ys[ax])
        ax.grid(True, which="major", color="#eeeeee")
        ax.set_xlabel("sequence length T", fontsize=FS_LABEL)
        ax.set_ylabel(what, fontsize=FS_LABEL)
        ax.tick_params(labelsize=FS_SMALL)
        ax.legend(fontsize=FS_SMALL)
    a1.set_title("time", fontsize=FS_TITLE)
    a2.set_title("memory (math holds the T×T matrix)", fontsize=FS_TITLE)
    return fig


def _null_formatter():
    from matplotlib.ticker import NullFormatter  # deferred: matplotlib is optional; loaded only to draw

    return NullFormatter()


def plot_optimizers(times: dict, width: float = 5.0, height: float = 2.4):
    """Every repeat of each AdamW implementation's step (ms), with its median."""
    fig = _figure(width, height)
    ax = fig.add_subplot()
    for i, (impl, ts) in enumerate(times.items()):
        ax.plot([1e3 * t for t in ts], [i] * len(ts), "o", alpha=0.5, color="#4c72b0")
        ax.plot([1e3 * _median(ts)], [i], "|", markersize=18, color="#222222")
    ax.set_yticks(range(len(times)), list(times), fontsize=FS_LABEL)
    ax.set_xlabel("ms per optimizer.step() (dots: repeats, bar: median)", fontsize=FS_LABEL)
    ax.set_xlim(left=0)
    ax.invert_yaxis()
    return fig
