"""One profiled training step of chapter 07, read the way a person reads the profiler's table: ``profile_step``
runs it (optionally exporting a Chrome/Perfetto trace, atomically), ``ProfileTable`` holds the rows and the
labelled phases, ``share_rows`` and ``plot_shares`` set several profiles' shares side by side."""
from __future__ import annotations

import contextlib
import html
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import profile, ProfilerActivity, record_function

from ...base import paths
from ...base.runtime import ConfigError
from ...engine.config import Config, _int
from ...engine.data import make_loader
from ...engine.device import capabilities, intra_op_threads, synchronize, torch_device
from ...engine.measure import attention_backend, median
from ...engine.model import GPT
from ...engine.precision import autocast, matmul_precision
from ...engine.step import make_optimizer, optimizer_step  # the update step the course teaches
from ...tools.timing import _quiet_fd2
from ..measured import saved
from ..course import bench_threads, reference_summaries
from ...tools.memory import _config, _threads
from .bench import DPI, FS_LABEL, FS_SMALL, interleaved

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
    """One profiled training step, read the way a person reads ``prof.key_averages().table()``: ``rows`` (name,
    self_s, total_s, calls, kind) by self time, ``phases`` (seconds in each labelled range). Device (kernel) times
    on a GPU, the calling thread's on a CPU. ``wall_s`` (GPU): the step timed apart, unprofiled; what the
    kernels do not fill of it -- Python, autograd, launches -- is the ``idle`` share."""

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

    def basis(self) -> str:
        """What the shares are of: 'wall' (a GPU step timed apart), 'kernel' (a GPU's kernel time only: the
        gaps between kernels are not in it) or 'thread' (a CPU's calling thread)."""
        return "wall" if self.on_wall_time() else "kernel" if self.device == "cuda" else "thread"

    def basis_words(self) -> str:
        """``basis()`` as a label: 'of wall time', 'of kernel time', 'of thread time'."""
        return f"of {self.basis()} time"

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

    def phase_rows(self) -> list:
        """The labelled ranges (``PHASES``) this step recorded, each with its total time in ms (which includes
        every op inside it): the chapter's table says what each range covers."""
        return [{"range": p, "ms": 1e3 * self.phases[p]} for p in PHASES if p in self.phases]

    def top_rows(self, n: int = 10) -> list:
        """The top ``n`` operations by self time, numbered (``rank``), with each one's kind, self time (ms),
        share of ``basis_s`` and calls."""
        basis = self.basis_s() or 1.0
        return [{"rank": i + 1, "name": r["name"], "kind": r["kind"], "self_ms": 1e3 * r["self_s"],
                 "share": r["self_s"] / basis, "calls": r["calls"]} for i, r in enumerate(self.top(n))]

    def html(self, n: int = 25) -> str:
        """The profiler's table as HTML, every row by self time; numbers never wrap, a long name wraps in its cell."""
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
    if not cuda:
        return evt.self_cpu_time_total / 1e6, evt.cpu_time_total / 1e6

    def seconds(new: str, old: str) -> float:
        us = getattr(evt, new, None)
        return (getattr(evt, old, 0.0) if us is None else us) / 1e6

    return seconds("self_device_time_total", "self_cuda_time_total"), seconds("device_time_total", "cuda_time_total")


def read_profile(prof, device: str, row_limit: int = 25) -> tuple:
    """(rows, phases, printed table) from a finished profiler: the host-side ops and ranges, each with the
    device time of the kernels it launched on a GPU (the kernels' own rows are left out: counted once)."""
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
    """One training step (forward, backward, the engine's ``optimizer_step``), each phase a profiler range when
    ``labelled`` -- written out, since the engine's ``micro_steps`` runs forward and backward in one call."""
    label = record_function if labelled else (lambda _name: contextlib.nullcontext())
    with label("step"):
        with label("forward"), attention_backend(config.attention), autocast(kind, config.precision):
            loss = model(x, y)
        with label("backward"), attention_backend(config.attention):
            loss.backward()
        with label("optimizer"):
            optimizer_step(model, opt, None, config.grad_clip)
    return loss


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
    return median(times)


def profile_step(config: Config, trace_path=None, warmup: int = 2, n_threads: int | None = None,
                 row_limit: int = 25) -> ProfileTable:
    """Profile one training step of ``config`` after ``warmup`` unprofiled ones; on a GPU the step is also
    timed apart, so the shares are of the wall time and the idle share shows. ``trace_path``: also export a
    Chrome/Perfetto trace there (a regular file or a new name; written atomically, a failed write raises)."""
    _config(config)
    trace = _check_trace_path(trace_path)
    _int("warmup", warmup, 0, 1000)
    _int("row_limit", row_limit, 1, 10**6)
    _threads(n_threads)
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


def share_rows(tables: dict) -> list:
    """One row per profiled step ({label: ProfileTable}): its shares in matmuls, attention, ``other`` ops and
    outside any op (a GPU's idle share, a CPU's Python and autograd, None for GPU kernel time only), calls, basis."""
    if not isinstance(tables, dict) or not tables or not all(isinstance(t, ProfileTable) for t in tables.values()):
        raise ConfigError("tables", tables, "a dict {label: the ProfileTable ch07.profile_step returns}")
    rows = []
    for label, t in tables.items():
        outside = t.share("idle") if t.on_wall_time() else None if t.device == "cuda" else t.share("range")
        rows.append({"profile": label, "matmul": t.share("matmul"), "attention": t.share("attention"),
                     "other": t.share("other"), "outside": outside, "other_calls": t.calls("other"),
                     "matmul_calls": t.calls("matmul"), "basis": t.basis_words()})
    return rows


def reference_profile():
    """The GPU reference's profiled step as a ProfileTable, or None when the course ships none."""
    p = reference_summaries("kernels/profile").get("kernels/profile")
    if not p:
        return None
    return ProfileTable(rows=p["top"], phases=p["phases_s"], device="cuda", time_source=p["time_source"],
                        wall_s=p.get("wall_s"))


def saved_profile():
    """While a grader runs the notebook, the profiler table the learner's ``read_profile`` check saved
    (``labkit-measurements.json``): the exercise is graded on the table the learner read, so the grader's CPU
    does not profile another step. None otherwise -- the chapter then profiles its own step."""
    data = saved("read_profile")
    return ProfileTable(**data["table"]) if data and isinstance(data.get("table"), dict) else None


KIND_COLORS = {"matmul": "#4c72b0", "attention": "#8172b3", "other": "#dd8452", "range": "#bbbbbb",
               "idle": "#e8e8e8"}
KIND_WORDS = {"matmul": "matmuls", "attention": "attention kernels", "other": "element-wise, norms, copies",
              "range": "outside ops (Python, autograd)", "idle": "GPU idle between kernels"}


def plot_shares(tables: dict, width: float = 7.5, height: float = 2.8):
    """One horizontal bar per profiled step ({label: ProfileTable}), split by kind of operation -- and, for a
    GPU step timed apart, the share of its wall time in which the GPU ran no kernel."""
    from ...tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height, dpi=DPI)  # labkit's one figure maker, at this chapter's 80 dpi
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
    basis = bases.pop() if len(bases) == 1 else "of each step"  # mixed: the table's column says each
    ax.set_xlabel(f"% {basis}", fontsize=FS_LABEL)
    ax.tick_params(labelsize=FS_SMALL)
    fig.legend(fontsize=FS_SMALL, loc="outside lower center", ncols=3)
    ax.invert_yaxis()
    return fig
