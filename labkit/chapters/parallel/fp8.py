"""FP8 training, predicted only (taught in chapter 10): what it changes, and the arithmetic of its step time and
MFU on an H100/H200 from the catalogue's FP8 peak. Nothing here runs in FP8: a CPU has no FP8 units, and the
chapter's prediction is arithmetic, labelled predicted.

    fp8_compare("llama2-70b", "h100-sxm", 64, dp=4, tp=4, pp=4, zero_stage=1, global_batch=128)
    mfu_both(model_flops, step_s, n_gpus, "h100-sxm")   # the same FLOPs over the bf16 and the FP8 peak
"""
from __future__ import annotations

from ...base.errors import ConfigError
from ...whatif import catalogue
from ...engine.config import real, whole
from .layout import gpu_spec, layouts, published_layouts

__all__ = ["FP8_PUBLISHED", "fp8_peak", "mfu_both", "fp8_compare", "fp8_rows", "fp8_published_check",
           "fp8_here"]

def fp8_peak(gpu: str) -> float:
    """The dense FP8 tensor-core FLOP/s of ``gpu`` (the catalogue's ``fp8_peak_tflops``); a GPU without one is a
    ConfigError naming those that have it."""
    dev = gpu_spec(gpu)
    if not dev["fp8_peak"]:
        have = [k for k, v in catalogue()["devices"].items() if v.get("fp8_peak_tflops")]
        raise ConfigError("gpu", gpu, "a GPU with an FP8 peak in the catalogue: " + ", ".join(have))
    return dev["fp8_peak"]


def mfu_both(model_flops: float, step_s: float, n_gpus: int, gpu: str) -> dict:
    """MFU of the same model FLOPs in ``step_s`` on ``n_gpus``, counted against the bf16 peak and against the
    FP8 peak. The FLOPs do not change with the number format; only the denominator does, so the FP8-peak MFU
    is lower by the peaks' ratio (2× on Hopper)."""
    real("model_flops", model_flops, strict=True)
    real("step_s", step_s, strict=True)
    whole("n_gpus", n_gpus)
    bf16, fp8 = gpu_spec(gpu)["peak"]["bf16"], fp8_peak(gpu)
    achieved = model_flops / step_s / n_gpus
    return {"achieved_flops_per_gpu": achieved, "mfu_bf16_peak": achieved / bf16, "mfu_fp8_peak": achieved / fp8,
            "peak_ratio": fp8 / bf16, "label": "predicted"}


def fp8_compare(model, gpu: str, n_gpus: int, dp: int, tp: int, pp: int, zero_stage: int = 1, **kw) -> dict:
    """One layout's **predicted** step in bf16 and with the linear GEMMs in FP8 (layout's model: attention and
    communication unchanged -- every collective at bf16's bytes, though FSDP2 with torchao's float8 can
    all-gather the weights in FP8, halving that AllGather), and the FP8 run's MFU against both peaks.
    ``checkpointing`` (in ``kw``): the layout's recomputation choice, "none" unless given."""
    fp8_peak(gpu)
    kw.setdefault("checkpointing", "none")
    out = {}
    for prec in ("bf16", "fp8"):
        rows = layouts(model, gpu, n_gpus, zero_stages=(zero_stage,), precision=prec, **kw)
        match = [r for r in rows if (r["dp"], r["tp"], r["pp"], r["zero_stage"]) == (dp, tp, pp, zero_stage)]
        if not match:
            raise ConfigError("layout", (dp, tp, pp, zero_stage), "a layout layouts() lists for this scenario")
        out[prec] = match[0]
    b, f = out["bf16"], out["fp8"]
    model_flops = b["mfu"] * b["step_s"] * n_gpus * gpu_spec(gpu)["peak"]["bf16"]  # the same FLOPs both ways
    return {"bf16": b, "fp8": f, "speedup": b["step_s"] / f["step_s"], "model_flops": model_flops,
            "fp8_mfu": mfu_both(model_flops, f["step_s"], n_gpus, gpu),
            "bf16_mfu": mfu_both(model_flops, b["step_s"], n_gpus, gpu), "label": "predicted"}


