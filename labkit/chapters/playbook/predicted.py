"""Chapter 09's what-if section (taught in chapter 09): the same toggles of a configuration on GPUs of the
catalogue, **predicted** by ``lk.predict`` (a roofline model; no GPU here measured them), as table rows, and
the figures that say why a tiny model is launch-bound. Every number here is labelled predicted.

    ms = pb.predicted_ms({"fp32": cfg, "bf16": cfg.replace(precision="bf16")}, ("t4", "h100-sxm"))
    display(pb.predicted_table(ms, cfgs))
"""
from __future__ import annotations

from ...base.errors import ConfigError
from ..course import predicted_speedup, table
from .pareto import fixed_digits



def faster(base, new, than: str) -> str:
    """How a predicted time ``new`` compares with ``base``, "3.2× faster than {than}" / "1.4× slower than
    {than}": for predictions only, whose direction is their numbers. A ratio that rounds to 1 reads "about as fast as {than}": "1× faster" reads as a slip."""
    words = predicted_speedup(base, new)
    return f"about as fast as {than}" if words.startswith("1× ") else f"{words} than {than}"


def _predict(config, device):
    from ...whatif import predict  # deferred: the what-if model loads its catalogue and probes on first use
    return predict(config, device=device)


def predicted_ms(cfgs: dict, gpus) -> dict:
    """{configuration: {gpu: predicted ms per update, or None where the GPU refuses its precision}}."""
    out = {}
    for name, c in cfgs.items():
        out[name] = {}
        for g in gpus:
            try:
                out[name][g] = _predict(c, g).step_time_s * 1000
            except ConfigError:  # e.g. bf16 on a T4: no bf16 unit, the prediction refuses rather than guesses
                out[name][g] = None
    return out


def predicted_table(ms: dict, cfgs: dict) -> list:
    """The predicted ms per update (configurations down, GPUs across) as table rows; a GPU without a unit for
    a configuration's precision refused to predict it, and the cell says so rather than leave a blank."""
    if not isinstance(ms, dict) or not ms or not all(name in cfgs for name in ms):
        raise ConfigError("ms", ms, "what predicted_ms returned, for configurations named in cfgs")
    gpus = list(next(iter(ms.values())))
    rows = [{"configuration": name, **{g: (fixed_digits(v) if v is not None else
                                           f"refused (no {cfgs[name].precision} unit)") for g, v in ms[name].items()}}
            for name in ms]
    return table(rows, [("configuration", "configuration", "{}")]
                 + [(g, f"{g}: predicted ms/update", "{}") for g in gpus])


def launch_bound(tiny_cfgs: dict, device: str = "h100-sxm") -> dict:
    """Why a tiny model tells GPUs apart so little, **predicted** on ``device``: the share of the fp32 step that
    is per-operation overhead (``share``), the operations bf16 adds (``extra_ops``: the casts, as CPU autocast
    inserts them -- the trace every prediction uses), and both predicted step times in seconds."""
    if not isinstance(tiny_cfgs, dict) or not {"fp32", "bf16"} <= set(tiny_cfgs):
        raise ConfigError("tiny_cfgs", tiny_cfgs, "{'fp32': Config, 'bf16': Config, ...}")
    p32, p16 = (_predict(tiny_cfgs[p], device) for p in ("fp32", "bf16"))
    return {"share": sum(g.overhead_s for g in p32.groups.values()) / p32.step_time_s,
            "extra_ops": sum(g.n_ops for g in p16.groups.values()) - sum(g.n_ops for g in p32.groups.values()),
            "fp32_s": p32.step_time_s, "bf16_s": p16.step_time_s}
