"""Measurements: FLOPs (FlopCounterMode), activation bytes (engine.tracer), MFU/HFU, a run's
summary; and the memory pre-flight: what a run needs, counted by hand before it starts, and the
words when it does not fit. Probes never touch the model being trained: they build their own.

FLOP convention used by the whole course: count matmul FLOPs only (2 per multiply-add), attention
counted *non-causal* (the full T x T score matrix, as FlopCounterMode and PaLM's MFU do), N = every
matmul weight including the LM head. Then a training step costs 6·N + 12·L·d·T FLOPs per token.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import os
import platform
import statistics

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..base import runtime
from ..base.compat import need
from ..base.runtime import OutOfMemory
from ..base.numfmt import number
from .config import config_echo
from .data import corpus_sha
from .device import Capabilities, capabilities
from .device import LoadMeter, machine_load  # noqa: F401  (chapter tools import them from here)
from .model import GPT, VOCAB, n_params
from .precision import autocast
from .tracer import Tracer

try:
    from torch.nn.attention import sdpa_kernel, SDPBackend
except ImportError:  # torch < 2.3: need("sdpa_kernel") below says so where a backend is chosen
    sdpa_kernel = SDPBackend = None


def formula_flops_per_token(n_matmul_params: int, n_layer: int, d_model: int, seq_len: int) -> int:
    """Training FLOPs per token: 6·N (fwd 2N + bwd 4N) plus attention scores and mixing, non-causal."""
    return 6 * n_matmul_params + 12 * n_layer * d_model * seq_len


@functools.lru_cache(maxsize=64)  # a pure function of the shape: sweeps need not count again
def count_flops(spec, checkpointing_mode: str = "none", checkpoint_every: int = 1, batch: int = 1) -> int:
    """FLOPs of one forward+backward of ``batch`` sequences, counted on a meta-device copy (no memory,
    no time). With checkpointing the recomputed forward is counted too: hardware FLOPs, for HFU."""
    with torch.device("meta"):
        model = GPT(spec, checkpointing_mode=checkpointing_mode, checkpoint_every=checkpoint_every)
        idx = torch.zeros(batch, spec.seq_len, dtype=torch.long)
    counter = FlopCounterMode(display=False)
    # FlopCounterMode counts the fused CPU attention kernel as 0 FLOPs; the math backend is counted
    with attention_backend("math"), counter:
        model(idx, idx).backward()
    return int(counter.get_total_flops())


def activation_bytes(config, device, batch: int = 1) -> tuple:
    """(activation bytes, autocast weight-copy bytes) held for backward after one forward pass of
    ``batch`` sequences, measured on a fresh copy of the architecture on the real device."""
    return _activation_bytes(config.spec, config.checkpointing, config.checkpoint_every, config.attention,
                             config.precision, torch.device(device), batch)


# Measured once per process for each shape: a byte count depends on nothing else, and this probe was a
# large part of a small run's fixed cost (one traced forward pass, 0.05 s for tiny, 0.4 s for small on 2 cores).
@functools.lru_cache(maxsize=64)
def _activation_bytes(spec, checkpointing: str, every: int, attention: str, precision: str, device, batch: int):
    # The weights' and tokens' values do not change a byte count; their random numbers are drawn on the CPU
    # and given back, so the training's stream does not depend on whether this ran or was remembered.
    with torch.random.fork_rng(devices=[]):
        model = GPT(spec, checkpointing_mode=checkpointing, checkpoint_every=every).to(device)
        idx = torch.randint(0, 256, (batch, spec.seq_len)).to(device)
        # labkit's one dispatch tracer (memtrace's): what is alive when the forward pass returns is what
        # autograd -- and a selective-checkpoint policy, which a saved-tensors hook cannot see -- holds for backward
        tracer = Tracer(model)
        with attention_backend(attention), tracer:
            with autocast(device.type, precision):
                loss = model(idx, idx)
            acts, copies = tracer.alive_bytes()
        del loss, model, tracer
    return acts, copies


def attention_backend(name: str):
    if name == "auto":
        return contextlib.nullcontext()
    need("sdpa_kernel")  # torch >= 2.3: a clear message on an older one
    backend = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]
    return sdpa_kernel([backend])


def state_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def optimizer_bytes(optimizer) -> int:
    return sum(state_bytes(s.values()) for s in optimizer.state.values())


def mfu(flops_per_step: float, step_time_s: float, peak_flops: float, n_devices: int = 1):
    """Model FLOPs utilisation: achieved useful FLOP/s over what the hardware could do at peak."""
    if not step_time_s or not peak_flops:
        return None
    return flops_per_step / step_time_s / (peak_flops * n_devices)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---- the summary of a run (schema.Summary) --------------------------------------------------------

MFU_WRONG = "MFU > 1: the peak is wrong"  # what every table shows in place of an MFU above 1 (never as measured)


def mfu_impossible(v) -> bool:
    """Whether a utilisation is above 1: no run does more FLOP/s than its device's peak, so the peak (or
    the FLOP count, or the timing) is wrong and the number is not a measurement."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 1


