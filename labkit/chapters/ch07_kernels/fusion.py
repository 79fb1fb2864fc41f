"""What fusion removes (chapter 07): whether Inductor can build kernels here, a fused element-wise chain
against eager, the engine's ``compile=True`` with compile time, cache and graph breaks kept apart, a
compile's payback; and the fused SDPA attention backends against math -- forward + backward of causal
attention at each sequence length, time (interleaved) and the bytes kept for backward. Figures and verdict
names only; the words are in the chapter's cells."""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import shutil
import time

import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.utils._python_dispatch import TorchDispatchMode

from ...base import paths
from ...base.runtime import ConfigError
from ...engine import gpus
from ...engine.config import Config, _choice, _int
from ...engine.device import capabilities, intra_op_threads, synchronize, torch_device
from ...engine.measure import median
from ...engine.tracer import Tracer
from ...engine.train import run
from ...tools.compare import verdict
from ...tools.memory import _config, _threads
from ..course import bench_threads
from .bench import (DPI, FS_LABEL, FS_SMALL, FS_TITLE, _log_y, _need_budget, _need_ints, _null_formatter,
                    interleaved)


# ---- the C++ compiler Inductor needs on a CPU ----------------------------------------------------------


def cxx_compiler() -> str | None:
    """The C++ compiler Inductor would call for CPU kernels (CXX, its config, g++ ...), or None."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else []
    with contextlib.suppress(Exception):  # a private config: read it where it exists
        import torch._inductor.config as ind  # deferred: torch's compiler, slow to import; private: read where it exists

        names += [c for c in ind.cpp.cxx if c]
    names += ["g++", "c++", "clang++"]
    return next((path for n in names if (path := shutil.which(n))), None)


def compile_ready(kind: str | None = None) -> tuple:
    """(ok, why): can torch.compile build kernels here? ``why``: 'cxx', 'no_cxx' (CPU), 'triton', 'no_triton'
    (CUDA) or 'unsupported' (MPS is experimental in Inductor)."""
    kind = kind or capabilities("auto").kind
    if kind == "cpu":
        return (True, "cxx") if cxx_compiler() is not None else (False, "no_cxx")
    if kind == "cuda":
        return (True, "triton") if importlib.util.find_spec("triton") is not None else (False, "no_triton")
    return False, "unsupported"


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


class _DropPrefix:
    """A logging filter that drops the records whose message starts with ``prefix``."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def filter(self, record) -> bool:
        return not str(record.msg).startswith(self.prefix)


@contextlib.contextmanager
def _quiet_dynamo():
    # Dynamo's "Profiler record function ... will be ignored": DDP's forward opens a profiler range, which
    # Dynamo leaves out of the compiled graph -- harmless, and not this chapter's topic. And "No CUDA runtime
    # is found": torch.utils.cpp_extension says it when Inductor first imports it on a machine with CUDA's
    # tools but no GPU -- a red box above the fusion table (#46, item 13), though a CPU compile needs no CUDA.
    quiet = [(logging.getLogger(n), _DropPrefix("Profiler "))
             for n in ("torch._dynamo.variables.ctx_manager", "torch._dynamo.variables.torch")]
    quiet.append((logging.getLogger("torch.utils.cpp_extension"), _DropPrefix("No CUDA runtime is found")))
    for lg, note in quiet:
        lg.addFilter(note)
    try:
        yield
    finally:
        for lg, note in quiet:
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
    """Compile ``gelu(x + b) + r`` and compare with eager: ATen ops eager runs, Inductor's kernels (``made``:
    'generated', 'loaded' or 'reused'), compile time and interleaved times with their verdict. Where Inductor
    cannot build kernels: {"ok": False, "made": "skipped", "reason": compile_ready's key}."""
    _int("rows", rows, 1, 1 << 20)
    _int("cols", cols, 1, 1 << 20)
    _int("repeats", repeats, 1, 10**6)
    _need_budget(budget_s)
    _threads(n_threads)
    dev = torch_device()
    ok, why = compile_ready(dev.type)
    if not ok:
        return {"ok": False, "made": "skipped", "reason": why}
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
    state = _cache_state(c0, c1)
    kernels = None if k0 is None else k1 - k0
    made = ("reused" if kernels == 0 or state["cache"] == "reused" else "loaded" if state["cache"] == "cached"
            else "generated")
    return {"ok": True, "reason": why, "eager_ops": counter.names, "kernels": kernels, "made": made,
            "compile_s": compile_s, "same_result": bool(same), "comparison": cmp, "tensor_mib": mib,
            "eager_s": median(t["eager"]), "compiled_s": median(t["compiled"]), **state}


def compile_run(config: Config, run_fn=None, cold: bool = False) -> dict:
    """The engine's ``compile=True`` with compile time apart: first update minus the median of the others.
    ``cold``: from an empty Inductor cache. Also ``cache`` ('cold', 'cached', 'mixed', 'reused'), the kernels
    and Dynamo's graph breaks with its reasons."""
    _config(config)
    run_fn = run_fn or run
    cfg = config.replace(compile=True, warmup=max(1, config.warmup))
    with _empty_compile_cache() if cold else contextlib.nullcontext(), _quiet_dynamo():
        k0, c0 = _inductor_kernels(), _dynamo_counters()
        res = run_fn(cfg)
        k1, c1 = _inductor_kernels(), _dynamo_counters()
    recs = res.records
    first = recs[0]["step_time_s"] if recs else None
    steady = median([r["step_time_s"] for r in recs[1:]])
    reasons = _break_reasons(c0, c1)
    return {"result": res, "first_update_s": first, "steady_step_s": steady,
            "compile_s": max(0.0, first - steady) if first is not None and steady is not None else None,
            "kernels": None if k0 is None or k1 is None else k1 - k0,
            "graph_breaks": None if c1 is None else sum(n for _, n in reasons), "break_reasons": reasons,
            "cold": cold, **_cache_state(c0, c1)}


