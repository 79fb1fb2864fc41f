"""Chapter 09's what-if section in words (taught in chapter 09): the same toggles of a configuration on GPUs of
the catalogue, **predicted** by ``lk.predict`` (a roofline model; no GPU here measured them), as a table and
the sentences that read it. Every number here is labelled predicted.

    ms = pb.predicted_ms({"fp32": cfg, "bf16": cfg.replace(precision="bf16")}, ("t4", "h100-sxm"))
    display(pb.predicted_table(ms, cfgs))
"""
from __future__ import annotations

from ...base.errors import ConfigError
from ...engine.model import GPT, n_params
from ..course import Note, predicted_speedup
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


def predicted_table(ms: dict, cfgs: dict) -> Note:
    """The predicted ms per update as a markdown table (configurations down, GPUs across)."""
    gpus = list(next(iter(ms.values())))
    head = ("| configuration | " + " | ".join(f"{g}: predicted ms/update" for g in gpus) + " |\n|---|"
            + "---:|" * len(gpus))
    def cell(name, v):  # a GPU without a unit for the precision refuses: say so rather than leave a blank
        return fixed_digits(v) if v is not None else f"refused (no {cfgs[name].precision} unit)"

    rows = [f"| {name} | " + " | ".join(cell(name, v) for v in ms[name].values()) + " |" for name in ms]
    return Note(head + "\n" + "\n".join(rows))


def big_model_note(big_cfgs: dict, big_ms: dict) -> Note:
    """The headline model's table, and what it predicts: the GPUs differ, and bf16 helps on the H100."""
    big = big_cfgs["fp32"]
    h100_32 = big_ms["fp32"]["h100-sxm"]
    return Note(f"**GPT-2 small's shape** (`{big.model}`: {n_params(GPT(big.spec)):,} parameters, micro-batch "
                f"{big.micro_batch} of {big.spec.seq_len} tokens), **predicted**:\n\n"
                + predicted_table(big_ms, big_cfgs) + "\n\n"
                f"At this size the matmuls dominate the predicted step: the H100 is predicted "
                f"{faster(big_ms['fp32']['t4'], h100_32, 'the T4')} in fp32, and bf16 "
                f"{faster(h100_32, big_ms['bf16']['h100-sxm'], 'fp32')} on the H100 (its bf16 tensor cores have "
                "many times the fp32 peak).")


def launch_bound_note(tiny_cfgs: dict, tiny_ms: dict) -> Note:
    """The tiny model's table, and why it tells the GPUs apart so little: per-operation overhead."""
    tiny32, tiny16 = (_predict(tiny_cfgs[p], "h100-sxm") for p in ("fp32", "bf16"))
    share = sum(g.overhead_s for g in tiny32.groups.values()) / tiny32.step_time_s
    extra_ops = sum(g.n_ops for g in tiny16.groups.values()) - sum(g.n_ops for g in tiny32.groups.values())
    return Note(
        "The tiny model of the check above, **predicted**:\n\n" + predicted_table(tiny_ms, tiny_cfgs) + "\n\n"
        f"For the tiny model {share:.0%} of the predicted H100 step is per-operation overhead — the fixed cost of "
        "launching each of its few hundred small kernels, about the same on every GPU — so more arithmetic barely "
        f"helps (the H100 is predicted {faster(tiny_ms['fp32']['t4'], tiny_ms['fp32']['h100-sxm'], 'the T4')}). "
        f"bf16 adds {extra_ops} operations (the casts as CPU autocast inserts them, which the trace uses for every "
        "prediction; CUDA autocast's cast lists differ, so a GPU run's count can differ), each paying that "
        f"overhead, and has almost no arithmetic to save at this size: predicted "
        f"{faster(tiny32.step_time_s, tiny16.step_time_s, 'fp32')} on the H100. A launch-bound model tells you "
        "nothing about a GPU's arithmetic: compare GPUs on a model that fills them.")