def mfu_note(hfu, peak_source, mfu=None, peak_flops=None):
    """Why a utilisation above 100 % is shown -- never silently, never as measured. MFU > 1 is said first
    ("MFU > 1: the peak is wrong (...)"); else HFU (>= MFU) above 1. None when both are at most 1."""
    if not (mfu_impossible(mfu) or mfu_impossible(hfu)):
        return None
    what = (f"{MFU_WRONG} (MFU {mfu:.0%}" if mfu_impossible(mfu) else f"HFU > 1: the peak is wrong (HFU {hfu:.0%}") \
        + (f" of {number(peak_flops)} FLOP/s" if isinstance(peak_flops, (int, float)) else "")
    if peak_source and peak_source.startswith("measured"):
        return (f"{what}, {peak_source.split(';')[0]}): above 100 % cannot be real -- the probe that set the peak "
                "ran small matrices or under load, or its cache was damaged or planted. Run "
                "`python -m labkit env --remeasure` on an idle machine to measure it again")
    return (f"{what} of the datasheet peak): above 100 % cannot be real -- the FLOP count or the timing is wrong; "
            "please report it")


def run_summary(run, records: list) -> dict:
    """The summary of one run (schema.Summary) from rank 0's ``_Run`` (train.py) and its records:
    medians over the timed updates (the warm-up left out), memory, FLOPs, utilisation, losses, AllReduce."""
    config, caps, probe = run.config, run.caps, run.probe
    timed = records[config.warmup:] or records
    step_time = median([r["step_time_s"] for r in timed])
    total_time = sum(r["step_time_s"] for r in timed)
    s = {
        "status": "completed",
        **config_echo(config, run.world_size),
        "device": caps.kind,
        "device_name": caps.name,
        "device_reason": caps.reason,
        "precision_note": run.numerics.note,
        "compute_capability": caps.compute_capability,
        "n_params": n_params(run.model),
        "n_matmul_params": run.model.matmul_params(),
        "timed_updates": len(timed),
        "step_time_s": step_time,
        "tokens_per_s": config.tokens_per_update / step_time if step_time else None,
        "samples_per_s": config.micro_batch * config.accum * run.world_size / step_time if step_time else None,
        "data_wait_s": median([r["data_wait_s"] for r in timed]),
        "compute_s": median([r["compute_s"] for r in timed]),
        "optimizer_s": median([r["optimizer_s"] for r in timed]),
        "data_wait_frac": sum(r["data_wait_s"] for r in timed) / total_time if total_time else None,
        "intra_op_threads": run.threads,
        "cpu_s_per_update": median([r["cpu_s"] for r in timed]),
        "peak_mem_bytes": torch.cuda.max_memory_allocated(run.dev) if caps.kind == "cuda" else None,
        "param_bytes": state_bytes(run.model.parameters()),
        "grad_bytes": run.grad_bytes,
        "optimizer_bytes": run.opt_bytes,
        "activation_bytes": probe["activation_bytes"],
        "autocast_weight_copy_bytes": probe["autocast_weight_copy_bytes"],
        "model_flops_per_step": probe["model_flops"],
        "hardware_flops_per_step": probe["hardware_flops"],
        **utilisation(probe, step_time, run.world_size),
        **loss_summary(records),
        "corpus_sha": corpus_sha(run.corpus),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
    }
    s.update(allreduce_summary(run.counter, records, caps.kind))
    return s


