"""Which device runs the lab, what it can do, and how fast it could go (peak FLOP/s per dtype).

CUDA first, then Apple's MPS, then the CPU. This module states facts (what the device has, what each
number format is in PyTorch, how fast a matmul goes); what a run may do with them is decided above
it: ``precision.resolve`` (number formats) and ``rules.refusals`` (everything this device refuses).
"""
from __future__ import annotations

import contextlib
import functools
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch

from ..base import phrases, runtime as cpus  # cpus: the cores this process may use
from ..base.numfmt import counted
from ..base.runtime import ConfigError
from ..base.paths import cache_dir
from ..base.frontend import in_notebook
from . import gpus
# the datasheet peaks are the catalogue's (gpus.py, the one peak source); importable from here too
from .gpus import PEAK_CACHE, PEAK_TABLE, TB, read_cache, table_peak, write_cache  # noqa: F401

WORDS = phrases.load_section("lab_messages.md", "Devices", {  # why this device; where a peak came from
    "cuda": (), "mps": (), "cpu": (), "asked": ("device",), "load-average": (), "proc-stat": (), "measuring": ("what",),
    "no-datasheet": ("measured", "kind", "name"), "measured": ("probes", "precision", "n", "threads"),
    "measured-under-load": ()})
say = WORDS.say


@dataclass
class Capabilities:
    kind: str                       # cuda, mps or cpu
    name: str                       # exact device name
    reason: str                     # why this device was chosen, in words
    n_devices: int = 1
    compute_capability: Optional[str] = None
    bf16: bool = False              # fast bf16 math (not emulated)
    fp16: bool = False
    tf32: bool = False
    memory_bytes: Optional[int] = None
    cpu_flags: list = field(default_factory=list)
    cores: int = 1
    ddp_backend: Optional[str] = None

    def to_dict(self):
        return asdict(self)

    def supports(self, fmt: str) -> bool:
        """Whether this device has the number format ``fmt`` at all, fast or emulated."""
        return {"fp32": True, "tf32": self.tf32, "fp16": self.fp16, "bf16": self.bf16}[fmt]


@dataclass(frozen=True)
class Format:
    """What a number format is in PyTorch: the dtype tensors hold, and whether fp32 matmuls run on
    TF32 tensor cores (tf32 is not a dtype: fp32 tensors, matmuls with a 10-bit mantissa)."""

    dtype: torch.dtype
    tf32_matmuls: bool = False

    @property
    def low(self) -> bool:
        """A 16-bit format: runs under autocast, its speed depends on the device's matrix units."""
        return self.dtype != torch.float32


FORMATS = {"fp32": Format(torch.float32), "tf32": Format(torch.float32, tf32_matmuls=True),
           "fp16": Format(torch.float16), "bf16": Format(torch.bfloat16)}


@contextlib.contextmanager
def tf32_matmuls(kind: str, on: bool):
    """TF32 for fp32 matmuls on CUDA while ``on``; plain fp32 otherwise; the old setting restored after.

    torch >= 2.9 has the ``fp32_precision`` API; in 2.13 reading the old ``allow_tf32`` flag after
    setting ``fp32_precision`` raises, so only the new API is touched where it exists.
    """
    if kind != "cuda":
        yield
        return
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    if hasattr(matmul, "fp32_precision"):
        switches, name, value = (matmul, cudnn.conv), "fp32_precision", "tf32" if on else "ieee"
    else:  # older torch
        switches, name, value = (matmul, cudnn), "allow_tf32", on
    saved = [getattr(o, name) for o in switches]
    for o in switches:
        setattr(o, name, value)
    try:
        yield
    finally:
        for o, old in zip(switches, saved):
            setattr(o, name, old)


