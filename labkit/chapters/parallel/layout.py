"""Choosing a DP x TP x PP (x ZeRO) layout for a fixed number of GPUs, taught in chapter 10: every layout that
obeys the rules, its bytes per GPU, whether it fits, and a **predicted** step time -- arithmetic only, nothing
here runs on a GPU.

    rows = layouts("llama2-70b", "h100-sxm", 64, node_size=8, interconnect="infiniband", global_batch=128)
    best = best_layout(rows)                     # the fastest that fits, or None
    choice(rows)                                 # the pick and why, as figures (the chapter words them)

The step-time model (every figure predicted, none measured, no overlap assumed) is in ``layout_model``: read
its docstring for what is charged and what is not. A learner's layout is judged by ``labkit.check.parallel``'s
``check_layout`` (its hints live with the checkers).
"""
from __future__ import annotations

from pathlib import Path

from ...base.errors import ConfigError
from ...base.paths import read_json
from ...whatif import catalogue
from ...whatif.roofline import LINKS
from .layout_model import (CHECKPOINTING, GB, INTERCONNECTS, MAX_GPUS, MAX_ZERO_WITH_PP, PARTS,  # noqa: F401
                           PRECISIONS, _check_scenario, _divisors, _row, gpu_spec)
from .shapes import MODELS, Shape, flops_per_token, model_shape, n_params_of  # re-exported: the contract's names

__all__ = ["Shape", "MODELS", "model_shape", "n_params_of", "flops_per_token", "gpu_spec", "layouts",
           "best_layout", "choose", "choice", "layout_widget", "PART_NAMES",
           "published_layouts", "published_check", "published_rows", "published_verdict", "INTERCONNECTS",
           "PRECISIONS", "PARTS"]