def _published_fp8(model: str = "llama2-70b") -> dict:
    """A published FP8 layout from published_layouts.json, in the fields fp8_published_check reads."""
    e = next(e for e in published_layouts() if e["model"] == model and e["precision"] == "fp8")
    keep = ("model", "gpu", "n_gpus", "global_batch", "seq_len", "micro_batch", "dp", "tp", "pp", "vp", "source", "url")
    return {**{k: e[k] for k in keep}, "tokens_per_s_per_gpu": e["published_tokens_per_s_per_gpu"],
            "tflops_per_gpu": e["published_tflops_per_gpu"]}


# A published FP8 measurement of the chapter's own scenario, to set the prediction against (NeMo's table gives
# no bf16 twin of the row, so only the FP8 side can be checked).
FP8_PUBLISHED = _published_fp8()

# The model's optimism (said in the chapter's markdown): FP8 GEMMs are assumed to reach the same fraction of the
# FP8 peak as bf16 GEMMs reach of theirs, and the casts, the amax/scale bookkeeping and the transposed FP8 copies
# backward needs cost nothing.


def fp8_published_check(entry=None) -> dict:
    """The FP8 prediction of a published FP8 layout against its published throughput (predicted / published)."""
    e = dict(entry or FP8_PUBLISHED)
    rows = layouts(e["model"], e["gpu"], e["n_gpus"], global_batch=e["global_batch"], seq_len=e["seq_len"],
                   micro_batch=e["micro_batch"], precision="fp8")
    row = min((r for r in rows if (r["dp"], r["tp"], r["pp"]) == (e["dp"], e["tp"], e["pp"])),
              key=lambda r: (not r["fits"], r["step_s"]))
    tokens = row["tokens_per_s"] / e["n_gpus"]
    return {"entry": e, "row": row, "predicted_tokens_per_s_per_gpu": tokens,
            "predicted_over_published": tokens / e["tokens_per_s_per_gpu"],
            "published_mfu_bf16_peak": e["tflops_per_gpu"] * 1e12 / gpu_spec(e["gpu"])["peak"]["bf16"],
            "label": "predicted"}


def fp8_rows(cmp: dict) -> list:
    """The comparison as a table's rows (all predicted): per format, the step, its compute part, and the MFU of
    the same model FLOPs against the bf16 peak and against the FP8 peak."""
    return [{"format": name, "step_s": cmp[key]["step_s"], "compute_s": cmp[key]["parts"]["compute"],
             "mfu_bf16_peak": cmp[mfu]["mfu_bf16_peak"], "mfu_fp8_peak": cmp[mfu]["mfu_fp8_peak"],
             "label": "predicted"}
            for name, key, mfu in (("bf16", "bf16", "bf16_mfu"), ("FP8 linear layers", "fp8", "fp8_mfu"))]


def fp8_here() -> dict:
    """What this machine's GPU has for FP8 (nothing here runs in FP8: the chapter's FP8 figures are arithmetic,
    predicted): ``verdict`` 'no_gpu', 'no_fp8_units' (compute capability below 8.9: no FP8 tensor cores),
    'no_peak' (FP8 tensor cores, but the catalogue has no FP8 peak for it: nothing says how fast they are) or
    'fp8_units' (FP8 tensor cores with a catalogue peak); ``name`` and ``capability`` ('8.9') where a GPU is."""
    import torch  # deferred: only when asked about this machine's GPU

    if not torch.cuda.is_available():
        return {"verdict": "no_gpu", "name": None, "capability": None}
    cap = torch.cuda.get_device_capability()
    name = torch.cuda.get_device_name()
    out = {"name": name, "capability": f"{cap[0]}.{cap[1]}"}
    if cap < (8, 9):
        return {"verdict": "no_fp8_units", **out}
    return {"verdict": "no_peak" if _catalogue_fp8_peak(name) is None else "fp8_units", **out}


def _catalogue_fp8_peak(name: str):
    """The catalogue's FP8 peak of the device torch names ``name`` (its 'boards' entry), or None."""
    cat = catalogue()
    for board in cat.get("boards", []):
        if name in board.get("names", ()) and board.get("device"):
            dev = cat["devices"].get(board["device"], {})
            return (dev.get("fp8_peak_tflops") or {}).get("value")
    return None