def utilisation(probe: dict, step_time, world_size: int) -> dict:
    """Peak FLOP/s (and where it came from), MFU, HFU and the note on a utilisation above 100 %."""
    hfu = mfu(probe["hardware_flops"], step_time, probe["peak_flops"], world_size)
    s_mfu = mfu(probe["model_flops"], step_time, probe["peak_flops"], world_size)
    return {"peak_flops": probe["peak_flops"], "peak_flops_source": probe["peak_flops_source"],
            "mfu": s_mfu, "hfu": hfu,
            "mfu_note": mfu_note(hfu, probe["peak_flops_source"], s_mfu, probe["peak_flops"])}


def loss_summary(records: list) -> dict:
    """First and final loss, the last gradient norm and scale, and how many updates were skipped or non-finite."""
    last = records[-1] if records else {}
    return {"final_loss": last.get("loss"), "first_loss": records[0]["loss"] if records else None,
            "grad_norm": last.get("grad_norm"), "skipped_steps": sum(r["skipped"] for r in records),
            "nonfinite_steps": sum(r["nonfinite"] for r in records), "grad_scale": last.get("grad_scale")}


def allreduce_summary(counter, records: list, kind: str) -> dict:
    """AllReduce totals and per-update figures; ``comm_time_s`` is not measured (always None) but stays,
    as the CLI's --json promises the key."""
    if counter is None:
        return {**{k: None for k in ("n_buckets", "first_update_buckets", "allreduce_calls", "allreduce_bytes",
                                     "allreduce_calls_per_update", "allreduce_bytes_per_update", "comm_time_s")},
                "ddp_note": f"no DDP on {kind}: PyTorch has no distributed backend for it"}
    later = records[1:] or records  # DDP's first iteration uses a single bucket: leave it out
    return {
        "n_buckets": counter.rounds[-1] if counter.rounds else None,
        "first_update_buckets": counter.rounds[0] if counter.rounds else None,
        "allreduce_calls": counter.calls,
        "allreduce_bytes": counter.bytes,
        "allreduce_calls_per_update": sum(r["allreduce_calls"] for r in later) / len(later),
        "allreduce_bytes_per_update": sum(r["allreduce_bytes"] for r in later) / len(later),
        "comm_time_s": None,
        "ddp_note": "per-update AllReduce figures leave out update 1 (DDP's first iteration uses one "
                    "bucket for every gradient)" if len(records) > 1 else "only one update: it is DDP's "
                    "first iteration, whose single bucket differs from later ones",
    }


# ---- the memory pre-flight: a CPU run that cannot fit is refused before any work ----------------

def block_bytes_formula(d_model: int, n_head: int, seq_len: int, batch: int, bytes_per_value: int = 4) -> int:
    """Bytes one transformer block of this course's GPT keeps for backward, counted by hand.

    Per token, in values: LayerNorm 1 output (d) + q,k,v (3d) + attention output (d; a fused kernel returns
    it in the layout the projection reads, so no copy) + residual sum (d) + LayerNorm 2 output (d) + MLP
    up-projection (4d) + GELU output (4d) + block output (d) = 16·d; plus the attention kernel's log-sum-exp
    (one per head) and each LayerNorm's mean and 1/std (2 × 2). A fused kernel keeps no T×T score matrix.
    """
    per_token = 16 * d_model + n_head + 4
    return batch * seq_len * per_token * bytes_per_value


def param_count(spec) -> int:
    """Parameters of this course's GPT, from its shapes (no model is built): token and position
    embeddings, per block two LayerNorms (2d each), qkv (3d^2 + 3d), proj (d^2 + d), fc (4d^2 + 4d) and
    out (4d^2 + d), the final LayerNorm; the head shares the token embedding."""
    d = spec.d_model
    return VOCAB * d + spec.seq_len * d + spec.n_layer * (12 * d * d + 13 * d) + 2 * d