def _cpuinfo(field: str) -> Optional[str]:
    """The value of the first ``field`` line of /proc/cpuinfo ("flags", "model name"), or None off Linux."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_flags() -> list:
    wanted = ("amx_bf16", "amx_fp16", "amx_tile", "amx_int8", "avx512f", "avx512_bf16", "avx512_fp16", "avx2", "fma")
    have = set((_cpuinfo("flags") or "").split())
    return [w for w in wanted if w in have]


def _cpu_name() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine() or "CPU"


def cores() -> int:
    """The cores this process may use: its affinity, or its cgroup's CPU quota when smaller (base/runtime.py)."""
    return cpus.usable()[0]


def _mps_available() -> bool:
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()


def resolve_kind(requested: str = "auto") -> tuple:
    """(kind, reason): CUDA first, then MPS, then CPU -- and say why, out loud."""
    # a GPU this build has no kernels for (a P100, sm 6.0, on an sm_70+ build) is "available" until its first op fails
    refused = gpus.current_refusal() if requested in ("auto", "cuda") and torch.cuda.is_available() else None
    if requested == "auto":
        if torch.cuda.is_available() and refused is None:
            return "cuda", say("cuda")
        if refused:
            return "cpu", refused
        if _mps_available():
            return "mps", say("mps")
        return "cpu", say("cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", requested, "cuda needs a CUDA build of PyTorch and a visible GPU; "
                          "none is available here (use auto or cpu)")
    if requested == "cuda" and refused:
        raise ConfigError("device", requested, refused)
    if requested == "mps" and not _mps_available():
        raise ConfigError("device", requested, "mps needs Apple silicon with the MPS backend; "
                          "it is not available here (use auto or cpu)")
    return requested, say("asked", device=requested)


@functools.lru_cache(maxsize=None)
def capabilities(requested: str = "auto") -> Capabilities:
    kind, reason = resolve_kind(requested)
    n_cores = cores()
    if kind == "cuda":
        major, minor = torch.cuda.get_device_capability(0)
        props, name = torch.cuda.get_device_properties(0), torch.cuda.get_device_name(0)
        bf16, tf32 = gpus.fast_units(name, (major, minor))  # the catalogue's units; else compute capability
        return Capabilities(
            kind="cuda", name=name, reason=reason, n_devices=torch.cuda.device_count(),
            compute_capability=f"{major}.{minor}", bf16=bf16, fp16=True, tf32=tf32,
            memory_bytes=int(props.total_memory), cpu_flags=_cpu_flags(), cores=n_cores,
            ddp_backend="nccl" if torch.distributed.is_nccl_available() else "gloo")
    if kind == "mps":
        return Capabilities("mps", "Apple MPS", reason, bf16=True, fp16=True, cores=n_cores)
    return Capabilities(  # CPU autocast supports bf16 and fp16; their speed depends on the flags
        "cpu", _cpu_name(), reason, bf16=True, fp16=True, memory_bytes=_total_ram(),
        cpu_flags=_cpu_flags(), cores=n_cores,
        ddp_backend="gloo" if torch.distributed.is_available() else None)


def _total_ram() -> Optional[int]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def max_world_size(caps: Capabilities) -> int:
    if caps.kind == "cuda":
        return caps.n_devices
    if caps.kind == "mps":
        return 1
    return max(2, caps.cores)  # CPU: one process per core (two are allowed even on one core)


# --- peak FLOP/s on a device with no datasheet entry: a bounded, cached probe -------------------------
#
# A 1024x1024 bf16 matmul takes ~7 s where bf16 is emulated (AVX2-only CPUs), so the probe grows its size
# only while the next size fits the time budget, and its result is cached on disk. The cache keeps the
# best value ever measured for that exact setting: a peak is a ceiling, and a probe run under load
# only ever measures too low.

PROBE_BUDGET_S = 2.5        # `labkit env`, cold, all formats together (3 s promised: room for overshoot)
RUN_PROBE_BUDGET_S = 1.0    # one format, before a run's first step
_MEASURED: dict = {}        # this process's copy of the cache