def layouts(model, gpu: str, n_gpus: int, node_size: int = 8, interconnect: str = "infiniband",
            global_batch: int | None = None, seq_len: int | None = None, micro_batch: int = 1,
            zero_stages=(0, 1, 2, 3), precision: str = "bf16", checkpointing=CHECKPOINTING,
            even_stages: bool = True) -> list:
    """Every DP x TP x PP (x ZeRO stage) of ``n_gpus`` that obeys the rules, fastest predicted first:
    tp divides the heads, the K/V heads (grouped-query attention) and the node (a TP group stays in one node: its
    4 AllReduces per block and micro-batch need the node's own link); pp divides the layers (``even_stages=False``
    allows uneven stages: the deepest sets the pace); dp x micro_batch divides the global batch (in sequences;
    default 2 x n_gpus x micro_batch) into m >= pp micro-batches per DP rank (1F1B's pipeline must fill).
    ZeRO stages other than 0 only where dp > 1, and only 0 or 1 where pp > 1 (DeepSpeed's and Megatron's
    rule; PyTorch's FSDP + PP holds ZeRO-1's bytes during a step: ``layout_model``'s docstring).
    ``checkpointing``: "none", "full"
    (activation recomputation) or both (the default: each layout once without and once with, ranked together).
    Each row: bytes per GPU, fits, a **predicted** step time."""
    shape, dev, gb, stages, cks = _check_scenario(model, gpu, n_gpus, node_size, interconnect, global_batch, seq_len,
                                             micro_batch, zero_stages, precision, checkpointing)
    T = seq_len or shape.seq_len
    rows = []
    for tp in _divisors(n_gpus):
        if shape.n_head % tp or shape.kv_heads % tp or tp > node_size or node_size % tp:
            continue
        for pp in _divisors(n_gpus // tp):
            if pp > shape.n_layer or (even_stages and shape.n_layer % pp):
                continue
            dp = n_gpus // (tp * pp)
            if gb % (dp * micro_batch) or gb // (dp * micro_batch) < pp:
                continue
            allowed = stages if dp > 1 else (0,)
            for zero in (z for z in allowed if pp == 1 or z <= MAX_ZERO_WITH_PP):
                for ck in cks:
                    rows.append(_row(shape, dev, n_gpus, node_size, LINKS[interconnect], gb, T, micro_batch, dp,
                                     tp, pp, zero, precision, ck))
    rows.sort(key=lambda r: (not r["fits"], r["step_s"]))
    return rows


def best_layout(rows: list):
    """The fastest predicted layout that fits (None when none does)."""
    fit = [r for r in rows if r["fits"]]
    return min(fit, key=lambda r: r["step_s"]) if fit else None


def _name(r) -> str:
    rc = ", full recomputation" if r.get("checkpointing") == "full" else ""
    return f"DP {r['dp']} × TP {r['tp']} × PP {r['pp']}, ZeRO-{r['zero_stage']}{rc}"


TIE = 0.02   # two predicted steps closer than this are a tie: the model's assumptions move it by more

# a part of the predicted step, as a table's cell or a sentence names it
PART_NAMES = {"compute": "compute", "bubble": "the pipeline bubble", "tp_comm": "TP AllReduces",
              "pp_p2p": "pipeline sends", "dp_comm": "DP traffic", "optimizer": "the optimizer"}


def _figures(r) -> dict:
    """One row's figures as a choice quotes them: its name, step (s), MFU (%), and its bytes in GB."""
    s = r["states"]
    return {"name": _name(r), "step_s": r["step_s"], "mfu_pct": round(100 * r["mfu"]),
            "state_gb": r["state_bytes"] / GB, "params_gb": s["params"] / GB, "grads_gb": s["grads"] / GB,
            "optimizer_gb": s["optimizer"] / GB, "act_gb": r["activation_bytes"] / GB,
            "total_gb": r["bytes_per_gpu"] / GB, "usable_gb": r["usable_bytes"] / GB,
            "recomputed": r.get("checkpointing") == "full"}


def choice(rows: list) -> dict:
    """The pick and why, as figures (the chapter words them): ``verdict`` is 'no_layout' (no layout obeys the
    rules), 'none_fits' (the smallest layout, whose figures follow, needs more than a GPU has),
    'none_fits_recomputed' (the same, the smallest recomputing already) or 'fits' (the fastest that fits, its
    figures). With a fit, ``runner_up`` is 'tie' (the fastest other dp x tp x pp is within ``TIE``: this model
    cannot tell them apart), 'faster' (the pick wins by more) or None (no other split fits), with ``ru_name``,
    ``ru_step_s``, ``ratio`` (runner-up over pick), ``gap_pct``, ``tie_pct`` and the part that differs most:
    ``part`` (a ``PARTS`` key), ``part_name``, ``part_s`` (the pick's seconds in it), ``ru_part_s``."""
    best = best_layout(rows)
    if best is None:
        if not rows:
            return {"verdict": "no_layout", "runner_up": None}
        least = _figures(min(rows, key=lambda r: r["bytes_per_gpu"]))
        return {"verdict": "none_fits_recomputed" if least["recomputed"] else "none_fits", "runner_up": None, **least}
    out = {"verdict": "fits", "runner_up": None, **_figures(best)}
    shape_of = lambda r: (r["dp"], r["tp"], r["pp"])  # noqa: E731 -- the runner-up is another split, not a ZeRO stage
    fit = [r for r in rows if r["fits"] and shape_of(r) != shape_of(best)]
    if fit:
        ru = min(fit, key=lambda r: r["step_s"])  # the fastest other dp x tp x pp
        diff = {k: ru["parts"][k] - best["parts"][k] for k in PARTS}
        k = max(diff, key=diff.get)
        ratio = ru["step_s"] / best["step_s"]
        out.update(runner_up="tie" if ratio - 1 < TIE else "faster", ru_name=_name(ru), ru_step_s=ru["step_s"],
                   ratio=ratio, gap_pct=100 * (ratio - 1), tie_pct=round(100 * TIE), part=k,
                   part_name=PART_NAMES[k], part_s=best["parts"][k], ru_part_s=ru["parts"][k])
    return out


def choose(model, gpu: str, n_gpus: int, **kw) -> dict:
    """``layouts`` then ``choice``: the fastest predicted layout that fits, and the figures of why."""
    return choice(layouts(model, gpu, n_gpus, **kw))


# The chapter's example, and exercise-10-layout-fits' scenario: Llama 2 70B on 64 H100s in 8 nodes of 8,
# InfiniBand between nodes, 128 sequences of 4,096 tokens per step, micro-batch 1.
EXAMPLE_SCENARIO = dict(model="llama2-70b", gpu="h100-sxm", n_gpus=64, node_size=8, interconnect="infiniband",
                        global_batch=128, seq_len=4096, micro_batch=1)


# ---- the widget ---------------------------------------------------------------------------------------

WIDGET_MODELS = ("llama2-70b", "llama3-70b", "gpt3-175b", "llama3-405b", "large", "base")


def layout_widget(draw=None, model: str = "llama2-70b", gpu: str = "h100-sxm", n_gpus: int = 64,
                  node_size: int = 8, interconnect: str = "infiniband", **kw):
    """An ipywidgets control: model, GPU, GPU count, node size, interconnect; at each change it computes the
    layouts and calls ``draw(rows)`` (the chapter's function: its table and words) inside its output area. The
    returned box carries ``.view()`` -> the rows of its current values, so a test (or a notebook without a
    front end) reads what it would draw."""
    import ipywidgets as w  # deferred: ipywidgets loads only to draw the widget

    if draw is not None and not callable(draw):
        raise ConfigError("draw", draw, "a function of the rows (it shows them), or None")
    view = layouts(model, gpu, n_gpus, node_size=node_size, interconnect=interconnect, **kw)  # checks first
    style = {"description_width": "initial"}
    ctl = {"model": w.Dropdown(options=list(dict.fromkeys((model,) + WIDGET_MODELS)), value=model,
                               description="model", style=style),
           "gpu": w.Dropdown(options=list(catalogue()["devices"]), value=gpu, description="GPU", style=style),
           "n_gpus": w.Dropdown(options=sorted({8, 16, 32, 64, 128, 256, 512, 1024, n_gpus}), value=n_gpus,
                                description="GPUs", style=style),
           "node_size": w.Dropdown(options=sorted({4, 8, node_size}), value=node_size, description="per node",
                                   style=style),
           "interconnect": w.Dropdown(options=list(INTERCONNECTS), value=interconnect, description="between nodes",
                                      style=style)}
    out = w.Output()
    box = w.VBox([w.HBox(list(ctl.values())[:3]), w.HBox(list(ctl.values())[3:]), out])
    state = {"view": view}

    def current():
        return layouts(ctl["model"].value, ctl["gpu"].value, ctl["n_gpus"].value,
                       node_size=ctl["node_size"].value, interconnect=ctl["interconnect"].value, **kw)

    def redraw(_=None):
        out.clear_output()
        with out:
            try:
                state["view"] = current()
            except ConfigError as e:  # e.g. node size not dividing the GPU count: say so, keep the controls
                state["view"] = []
                print(e)
                return
            if draw is not None:
                draw(state["view"])

    for c in ctl.values():
        c.observe(redraw, names="value")
    redraw()
    box.view = lambda: state["view"]
    box.controls = ctl
    return box


# ---- published layouts --------------------------------------------------------------------------------

PUBLISHED_FILE = Path(__file__).resolve().parent / "published_layouts.json"  # shipped as package data


def published_layouts() -> list:
    """Layouts that teams published for a GPU count (read from ``published_layouts.json``), each with its citation
    (``source``, short: ``cite``, ``url``) and, for maintainers, how far its figures were checked (``verified``:
    the provenance, not shown in the chapter). A fresh list each call."""
    return read_json(PUBLISHED_FILE, what="published layouts")["layouts"]


def published_check(entries=None) -> list:
    """For each published layout: its rank among the rows that fit (the best ZeRO stage and recomputation choice of
    its dp x tp x pp, the source not saying which), its predicted step against the published one where the source
    gives a throughput, the tool's own pick, and why they differ."""
    out = []
    for e in entries or published_layouts():
        kw = {k: e[k] for k in ("node_size", "interconnect", "global_batch", "seq_len", "micro_batch", "precision")}
        kw["even_stages"] = e.get("even_stages", True)
        rows = layouts(e["model"], e["gpu"], e["n_gpus"], **kw)
        fit = [r for r in rows if r["fits"]]
        mine = [r for r in rows if (r["dp"], r["tp"], r["pp"]) == (e["dp"], e["tp"], e["pp"])]
        theirs = min(mine, key=lambda r: (not r["fits"], r["step_s"])) if mine else None
        rank = fit.index(theirs) + 1 if theirs is not None and theirs["fits"] else None
        published_step = None
        if theirs is not None and e.get("published_tokens_per_s_per_gpu"):   # tokens per step / tokens per s
            published_step = e["global_batch"] * e["seq_len"] / (e["published_tokens_per_s_per_gpu"] * e["n_gpus"])
        elif theirs is not None and e.get("published_tflops_per_gpu"):     # the tool's FLOPs at their rate
            published_step = theirs["model_flops"] / (e["published_tflops_per_gpu"] * 1e12 * e["n_gpus"])
        out.append({"name": e["name"], "published": (e["dp"], e["tp"], e["pp"]), "source": e["source"],
                    "cite": e.get("cite", e["source"]), "url": e.get("url"),
                    "verified": e["verified"], "row": theirs, "rank": rank, "n_fit": len(fit),
                    "n_rows": len(rows), "best": best_layout(rows),
                    "strict_rules_allow": e["model"] in MODELS and MODELS[e["model"]].n_layer % e["pp"] == 0,
                    "vp": e.get("vp"), "precision": e["precision"],
                    "with_recompute": theirs if theirs is not None and theirs["checkpointing"] == "full" else None,
                    "published_step_s": published_step,
                    "predicted_over_published": theirs["step_s"] / published_step if published_step else None,
                    "published_from": "tokens" if e.get("published_tokens_per_s_per_gpu") else "tflops",
                    "label": "predicted"})
    return out


def published_verdict(c: dict) -> str:
    """How the tool's ranking met a published layout: 'excluded' (its rules leave no row for it), 'own_pick' (it
    is the tool's fastest), 'tie' (the tool's pick is within ``TIE`` of it: a model this rough cannot tell them
    apart) or 'differs' (the tool picks another layout, faster by more than ``TIE``)."""
    if c["row"] is None:
        return "excluded"
    if c["rank"] == 1:
        return "own_pick"
    b = c["best"]
    close = b is not None and c["rank"] is not None and c["row"]["step_s"] / b["step_s"] - 1 < TIE
    return "tie" if close else "differs"


def published_rows(checks=None) -> list:
    """Each published layout against the tool, as a table's row (every step time of the tool **predicted**): the
    name, the short citation, the published DP x TP x PP, its rank among the layouts that fit (None where it does
    not fit), the predicted and the published step, their ratio, the tool's own pick and its step, the
    ``published_verdict`` key, and ``uneven``: the published pp does not divide the layers (ranked with uneven
    stages allowed)."""
    rows = []
    for c in checks or published_check():
        r, b = c["row"], c["best"]
        rows.append({"name": c["name"], "cite": c["cite"], "url": c["url"],
                     "published": "DP {} × TP {} × PP {}".format(*c["published"]), "precision": c["precision"],
                     "rank": c["rank"], "n_fit": c["n_fit"], "fits": r is not None and r["fits"],
                     "step_s": r["step_s"] if r else None, "published_step_s": c["published_step_s"],
                     "ratio": c["predicted_over_published"], "mfu": r["mfu"] if r else None,
                     "recompute": c["with_recompute"] is not None, "vp": c["vp"],
                     "pick": _name(b) if b else None, "pick_step_s": b["step_s"] if b else None,
                     "verdict": published_verdict(c), "uneven": not c["strict_rules_allow"], "label": "predicted"})
    return rows
