"""Attention backends (chapter 07): forward + backward of causal scaled-dot-product attention with
each SDPA backend at each sequence length -- time (interleaved) and the bytes kept for backward -- and the
course's verdict between two backends."""
from __future__ import annotations

import torch
from torch.nn.attention import sdpa_kernel, SDPBackend

from ...base.runtime import ConfigError
from ...engine.config import _choice, _int
from ...engine import gpus
from ...engine.device import capabilities, intra_op_threads, torch_device
from ...engine.measure import median
from ...tools.compare import verdict
from ...engine.tracer import Tracer
from ..course import bench_threads
from ...tools.memory import _threads
from .bench import DPI, FS_LABEL, FS_SMALL, FS_TITLE, _log_y, _need_ints, _null_formatter, interleaved



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