def _isa_flags() -> list:
    """Every flag that decides matmul speed (avx512*, amx*), not only the ones the report names."""
    return sorted(w for w in (_cpuinfo("flags") or "").split() if w.startswith(("avx512", "amx")))


def peak_cache_key(caps: Capabilities, threads: int) -> str:
    """What decides how fast a matmul runs here: the chip, its ISA, the ISA limits, threads, torch."""
    isa = ",".join(_isa_flags()) if caps.kind == "cpu" else ""
    env = ",".join(f"{v}={os.environ.get(v, '')}" for v in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"))
    return f"{caps.kind}|{caps.name}|{isa}|{env}|threads={threads}|torch={torch.__version__}"


def _read_cache() -> dict:
    return read_cache(PEAK_CACHE, "peak cache")


def _write_cache(key: str, precision: str, entry: dict) -> None:
    data = _read_cache()
    data.setdefault(key, {})[precision] = entry
    write_cache(PEAK_CACHE, data)


def probe_matmul(kind: str, precision: str, budget_s: float, announce=None) -> dict:
    """Best FLOP/s of square matmuls in ``precision``, within ``budget_s`` seconds.

    Times both ``a @ b`` and ``F.linear`` (what nn.Linear runs): they can take different kernels --
    with bf16 emulated on an AVX2 CPU, linear ran 10x faster than @ -- and a peak must be a ceiling for
    the model's own matmuls. Starts small and doubles the size only while the next size still fits
    the budget and one call stays under 50 ms; each op's first call at each size is left out."""
    fmt, dev = FORMATS[precision], torch.device(kind)
    n, n_max = (256, 8192) if kind == "cuda" else (64, 1024)
    t_start = time.perf_counter()
    deadline = t_start + budget_s
    best, best_n, timed = 0.0, n, 0
    ops = (torch.matmul, torch.nn.functional.linear)
    with tf32_matmuls(kind, fmt.tf32_matmuls):
        while True:
            a, b = (torch.randn(n, n, device=dev, dtype=fmt.dtype) for _ in range(2))
            times = {op: [] for op in ops}
            slowest = 0.0  # the slower op decides what the next size would cost (emulated @ can be 10x linear)
            for i in range(4):
                for op, ts in times.items():
                    synchronize(dev)
                    t0 = time.perf_counter()
                    op(a, b)
                    synchronize(dev)
                    dt = time.perf_counter() - t0
                    if i:  # the first call of each op at each size warms it up and is left out
                        ts.append(dt)
                        timed += 1
                    else:
                        slowest = max(slowest, dt)
                    if time.perf_counter() > deadline:
                        break
                if announce and time.perf_counter() - t_start > 1.0:
                    announce()
                    announce = None
                if time.perf_counter() > deadline:
                    break
            done = {op: min(ts) for op, ts in times.items() if ts}
            if done and 2 * n**3 / min(done.values()) > best:
                best, best_n = 2 * n**3 / min(done.values()), n
            per_round = sum(done.values()) if len(done) == len(ops) else slowest * len(ops)
            t_next = 4 * 8 * per_round  # every op 4 times at 8x the work
            if n >= n_max or min(done.values(), default=slowest) > 0.05 or time.perf_counter() + t_next > deadline:
                break
            n *= 2
    return {"flops": best, "n": best_n, "timed_calls": timed, "seconds": round(time.perf_counter() - t_start, 3)}


# --- how busy the machine is, apart from us ---------------------------------------------------------

def _proc_stat():
    """(busy, steal, total) CPU ticks of the whole machine from /proc/stat, or None off Linux."""
    try:
        with open("/proc/stat") as f:
            parts = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (parts + [0] * 8)[:8]
    return user + nice + system + irq + softirq, steal, sum(parts[:8])


def children_cpu_s():
    """CPU-seconds used so far by this process's live children (loader workers, the warm DDP server and
    its ranks), or None without psutil. A live child's finished children count too: the warm server
    reaps each run's ranks, so their CPU time lands in its ``children_*`` times, and it is ours."""
    try:
        import psutil  # deferred: psutil is optional (course extras)
    except ImportError:
        return None
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            t = child.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
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
        load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        if stat is None or self._stat0 is None or wall <= 0:
            busy = load1 is not None and load1 >= 0.75 * cores()
            return {"other_cores": None, "steal_frac": None, "busy": busy, "load_avg_1min": load1,
                    "source": say("load-average")}
        busy_ticks, steal, total = (b - a for a, b in zip(self._stat0, stat))
        other = max(0.0, busy_ticks / self._hz - (_own_cpu_s() - self._own0)) / wall
        steal_frac = steal / total if total > 0 else 0.0
        return {"other_cores": other, "steal_frac": steal_frac,
                "busy": other >= self.BUSY_CORES or steal_frac >= self.BUSY_STEAL,
                "load_avg_1min": load1, "source": say("proc-stat")}


def machine_load(seconds: float = 0.3) -> dict:
    """A short look at how busy the machine is right now (others' load, see LoadMeter)."""
    meter = LoadMeter()
    time.sleep(seconds)  # noqa: sleep-ok  (a wait to observe others, not simulated work)
    return meter.read()


def contended(reading: dict, threads: int) -> bool:
    """Whether other programs took cores a probe at ``threads`` threads needed (a LoadMeter
    reading): with fewer free cores than threads, each parallel op waits for a thread that has no
    core -- such a probe measures the contention, not the hardware."""
    free = max(0, cores() - threads)
    other = reading.get("other_cores")
    if other is None:  # no /proc/stat: the 1-minute load average, which counts this process too
        load = reading.get("load_avg_1min")
        return load is not None and load > free + threads + LoadMeter.BUSY_CORES
    return other > free + LoadMeter.BUSY_CORES or (reading.get("steal_frac") or 0.0) >= LoadMeter.BUSY_STEAL


def measured_peak(caps: Capabilities, precision: str, *, budget_s: float = RUN_PROBE_BUDGET_S,
                  remeasure: bool = False, announce=None) -> tuple:
    """(FLOP/s, entry) for this device, precision and thread count: from the cache when it has one,
    else probed under ``budget_s``. ``remeasure`` probes again; the cache keeps the higher value."""
    key = peak_cache_key(caps, torch.get_num_threads())
    # read_cache drops an entry without a plausible "flops" figure (peak_entry_problem)
    old = _MEASURED.get((key, precision)) or _read_cache().get(key, {}).get(precision) or {}
    if old and not remeasure:
        _MEASURED[(key, precision)] = old
        return old["flops"], old
    meter = LoadMeter()
    probe = probe_matmul(caps.kind, precision, budget_s, announce)
    # A probe that shared its cores with other programs measured the contention, not the hardware: it
    # serves this process, and is neither cached on disk nor trusted beyond this process (#24: a peak
    # cached under load once made MFU and every later prediction absurd).
    loaded = caps.kind == "cpu" and contended(meter.read(), torch.get_num_threads())
    old_flops = old.get("flops", 0)
    entry = dict(probe, probes=(old.get("probes") or 0) + 1, measured=time.strftime("%Y-%m-%d"))
    if old_flops > probe["flops"]:  # a ceiling: a slower probe (under load) never lowers it
        entry.update(flops=old_flops, n=old.get("n"))
    if loaded and not old_flops:
        entry["under_load"] = True  # said in the run's peak source; probed again by the next process
    _MEASURED[(key, precision)] = entry
    if not loaded:
        _write_cache(key, precision, entry)
    return entry["flops"], entry


def _announce(what: str):
    # In a notebook on stdout: stderr would put a one-off note in a pink box as if it were an error
    return lambda: print("[labkit] " + say("measuring", what=what), file=sys.stdout if in_notebook() else sys.stderr,
                         flush=True)


def peak_flops(caps: Capabilities, precision: str, threads: Optional[int] = None) -> tuple:
    """(peak FLOP/s, source) for this device and precision: datasheet if known, else measured (cached).
    ``threads``: the intra-op thread count the run will use (the probe runs with it)."""
    if caps.kind == "cuda":
        value, source = table_peak(caps.name, precision)
        if value:
            return value, source
    used = threads or torch.get_num_threads()
    with intra_op_threads(threads if caps.kind == "cpu" else None):
        value, entry = measured_peak(caps, precision, announce=_announce(caps.kind))
    return value, say("no-datasheet", measured=_measured_words(precision, entry, used), kind=caps.kind,
                      name=caps.name)


def _measured_words(precision: str, entry: dict, threads: int) -> str:
    probes = entry.get("probes", 1)
    load = "; " + say("measured-under-load") if entry.get("under_load") else ""
    return say("measured", probes=counted(probes, "short probe"), precision=precision, n=entry.get("n"),
               threads=counted(threads, "thread")) + load


def slowdown(caps: Capabilities, precision: str) -> Optional[float]:
    """How many times slower than fp32 this precision's matmuls run here (>1 = slower; None on CUDA,
    whose formats come from the datasheet). 50 means bf16/fp16 is emulated in software."""
    if caps.kind == "cuda" or not FORMATS[precision].low:
        return None
    fp32, _ = peak_flops(caps, "fp32")
    low, _ = peak_flops(caps, precision)
    return fp32 / low if low else None


def synchronize(dev) -> None:
    """Wait for queued GPU work: without this a timer measures only how fast work was *queued*."""
    kind = torch.device(dev).type
    if kind == "cuda":
        torch.cuda.synchronize(dev)
    elif kind == "mps":
        torch.mps.synchronize()


def torch_device(kind: str | None = None) -> torch.device:
    """The torch device for a capabilities kind (None: this machine's): on a GPU, the current one."""
    kind = kind or capabilities("auto").kind
    return torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)


