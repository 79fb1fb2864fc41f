"""What one GPU can and cannot do for this course, decided from its catalogue entry: ``plan(device_key)``.

The free GPUs learners get (Colab's T4, Kaggle's T4 × 2; an L4 where a platform offers one) differ from the
A100/H100 the course was written on in ways that change a run: on a T4 no bf16 units (fp16 with a GradScaler
instead), no flash attention (sm 8.0+), no TF32. The P100 is not one of them any more: current PyTorch
builds (CUDA 12.8 and later, what Kaggle's image ships) have no sm 6.0 kernels, so on such a build it is
refused in one line (``kernel_refusal``) and the course runs on the CPU. Each of those is read here from
the device catalogue (``labkit/whatif/devices.json``: hardware_units, peak_tflops, arch, compute_capability,
tensor_cores) plus facts torch reports (arch list, device count), never from a name in a chapter. Nothing
here touches a GPU, so every decision can be tested on a CPU. ``device`` asks this module what the visible
GPU can do; ``precision`` takes its words.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from typing import Optional

import torch

from ..base import phrases
from ..base.runtime import ConfigError
from .peaks import catalogue, value

__all__ = ["GpuPlan", "plan", "current_plan", "board_key", "sdpa_backends", "ships_kernels", "kernel_refusal",
           "current_refusal", "fast_units", "world_size", "precision_refusal"]

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
    if text is None:
        return None
    major, minor = str(text).split(".")
    return int(major), int(minor)


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
        exact = code.endswith("a")
        num = int(code.rstrip("af")) if code.rstrip("af").isdigit() else None
        if num is None:
            continue
        if kind == "compute" and num <= cc:
            return True
        if kind == "sm" and (num == cc if exact else (num // 10 == sm[0] and num <= cc)):
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
