"""Measurements: FLOPs (FlopCounterMode), activation bytes (labkit.tracer), memory, MFU/HFU.

Probes never touch the model being trained: they build their own copy of the architecture.

FLOP convention used by the whole course: count matmul FLOPs only (2 per multiply-add), attention
counted *non-causal* (the full T x T score matrix, as FlopCounterMode and PaLM's MFU do), N = every
matmul weight including the LM head. Then a training step costs 6·N + 12·L·d·T FLOPs per token.
"""
from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time

import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.utils.flop_counter import FlopCounterMode

from .device import cores
from .model import GPT
from .precision import autocast
from .tracer import Tracer


def formula_flops_per_token(n_matmul_params: int, n_layer: int, d_model: int, seq_len: int) -> int:
    """Training FLOPs per token: 6·N (fwd 2N + bwd 4N) plus attention scores and mixing, non-causal."""
    return 6 * n_matmul_params + 12 * n_layer * d_model * seq_len


def _math_attention():
    """FlopCounterMode counts the fused CPU attention kernel as 0 FLOPs; the math backend is counted."""
    return sdpa_kernel([SDPBackend.MATH])


@functools.lru_cache(maxsize=64)  # a pure function of the shape: sweeps need not count again
def count_flops(spec, checkpointing_mode: str = "none", checkpoint_every: int = 1, batch: int = 1) -> int:
    """FLOPs of one forward+backward of ``batch`` sequences, counted on a meta-device copy (no memory,
    no time). With checkpointing the recomputed forward is counted too: hardware FLOPs, for HFU."""
    with torch.device("meta"):
        model = GPT(spec, checkpointing_mode=checkpointing_mode, checkpoint_every=checkpoint_every)
        idx = torch.zeros(batch, spec.seq_len, dtype=torch.long)
    counter = FlopCounterMode(display=False)
    with _math_attention(), counter:
        model(idx, idx).backward()
    return int(counter.get_total_flops())


def activation_bytes(config, device, batch: int = 1) -> tuple:
    """(activation bytes, autocast weight-copy bytes) held for backward after one forward pass of
    ``batch`` sequences, measured on a fresh copy of the architecture on the real device."""
    spec = config.spec
    torch.manual_seed(0)
    model = GPT(spec, checkpointing_mode=config.checkpointing, checkpoint_every=config.checkpoint_every).to(device)
    idx = torch.randint(0, 256, (batch, spec.seq_len), device=device)
    # labkit's one dispatch tracer (memtrace's): what is alive when the forward pass returns is what
    # autograd -- and a selective-checkpoint policy, which a saved-tensors hook cannot see -- holds for backward
    tracer = Tracer(model)
    with attention_backend(config.attention), tracer:
        with autocast(device.type, config.precision):
            loss = model(idx, idx)
        acts, copies = tracer.alive_bytes()
    del loss, model, tracer
    return acts, copies


def attention_backend(name: str):
    if name == "auto":
        return contextlib.nullcontext()

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


# --- how busy the machine is, apart from us ---------------------------------------------------------

def _proc_stat():
    """(busy, steal, total) CPU ticks of the whole machine from /proc/stat, or None off Linux."""
    try:
        with open("/proc/stat") as f:
            parts = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (parts + [0] * 8)[:8]
    return user + nice + system + irq + softirq, steal, sum(parts[:8])


def children_cpu_s():
    """CPU-seconds used so far by this process's live children (loader workers), or None without psutil."""
    try:
        import psutil  # deferred: psutil is optional (course extras)
    except ImportError:
        return None
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            t = child.cpu_times()
            total += t.user + t.system
    return total


def _own_cpu_s() -> float:
    """CPU-seconds of this process, its finished children, and (with psutil) its live ones."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + (children_cpu_s() or 0.0)


class LoadMeter:
    """How much CPU *other* processes used while we measured: all busy ticks of the machine minus our
    own process tree's CPU time, in cores, plus the hypervisor's steal. Two busy cores of a 2-core
    machine turn a 1.1x effect into noise, so every verdict says whether the machine was busy."""

    BUSY_CORES = 0.5   # others using half a core or more on average counts as busy
    BUSY_STEAL = 0.10  # or the hypervisor taking 10 % of our time

    def __init__(self):
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.start()

    def start(self):
        self._t0, self._stat0, self._own0 = time.perf_counter(), _proc_stat(), _own_cpu_s()

    def read(self) -> dict:
        """{'other_cores', 'steal_frac', 'busy', 'source'} since start()."""
        wall = time.perf_counter() - self._t0
        stat = _proc_stat()
        if stat is None or self._stat0 is None or wall <= 0:
            load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
            busy = load1 is not None and load1 >= 0.75 * cores()
            return {"other_cores": None, "steal_frac": None, "busy": busy, "load_avg_1min": load1,
                    "source": "1-minute load average (no /proc/stat here)"}
        busy_ticks, steal, total = (b - a for a, b in zip(self._stat0, stat))
        other = max(0.0, busy_ticks / self._hz - (_own_cpu_s() - self._own0)) / wall
        steal_frac = steal / total if total > 0 else 0.0
        return {"other_cores": other, "steal_frac": steal_frac,
                "busy": other >= self.BUSY_CORES or steal_frac >= self.BUSY_STEAL,
                "load_avg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
                "source": "/proc/stat minus this process tree's CPU time"}


def machine_load(seconds: float = 0.3) -> dict:
    """A short look at how busy the machine is right now (others' load, see LoadMeter)."""
    meter = LoadMeter()
    time.sleep(seconds)  # noqa: sleep-ok  (a wait to observe others, not simulated work)
    return meter.read()