def host_memory_estimate(config, procs: int = 1) -> dict:
    """Bytes a CPU run of ``procs`` processes needs at the least, counted before any work.

    Per process: fp32 weights, gradients and DDP's gradient buckets (4 B each per parameter), the
    optimizer's state (AdamW 8 B, SGD's momentum 4 B), autocast's 16-bit weight copies; and the
    activations kept for backward, from the hand count per block (``block_bytes_formula``) (16-bit values under
    autocast). With checkpointing only the block inputs plus one block are counted, and the math
    attention kernel adds its T x T scores and probabilities. Embeddings and logits are left out:
    this is a floor, so a run it refuses could not have fit."""
    spec, B = config.spec, config.micro_batch
    n = param_count(spec)
    half = config.precision in ("fp16", "bf16")
    per_param = 12 + (8 if config.optimizer == "adamw" else 4) + (2 if half else 0)
    block = block_bytes_formula(spec.d_model, spec.n_head, spec.seq_len, B, 2 if half else 4)
    if config.attention == "math":
        block += 2 * B * spec.n_head * spec.seq_len ** 2 * (2 if half else 4)
    if config.checkpointing == "none":
        acts = spec.n_layer * block
    else:
        acts = spec.n_layer * B * spec.seq_len * spec.d_model * 4 + block
    states = n * per_param
    return {"n_params": n, "state_bytes": states, "activation_bytes": acts,
            "total_bytes": procs * (states + acts), "procs": procs}


def available_memory() -> int:
    """Bytes of host memory available now (psutil if installed; else free pages from sysconf)."""
    try:
        import psutil  # deferred: optional (the course extras); sysconf below serves without it

        return int(psutil.virtual_memory().available)
    except ImportError:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_host_memory(config, caps: Capabilities = None) -> None:
    """Refuse a CPU run whose estimate exceeds the memory available, in one line with both numbers.
    GPUs keep their own out-of-memory path (memory_budget_gb, oom_message)."""
    if (caps if caps is not None else capabilities(config.device)).kind != "cpu":
        return
    procs = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if runtime.under_torchrun() else config.world_size
    est = host_memory_estimate(config, procs)
    avail = available_memory()
    if est["total_bytes"] <= avail:
        return
    gib = 2**30
    raise OutOfMemory(
        f"not enough memory to start: {config.model} ({est['n_params'] / 1e6:.1f} M parameters) with "
        f"micro_batch={config.micro_batch}, seq_len={config.context}, checkpointing={config.checkpointing} on "
        f"{procs} process(es) needs at least {est['total_bytes'] / gib:.1f} GiB (per process: weights, "
        f"gradients and {config.optimizer} state {est['state_bytes'] / gib:.1f} GiB, activations "
        f"{est['activation_bytes'] / gib:.1f} GiB), but this machine has {avail / gib:.1f} GiB available. "
        "Try a smaller micro_batch with more accum, a shorter seq_len, checkpointing='full' or a smaller model.")


def oom_message(config, error: str, updates_done: int) -> str:
    """Explain an out-of-memory error with the numbers that matter, after freeing what the run held."""
    gc.collect()
    parts = [f"out of device memory after {updates_done} update(s) of {config.model} with micro_batch="
             f"{config.micro_batch}, seq_len={config.context}, precision={config.precision}, "
             f"checkpointing={config.checkpointing}."]
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(0).total_memory / 2**30
        limit = config.memory_budget_gb or total
        parts.append(f"Budget {limit:.1f} GiB (card {total:.1f} GiB); still allocated after clean-up "
                     f"{torch.cuda.memory_allocated() / 2**30:.2f} GiB.")
    parts.append("Try activation checkpointing, a smaller micro_batch with more accum, or bf16/fp16. "
                 f"PyTorch said: {error}")
    return " ".join(parts)