def payback(compiled: dict, cmp) -> dict:
    """A compile's payback figures: ``compile_s`` and the cache state from ``compile_run``, the eager and compiled
    step medians of the comparison ``cmp``, and ``sped_up`` (whether the comparison found compiled faster)."""
    if not isinstance(compiled, dict) or "compile_s" not in compiled:
        raise ConfigError("compiled", type(compiled).__name__, "the dict ch07.compile_run returns")
    if not all(hasattr(cmp, k) for k in ("results_a", "results_b", "better")):
        raise ConfigError("cmp", type(cmp).__name__, "the eager-against-compiled comparison of lk.compare_configs")
    eager_s, compiled_s = (median([r.summary["step_time_s"] for r in rs]) for rs in (cmp.results_a, cmp.results_b))
    return {"compile_s": compiled["compile_s"], "cache": compiled.get("cache") or "unknown", "eager_step_s": eager_s,
            "compiled_step_s": compiled_s, "sped_up": cmp.better == "b"}


def payback_verdict(pay: dict, steps) -> str:
    """The verdict name of a payback (``payback``'s figures and ``steps``, what the learner's breakeven
    returned on them): 'reused' (nothing compiled: no breakeven to speak of), 'unproven' (the comparison found
    no speed-up), 'never' (not a finite number of updates) or 'pays'."""
    if pay["cache"] == "reused" or pay["compile_s"] is None:
        return "reused"
    if not pay["sped_up"]:
        return "unproven"
    finite = isinstance(steps, (int, float)) and not isinstance(steps, bool) and steps == steps and abs(steps) != float("inf")
    return "pays" if finite else "never"


# ---- the SDPA backends: fused attention against math --------------------------------------------

def sdpa_backends(kind: str | None = None) -> list:
    """Backend names of torch's scaled_dot_product_attention to try on this device: math everywhere,
    flash (CPU and CUDA), efficient and cudnn on CUDA only -- on a GPU, those its compute capability has
    (the GPU plan: a T4 or a P100 has no flash and no cuDNN attention, see ``gpu_sdpa``)."""
    here = capabilities("auto").kind
    kind = kind or here
    if kind == "cuda":  # with no GPU visible, all CUDA has (a GPU narrows it to its compute capability)
        return list(gpu_sdpa()[0]) if here == "cuda" else ["math", "flash", "efficient", "cudnn"]
    if kind == "cpu":
        return ["math", "flash"]
    return ["math"]


def gpu_sdpa() -> tuple:
    """(backends, sentence) of the visible GPU: its plan's where the catalogue knows the board, else from
    the compute capability torch reports (``labkit.engine.gpus.sdpa_backends``)."""
    plan = gpus.current_plan()
    if plan is not None:
        return plan.sdpa_backends, plan.sdpa_why
    cc = capabilities("auto").compute_capability
    sm = tuple(int(x) for x in cc.split(".")) if cc else None
    backends = gpus.sdpa_backends(sm)
    return backends, f"compute capability {cc}: PyTorch's SDPA has the {', '.join(backends)} kernels here."


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
    storage with labkit's dispatch tracer."""
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
    time: fp16/bf16 inputs are upcast to fp32 (checked on torch 2.9.1 and 2.14.1) unless
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
    _threads(n_threads)
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
    # on a GPU the 16-bit format it has units for: below sm 8.0 the memory-efficient kernel takes no bf16
    dtype = dtype or ((torch.bfloat16 if capabilities("auto").bf16 else torch.float16) if dev.type == "cuda"
                      else torch.float32)
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
                    row.update(time_s=median(times[be]), samples=times[be], kept_bytes=mem[be][0],
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


def fused_backend(att: list) -> str:
    """The first fused SDPA backend that ran in ``attention_sweep``'s rows (flash, then efficient, then cuDNN)."""
    ran = {r["backend"] for r in att if "error" not in r}
    found = next((b for b in ("flash", "efficient", "cudnn") if b in ran), None)
    if found is None:
        raise ConfigError("att", sorted(ran), "rows of attention_sweep in which a fused backend ran")
    return found


def memory_rows(att: list) -> list:
    """``attention_sweep``'s rows at its longest sequence, one per backend: bytes kept for backward, the peak and
    (math only: the backend that keeps them) the T × T probabilities alone, in MiB -- and, for a backend that
    did not run, its error."""
    if not isinstance(att, list) or not att or not all(isinstance(r, dict) and "seq_len" in r for r in att):
        raise ConfigError("att", type(att).__name__, "the rows attention_sweep returns")
    longest = max(r["seq_len"] for r in att)
    return [{"T": r["seq_len"], "backend": r["backend"], "error": r["error"][:90] if "error" in r else None,
             **{k.replace("_bytes", "_mib"): r[k] / 2**20 for k in ("kept_bytes", "peak_bytes", "scores_bytes")
                if k in r and (k != "scores_bytes" or r["backend"] == "math")}}
            for r in att if r["seq_len"] == longest]


def plot_attention(rows, width: float = 9.0, height: float = 3.4):
    """Time and peak memory of forward + backward against sequence length, one line per backend (log-log,
    labelled with plain numbers)."""
    from ...tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height, dpi=DPI)  # labkit's one figure maker, at this chapter's 80 dpi
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
