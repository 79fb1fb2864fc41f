"""The GPU catalogue (``labkit/whatif/devices.json``, read by path: the engine never imports
whatif): every board's dense datasheet FLOP/s, what the course does on each GPU (``plan``), and the
checks of the cache files that keep what this machine measured instead.

Its "boards" name each GPU as ``torch.cuda.get_device_name()`` reports it, with the figures its
document prints ("quote"). Peaks are DENSE (never 2:4-sparse): "fp16"/"bf16"/"tf32" are tensor-core
figures with fp32 accumulate, "fp32" the plain one. The free GPUs learners get (Colab's T4, Kaggle's
T4 × 2; an L4) differ from the A100/H100 the course was written on: on a T4 no bf16 units, no flash
attention (sm 8.0+), no TF32. The P100 is not one of them any more: current PyTorch builds have no
sm 6.0 kernels, so it is refused in one line (``kernel_refusal``) and the course runs on the CPU.
Each decision is read from the catalogue and what torch reports, never from a name in a chapter.
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import torch

from ..base import phrases
from ..base.runtime import ConfigError
from ..base.numfmt import is_number
from ..base.paths import cache_dir, read_json, write_json_atomic

TB = 1e12
CATALOGUE_FILE = Path(__file__).resolve().parent.parent / "whatif" / "devices.json"
PEAK_CACHE = "peak_flops.json"  # this machine's measured matmul peaks, in cache_dir() (see device.measured_peak)
_HALVED = "; tensor-core figures are its with-sparsity numbers halved"


@functools.lru_cache(maxsize=1)
def catalogue() -> dict:
    """The parsed ``devices.json``: {"sources": {...}, "boards": [...], "devices": {key: {...}}}."""
    return read_json(CATALOGUE_FILE, what="device catalogue")


def value(entry) -> Optional[float]:
    """The number of a catalogue field: ``{"value": 989.5, "source": ...}`` or a bare number."""
    return entry.get("value") if isinstance(entry, dict) else entry


def board_peaks(board: dict) -> dict:
    """{format: dense TFLOP/s} of one board, only the formats it has a unit for (in the file's order)."""
    entries = board.get("peak_tflops") or catalogue()["devices"][board["device"]]["peak_tflops"]
    return {p: value(e) for p, e in entries.items() if value(e) is not None}


def board_source(board: dict) -> str:
    """The document of one board's peaks and the figures it prints, in words a reader can check."""
    title, quote = catalogue()["sources"][board["source"]]["title"], board["quote"]
    words = f"{title}{' ' if quote.startswith('(') else ', '}{quote}"
    # a quote with only with-sparsity figures ("1,979*"): the peaks are those halved, and the row says so
    return words + (_HALVED if "*" in quote and "|" not in quote else "")


# [(names torch reports, {format: dense TFLOP/s}, source)], in the file's order (notebook 01)
PEAK_TABLE = [(tuple(b["names"]), board_peaks(b), board_source(b)) for b in catalogue()["boards"]]


def table_peak(name: str, precision: str):
    """(FLOP/s, source) from the datasheet table for an exact device name, or (None, None)."""
    for names, peaks, source in PEAK_TABLE:
        if name in names and precision in peaks:
            return peaks[precision] * TB, source
    return None, None


# The SDPA backends' hardware checks, from PyTorch's aten/src/ATen/native/transformers/cuda/sdp_utils.cpp
# (read at commit 001f694a): check_flash_attention_hardware_support and check_cudnn_hardware_support accept
# [sm80, sm121] (check_sm_version<sm80, sm121>), check_mem_efficient_hardware_support [sm50, sm121]; math has
# no hardware check. Below sm 8.0 the memory-efficient kernel takes fp16 and fp32 only (no bf16).
SDPA_MIN_SM = {"math": None, "flash": (8, 0), "efficient": (5, 0), "cudnn": (8, 0)}
# The plans' sentences: the "## GPU plans" section of notebooks/lab_messages.md.
WORDS = phrases.load_section("lab_messages.md", "GPU plans", {
    "kaggle-hint": (), "plan-head": ("name", "arch", "gb", "n", "world"), "plan-low": ("format", "scaler", "why"),
    "with-scaler": (), "tf32-yes": (), "tf32-no": (), "unknown-arch": (), "sdpa-no-cc": ("who",),
    "sdpa-kernels": ("who", "sm", "said"), "sdpa-no-flash": (), "refusal": ("version", "built", "name", "sm", "hint"),
    "low-bf16": ("who", "cores"), "low-fp16-tensor": ("who",), "low-fp16-cuda": ("who",),
    "fp16-note": ("short", "fp16", "ratio", "fp32")})
say = WORDS.say
KAGGLE_HINT = say("kaggle-hint")


@dataclass(frozen=True)
class GpuPlan:
    """What the course does on one GPU (``plan``): every field a decision, every ``*_why`` its sentence."""

    device: str                     # catalogue key
    name: str
    arch: Optional[str]
    compute_capability: Optional[str]
    low_precision: str              # "bf16" where the catalogue has bf16 units, else "fp16"
    loss_scaling: bool              # fp16 needs a GradScaler
    low_precision_why: str
    tf32: bool
    sdpa_backends: tuple
    sdpa_why: str
    runnable: bool                  # this PyTorch build ships kernels for the device
    refusal: Optional[str]          # one line when it does not
    fp16_note: Optional[str]
    n_gpus: int
    world_size: int                 # chapter 06: real NCCL DDP at 2 when two GPUs are visible
    memory_gb: float

    def summary(self) -> str:
        """A few lines for a learner: formats, attention kernels, processes, and what cannot run."""
        lines = [say("plan-head", name=f"**{self.name}**", arch=_arch_words(self.arch, self.compute_capability),
                     gb=f"{self.memory_gb:g}", n=self.n_gpus, world=self.world_size),
                 "- " + say("plan-low", format=f"**{self.low_precision}**", why=self.low_precision_why,
                            scaler=" " + say("with-scaler") if self.loss_scaling else ""),
                 f"- TF32: {say('tf32-yes' if self.tf32 else 'tf32-no')}", f"- attention: {self.sdpa_why}"]
        lines += [f"- {text}" for text in (self.fp16_note, self.refusal) if text]
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        return self.summary()

    def __str__(self) -> str:
        return self.summary().replace("**", "")


# ---- the facts, one function each ------------------------------------------------------------------

def _sm(text) -> Optional[tuple]:
    """"7.5" -> (7, 5); None stays None (no CUDA compute capability: an AMD GPU)."""
    return None if text is None else tuple(int(x) for x in str(text).split("."))


def _arch_words(arch, cc) -> str:
    return ", ".join(w for w in (arch, f"sm {cc}" if cc else None) if w) or say("unknown-arch")


def _short(name: str) -> str:
    """The chip in a catalogue name: "NVIDIA T4 (16 GB, PCIe)" -> "T4", "NVIDIA GeForce RTX 4090 (24 GB)" -> "RTX 4090"."""
    for word in ("NVIDIA ", "Tesla ", "AMD Instinct ", "GeForce "):
        name = name.replace(word, "")
    words = name.split(" (")[0].split()
    return " ".join(words[:2] if words[0] == "RTX" else words[:1])


def _a(word: str) -> str:
    """The article as the letter is spoken: an A100, an H100, an L4, an MI300X; a T4, a P100, a V100."""
    return ("an " if word[:1].upper() in "AEFHILMNORSX" else "a ") + word


def board_key(name: str) -> Optional[str]:
    """The catalogue device key of a board as ``torch.cuda.get_device_name()`` names it, or None."""
    return next((b["device"] for b in catalogue()["boards"] if name in b["names"] and "device" in b), None)


def sdpa_backends(sm: Optional[tuple]) -> tuple:
    """The SDPA backends PyTorch's CUDA build can run at compute capability ``sm`` (chapter 07's names, in
    its order); math alone where no CUDA compute capability is known."""
    if sm is None:
        return ("math",)
    return tuple(b for b, low in SDPA_MIN_SM.items() if low is None or sm >= low)


def _sdpa_why(who: str, sm: Optional[tuple], backends: tuple) -> str:
    if sm is None:
        return say("sdpa-no-cc", who=f"{who[0].upper()}{who[1:]}")
    names = {"flash": "flash", "efficient": "memory-efficient", "cudnn": "cuDNN"}
    said = ", ".join(names[b] for b in backends if b in names)
    said = f"{said} and math" if said else "math"
    out = say("sdpa-kernels", who=who, sm=f"{sm[0]}.{sm[1]}", said=said)
    if "flash" not in backends:
        out += "; " + say("sdpa-no-flash")
    return out + "."


def ships_kernels(sm: tuple, arch_list) -> bool:
    """Whether a build compiled for ``arch_list`` (``torch.cuda.get_arch_list()``) runs on compute capability
    ``sm``: a cubin ``sm_XY`` runs on the same major at the same or a later minor (torch's own
    ``_check_cubins`` reads it so: sm_86 code serves an sm 8.9 L4); ``sm_XYa`` only on exactly XY; PTX
    ``compute_XY`` is compiled by the driver for any device at or above XY. An empty list (a build that
    does not say) is taken as runnable."""
    if not arch_list:
        return True
    cc = 10 * sm[0] + sm[1]
    for arch in arch_list:
        kind, _, code = str(arch).partition("_")
        digits = code.rstrip("af")
        if not digits.isdigit():
            continue
        num = int(digits)
        if kind == "compute" and num <= cc:
            return True
        if kind == "sm" and (num == cc if code.endswith("a") else num // 10 == sm[0] and num <= cc):
            return True
    return False


def kernel_refusal(name: str, sm: Optional[tuple], arch_list, torch_version: Optional[str]) -> Optional[str]:
    """One line when this PyTorch build ships no kernel for the device (its first CUDA op would fail), else None."""
    if sm is None or ships_kernels(sm, arch_list):
        return None
    sms = [a for a in arch_list if str(a).startswith("sm_")] or list(arch_list)
    built = sms[0] if len(sms) == 1 else f"{sms[0]} … {sms[-1]}"
    version = (torch_version or torch.__version__).split("+")[0]
    return say("refusal", version=version, built=built, name=name, sm=f"{sm[0]}.{sm[1]}", hint=KAGGLE_HINT)


def world_size(n_gpus: int) -> int:
    """Chapter 06's world size on GPUs: 2 (real NCCL DDP) when two or more are visible, else 1."""
    return 2 if n_gpus >= 2 else 1


# ---- the plan ----------------------------------------------------------------------------------------

def _entry(device_key) -> dict:
    devices = catalogue()["devices"]
    if not isinstance(device_key, str) or device_key not in devices:
        close = difflib.get_close_matches(device_key, list(devices), n=1) if isinstance(device_key, str) else []
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError("device_key", device_key, hint + "choose one of " + ", ".join(devices))
    return devices[device_key]


def _low_precision_why(who: str, d: dict) -> str:
    units, tensor = d["hardware_units"], value(d.get("tensor_cores"))
    if units["bf16"]:
        cores = "matrix cores" if d.get("vendor") == "amd" else "tensor cores"
        return say("low-bf16", who=who, cores=cores)
    return say("low-fp16-tensor" if tensor else "low-fp16-cuda", who=who)


def _fp16_note(short: str, d: dict) -> Optional[str]:
    """Where the fp16 datasheet rate is CUDA-core fp16 (no tensor cores) at 2x fp32 or more: that rate
    accumulates in fp16, PyTorch's fp16 matmuls accumulate in fp32, so fp16 may gain little there."""
    fp16, fp32 = value(d["peak_tflops"]["fp16"]), value(d["peak_tflops"]["fp32"])
    if value(d.get("tensor_cores")) or not fp16 or not fp32 or fp16 < 2 * fp32:
        return None
    return say("fp16-note", short=short, fp16=f"{fp16:g}", ratio=f"{fp16 / fp32:.0f}", fp32=f"{fp32:g}")


def plan(device_key: str, *, n_gpus: int = 1, arch_list: list | None = None,
         torch_version: str | None = None) -> GpuPlan:
    """The course's decisions for ``n_gpus`` of the catalogue device ``device_key`` under a PyTorch build
    compiled for ``arch_list`` (None: not known, taken as runnable) -- on any machine, no GPU needed."""
    d = _entry(device_key)
    if not isinstance(n_gpus, int) or isinstance(n_gpus, bool) or n_gpus < 1:
        raise ConfigError("n_gpus", n_gpus, "an integer >= 1 (the GPUs visible to one machine)")
    arch, cc = value(d.get("arch")), value(d.get("compute_capability"))
    sm, short = _sm(cc), _short(d["name"])
    who = f"{_a(short)} ({_arch_words(arch, cc)})"
    low = "bf16" if d["hardware_units"]["bf16"] else "fp16"
    backends = sdpa_backends(sm)
    refusal = kernel_refusal(short, sm, arch_list, torch_version)
    return GpuPlan(device=device_key, name=d["name"], arch=arch, compute_capability=cc, low_precision=low,
                   loss_scaling=low == "fp16", low_precision_why=_low_precision_why(who, d),
                   tf32=bool(d["hardware_units"]["tf32"]), sdpa_backends=backends,
                   sdpa_why=_sdpa_why(_a(short), sm, backends), runnable=refusal is None, refusal=refusal,
                   fp16_note=_fp16_note(short, d), n_gpus=n_gpus, world_size=world_size(n_gpus),
                   memory_gb=float(value(d["memory_gb"])))


# ---- the visible GPU ---------------------------------------------------------------------------------

def _reported_gb() -> Optional[float]:
    try:
        return torch.cuda.get_device_properties(0).total_memory / 1e9
    except Exception:  # noqa: BLE001 -- a board torch cannot describe keeps the catalogue's figure
        return None


def current_plan() -> Optional[GpuPlan]:
    """The plan of visible CUDA device 0 (its board name through the catalogue's boards, this build's arch
    list, the device count); None without CUDA or for a board the catalogue does not know."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    key = board_key(name)
    if key is None:
        return None
    p = plan(key, n_gpus=max(1, torch.cuda.device_count()), arch_list=torch.cuda.get_arch_list(),
             torch_version=torch.__version__)
    refusal = kernel_refusal(name, _sm(p.compute_capability), torch.cuda.get_arch_list(), torch.__version__)
    reported = _reported_gb()  # a 12 GB P100 or a 16 GB V100 shares its catalogue entry with a larger board
    memory = min(p.memory_gb, reported) if reported else p.memory_gb
    return replace(p, name=name, refusal=refusal, runnable=refusal is None, memory_gb=round(memory, 1))


def current_refusal() -> Optional[str]:
    """The missing-kernel line for visible device 0, known to the catalogue or not (None: it can run)."""
    sm = tuple(torch.cuda.get_device_capability(0))
    return kernel_refusal(torch.cuda.get_device_name(0), sm, torch.cuda.get_arch_list(), torch.__version__)


def _bf16_native() -> Optional[bool]:
    """``torch.cuda.is_bf16_supported(including_emulation=False)``, or None where the keyword is missing."""
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch < 2.3: the plain call counts emulation (True on a T4), so it is not asked
        return None


def fast_units(name: str, sm: tuple) -> tuple:
    """(bf16, tf32) units of a CUDA board: the catalogue's hardware_units when it knows the board; else
    compute capability 8.0+ (both arrived with Ampere), and for bf16 torch's no-emulation answer too."""
    key = board_key(name)
    if key is not None:
        units = catalogue()["devices"][key]["hardware_units"]
        return bool(units["bf16"]), bool(units["tf32"])
    ampere = tuple(sm) >= (8, 0)
    native = _bf16_native()
    return (ampere if native is None else ampere and native), ampere


def precision_refusal(name: str, cc: Optional[str], precision: str) -> str:
    """What a GPU without bf16/tf32 units says when asked for one: the plan's words where the catalogue knows
    the board, always with the compute capability and what it needs."""
    key = board_key(name)
    need = f"compute capability {cc}; {precision} needs 8.0 or newer"
    if key is None:
        return (f"{name} has {need} (torch.cuda.is_bf16_supported() says True here only through slow emulation). "
                "Use fp16 with loss scaling, or fp32")
    p = plan(key)
    if precision == "tf32":
        return f"{_a(_short(p.name))} has no TF32 tensor cores ({need}). Use fp32, or fp16 with loss scaling"
    return f"{p.low_precision_why} ({need}). Use fp16 with loss scaling, or fp32"


# ---- measured instead: the cache files (measured peaks here, the roofline's probes in labkit.whatif) -------

# No device multiplies slower than a MFLOP/s or faster than 10 PFLOP/s dense (the fastest datasheet figure in
# devices.json is a few PFLOP/s): a cached peak outside this range was planted or damaged, not measured.
FLOPS_RANGE = (1e6, 1e16)
_SAID: set = set()  # (cache file, problem) already said by this process


def figure_problem(name: str, v, lo: float = 0.0, hi: float = math.inf, lo_open: bool = False) -> Optional[str]:
    """Why ``v`` is not a cached figure within [lo, hi] (``lo_open``: above lo), in words; None when it is."""
    if not is_number(v) or not math.isfinite(v):
        return f"{name}={v!r} is not a finite number"
    if v < lo or (lo_open and v == lo) or v > hi:
        return f"{name}={v:g} is outside {'(' if lo_open else '['}{lo:g}, {hi:g}]"
    return None


def peak_entry_problem(entry) -> Optional[str]:
    """Why one measured peak ({"flops", "n", "probes", ...}) cannot be used, in words; None when it can."""
    if not isinstance(entry, dict):
        return f"a peak is {type(entry).__name__}, not an object"
    problem = figure_problem("flops", entry.get("flops"), *FLOPS_RANGE)
    for k in ("n", "probes"):
        v = entry.get(k)
        if problem is None and v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            problem = f"{k}={v!r} is not a count"
    return problem


def _peak_key_problem(value) -> Optional[str]:
    """Why one key of peak_flops.json ({precision: peak entry}) cannot be used; None when it can."""
    if not isinstance(value, dict):
        return f"an entry is {type(value).__name__}, not an object of formats"
    return next((f"{p}: {problem}" for p, e in value.items() if (problem := peak_entry_problem(e))), None)


# ---- what an entry of the what-if probe cache (roofline_probe.json, whatif/probes.py) may hold:
# a planted or damaged one (a wrong type or shape, a non-finite or absurd figure) is measured again

BANDWIDTH_MAX = 1e14  # bytes/s: 100 TB/s, beyond any memory a probe could stream from
_SECONDS = ("op_overhead_s", "update_overhead_s", "small_step_s", "sample_overhead_s")
# {key: (what each value is, its range, whether 0 is excluded)}: a view op may time at 0 s, no rate is 0; a
# tiny matmul shape may run far below the peak, so only a peak has a floor
_RATE_MAPS = {"shape_rates": ("a shape's FLOP/s", (0.0, FLOPS_RANGE[1]), True),
              "peaks_checked": ("a checked peak", FLOPS_RANGE, True),
              "op_times": ("an op's seconds", (0.0, 3600.0), False)}


def _curve_problem(entry: dict) -> "str | None":
    """The bandwidth curve ([[bytes, bytes/s], ...]) and the figures this_device reads beside it."""
    curve = entry["curve"]
    if not isinstance(curve, list) or not all(isinstance(pt, list) and len(pt) == 2 for pt in curve):
        return "curve is not a list of [bytes, bytes/s] pairs"
    checks = [c for x, y in curve for c in (("curve bytes", x, math.inf), ("curve bytes/s", y, BANDWIDTH_MAX))]
    checks.append(("bytes_per_s", entry.get("bytes_per_s"), BANDWIDTH_MAX))
    problem = next((p for name, v, hi in checks if (p := figure_problem(name, v, 0, hi, True))), None)
    return problem or figure_problem("sample_overhead_s", entry.get("sample_overhead_s"), 0, 3600)


def probe_entry_problem(entry) -> "str | None":
    """Why one entry of roofline_probe.json cannot be used (a wrong type or shape, a non-finite or absurd
    figure), in words; None when it can. A bandwidth curve comes with the figures read beside it."""
    if not isinstance(entry, dict):
        return f"an entry is {type(entry).__name__}, not an object"
    if "curve" in entry and (problem := _curve_problem(entry)):
        return problem
    for k in _SECONDS:
        if k in entry and (problem := figure_problem(k, entry[k], 0, 3600)):
            return problem
    for k, (words, (lo, hi), lo_open) in _RATE_MAPS.items():
        m = entry.get(k)
        if m is None:
            continue
        if not isinstance(m, dict):
            return f"{k} is {type(m).__name__}, not an object of {words}"
        problem = next((p for n, v in m.items() if (p := figure_problem(f"{k}[{n!r}]", v, lo, hi, lo_open))), None)
        if problem:
            return problem
    if "quiet" in entry and not isinstance(entry["quiet"], bool):
        return f"quiet={entry['quiet']!r} is not true or false"
    return None


_CHECKS = {PEAK_CACHE: _peak_key_problem}  # the peak cache checks itself; the probe cache passes its own


def read_cache(name: str, what: str, entry_problem: Optional[Callable] = None) -> dict:
    """The JSON object in ``cache_dir() / name`` ({} when missing, damaged or not an object: measure
    again), the one reader of labkit's measurement caches. An entry ``entry_problem`` (default: the
    peak cache's own check) finds a problem with is dropped -- measured again -- and said once."""
    path = cache_dir() / name
    try:
        data = read_json(path, what=what)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        _say_dropped(path, what, f"not an object ({type(data).__name__})")
        return {}
    check = entry_problem or _CHECKS.get(name)
    if check is None:
        return data
    problems = {key: check(value) for key, value in data.items()}
    for problem in filter(None, problems.values()):
        _say_dropped(path, what, problem)
    return {key: value for key, value in data.items() if not problems[key]}


def _say_dropped(path, what: str, problem: str) -> None:
    if (str(path), problem) not in _SAID:
        _SAID.add((str(path), problem))
        print(f"[labkit] {what} {path}: {problem}; not used, measuring again", file=sys.stderr, flush=True)


def write_cache(name: str, data: dict) -> None:
    """Replace ``cache_dir() / name`` with ``data``, atomically: a DDP rank reading at the same moment sees
    old or new, and a full disk leaves no temp file. A cache that cannot be written (full, read-only, a
    folder in its place) is skipped: the value still lives in the process that measured it."""
    with contextlib.suppress(OSError, ValueError):
        write_json_atomic(cache_dir() / name, data, sort_keys=True)