@contextlib.contextmanager
def intra_op_threads(n: int | None):
    """Run with ``n`` intra-op threads and put the old count back, also on an error (None or 0: leave it)."""
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def env_report(requested: str = "auto", measure: bool = True, remeasure: bool = False) -> dict:
    """Everything the course needs to know about this machine, as a flat-ish dict. Peaks of a device
    with no datasheet entry come from the cache, or from probes of PROBE_BUDGET_S seconds in all."""
    caps = capabilities(requested)
    out = {"torch_version": torch.__version__, "python": platform.python_version(), **caps.to_dict()}
    out["precisions"] = [p for p in FORMATS if caps.supports(p)]
    peaks = {}
    announce = _announce(caps.kind)
    for p in out["precisions"]:
        value, source = table_peak(caps.name, p) if caps.kind == "cuda" else (None, None)
        if value is None and measure:
            value, entry = measured_peak(caps, p, budget_s=PROBE_BUDGET_S / len(out["precisions"]),
                                         remeasure=remeasure, announce=announce)
            source = _measured_words(p, entry, torch.get_num_threads())
        if value is not None or measure:
            peaks[p] = {"flops": value, "source": source}
    return {**out, "peak_flops": peaks, "fast_formats": fast_formats(caps, peaks),
            "peak_cache": str(cache_dir() / PEAK_CACHE), "cores_from": cpus.usable()[1]}


def fast_formats(caps: Capabilities, peaks: dict) -> list:
    """Formats that really run faster than fp32 here: on a GPU, those its tensor cores serve; on a CPU,
    those *measured* at least 1.2x fp32's peak (a CPU without bf16 units emulates bf16 -- supported, slow)."""
    if caps.kind != "cpu":
        return [p for p in FORMATS if p != "fp32" and caps.supports(p)]
    fp32 = (peaks.get("fp32") or {}).get("flops")
    return [p for p, f in FORMATS.items()
            if f.low and fp32 and ((peaks.get(p) or {}).get("flops") or 0) >= 1.2 * fp32]
