"""Choosing a DP x TP x PP (x ZeRO) layout for a fixed number of GPUs (taught in chapter 10): every layout that
obeys the rules, its bytes per GPU, whether it fits, and a **predicted** step time -- arithmetic only; published
layouts against the tool; FP8 training's step and MFU, predicted.

    rows = layouts("llama2-70b", "h100-sxm", 64, node_size=8, interconnect="infiniband", global_batch=128)
    choice(rows)                                 # the pick and why, as figures (the chapter words them)

The step-time model (every figure predicted, none measured, nothing overlapped -- a real run hides much of the
DP and TP traffic behind compute, so the model leans slow where communication matters):

* compute: the model's FLOPs over the GPUs at the datasheet peak times the what-if model's achievable fraction
  (``whatif.roofline_s``); element-wise ops, norms and launches are not charged (large shapes: the matmuls
  dominate); full activation recomputation runs the forward twice: 4/3 of the compute;
* memory: model state (``layout_state_bytes``) plus 34·s·b·h/tp activation bytes a layer -- sequence
  parallelism assumed (Megatron pairs it with TP), GPT-3's breakdown (Korthikanti et al. 2022, flash attention)
  applied to every shape, an approximation for SwiGLU/GQA; under 1F1B stage 0 holds min(p, m) micro-batches.
  Not modelled: the first and last stages' extra load (embeddings, head, the fp32 logits of a large vocabulary);
* TP: 2 AllReduces forward + 2 backward per block and micro-batch (2 more when recomputation re-runs the
  forward), a ring over the node's own link; a TP group stays in one node;
* PP: the 1F1B bubble, (p - 1) slots of one micro-batch, and 2 sends per micro-batch per stage of 1/tp of the
  b·s·h activation (each TP rank sends its own slice, on its own link); 1F1B needs m >= p;
* DP: one gradient AllReduce per step under ZeRO 0/1 (gradients accumulate full-size); ZeRO-2 a ReduceScatter
  per micro-batch and one AllGather of the updated shard, ZeRO-3 a ReduceScatter and two AllGathers per
  micro-batch; over the inter-node link when the group spans nodes. With pp > 1 only ZeRO 0 and 1 (DeepSpeed's
  and Megatron's rule, not a law: ``torch.distributed.pipelining`` with FSDP stages keeps full 16-bit weights
  and gradients within a step and reduce-scatters once -- ZeRO-1's bytes and traffic, so that row stands for it).

Ranks are placed TP innermost, then DP, then PP. A learner's layout is judged by ``labkit.check.parallel``.
"""
from __future__ import annotations

import math
from pathlib import Path

from ...base.runtime import ConfigError
from ...base.paths import read_json
from ...engine.config import _choice
from ...whatif import catalogue, roofline_s
from ...whatif.roofline import ring_allreduce_s
from ...whatif.roofline import LINKS, Link
from ...engine.config import real, whole
from ...whatif.layouts import activation_bytes_estimate
from .formulas import (GB, MODELS, bubble_fraction, flops_per_token, gpu_spec, layout_state_bytes, model_shape,
                       tp_allreduce_bytes, tp_collectives_per_block)

INTERCONNECTS = tuple(LINKS)          # the link between nodes: the what-if model's InfiniBand, Ethernet, NVLink
PRECISIONS = ("bf16", "fp8")          # fp8: the linear layers' GEMMs at the FP8 peak (see fp8.py)
CHECKPOINTING = ("none", "full")     # activation recomputation: none, or every layer re-run in backward
MAX_ZERO_WITH_PP = 1                 # pp > 1: ZeRO 0 or 1 (DeepSpeed's, Megatron's rule; FSDP + PP peaks at ZeRO-1)
PARTS = ("compute", "bubble", "tp_comm", "pp_p2p", "dp_comm", "optimizer")
MAX_GPUS = 1 << 20


def _divisors(n: int) -> list:
    return [k for k in range(1, n + 1) if n % k == 0]


def _check_scenario(model, gpu, n_gpus, node_size, interconnect, global_batch, seq_len, micro_batch, zero_stages,
                    precision, checkpointing):
    shape = model_shape(model)
    dev = gpu_spec(gpu)
    if isinstance(n_gpus, bool) or not isinstance(n_gpus, int) or not 1 <= n_gpus <= MAX_GPUS:
        raise ConfigError("n_gpus", n_gpus, f"a whole number of GPUs from 1 to {MAX_GPUS}")
    whole("node_size", node_size)
    if n_gpus > node_size and n_gpus % node_size:
        raise ConfigError("node_size", node_size, f"a node size that divides n_gpus={n_gpus} (whole nodes), "
                          f"e.g. {', '.join(str(k) for k in _divisors(n_gpus) if 2 <= k <= 16)}")
    _choice("interconnect", interconnect, INTERCONNECTS)
    _choice("precision", precision, PRECISIONS)
    cks = tuple(checkpointing) if isinstance(checkpointing, (tuple, list)) else (checkpointing,)
    if not cks:
        raise ConfigError("checkpointing", checkpointing, "'none', 'full', or a tuple of them")
    for ck in cks:
        _choice("checkpointing", ck, CHECKPOINTING)
    if precision == "fp8" and not dev["fp8_peak"]:
        have = [k for k, v in catalogue()["devices"].items() if v.get("fp8_peak_tflops")]
        raise ConfigError("precision", "fp8", f"bf16 on {gpu}: the catalogue has no FP8 peak for it (FP8 peaks: "
                          + ", ".join(have) + ")")
    whole("micro_batch", micro_batch)
    if seq_len is not None:
        whole("seq_len", seq_len)
    gb = 2 * n_gpus * micro_batch if global_batch is None else whole("global_batch", global_batch)
    stages = tuple(zero_stages) if isinstance(zero_stages, (tuple, list)) else None
    if not stages or any(isinstance(z, bool) or z not in (0, 1, 2, 3) for z in stages):
        raise ConfigError("zero_stages", zero_stages, "a non-empty tuple of ZeRO stages from 0, 1, 2, 3")
    return shape, dev, gb, stages, tuple(dict.fromkeys(cks))


def _ring_half(nbytes, n, link: Link) -> float:
    """A ReduceScatter or an AllGather: half a ring AllReduce."""
    return ring_allreduce_s(nbytes, n, link.bandwidth, link.latency) / 2 if n > 1 else 0.0


def _row(shape, dev, n_gpus, node_size, inter: Link, gb, T, b, dp, tp, pp, zero, precision, checkpointing) -> dict:
    """One layout's bytes per GPU and predicted step time (every time labelled predicted)."""
    m = gb // (dp * b)                                 # micro-batches per DP rank per step
    layers = math.ceil(shape.n_layer / pp)             # the deepest stage sets the pace
    full = checkpointing == "full"
    state = layout_state_bytes(shape.n_params, dp=dp, tp=tp, pp=pp, zero_stage=zero)
    per_mb = activation_bytes_estimate(layers, shape.d_model, shape.n_head, T, b, checkpointing, True)
    in_flight = min(pp, m)                             # 1F1B: stage 0 holds p micro-batches' activations
    act = per_mb / tp * in_flight                      # /tp: sequence parallelism assumed, every term splits
    if full:  # backward re-runs one layer at a time: that layer's full activations live on top of the inputs
        act += activation_bytes_estimate(1, shape.d_model, shape.n_head, T, b, "none", True) / tp
    layer_params = shape.n_params / shape.n_layer
    gather = 2 * 2 * layer_params / tp if zero == 3 else 0.0   # ZeRO-3: one layer gathered + one prefetched
    total = state["total"] + act + gather
    # -- compute: the FLOPs of one micro-batch on one stage's GPU, at the achievable peak --
    f = flops_per_token(shape, T)
    share = layers / shape.n_layer / tp                # this GPU's share of the model's layers
    tokens = b * T
    # 16-bit matmuls at the bf16 peak -- or, on a GPU without bf16 units (T4, V100, P100), fp16's (with a scaler)
    peak = dev["peak"]["bf16"] or dev["peak"].get("fp16") or dev["peak"].get("fp32")
    mm_peak = dev["fp8_peak"] if precision == "fp8" else peak
    fr = dev["fractions"]
    t_mb = roofline_s(f["matmul"] * tokens * share, 0, mm_peak, dev["bandwidth"], fr["matmul_fraction"])[0] + \
        roofline_s(f["attention"] * tokens * share, 0, peak, dev["bandwidth"], fr["attention_fraction"])[0]
    t_mb *= 4 / 3 if full else 1.0                     # recomputation: forward (1/3 of the FLOPs) runs twice
    compute = m * t_mb
    bubble = compute * bubble_fraction(pp, m, relative_to="ideal") if pp > 1 else 0.0  # (p - 1) x t_mb
    # -- tensor parallelism: 4 AllReduces per block and micro-batch inside the node (6 when the forward re-runs) --
    calls = tp_collectives_per_block()
    tp_bytes = tp_allreduce_bytes(b, T, shape.d_model)
    n_calls = calls["forward"] * (2 if full else 1) + calls["backward"]
    tp_comm = m * layers * n_calls * ring_allreduce_s(
        tp_bytes, tp, dev["link"].bandwidth, dev["link"].latency) if tp > 1 else 0.0
    # -- pipeline: each stage sends one activation forward and one gradient back per micro-batch; under sequence
    #    parallelism each TP rank sends only its 1/tp slice, all tp of them at once on their own links --
    pp_link = dev["link"] if n_gpus <= node_size else inter    # stages sit tp x dp ranks apart: other nodes
    p2p = 2 * m * (tp_bytes / tp / pp_link.bandwidth + pp_link.latency) if pp > 1 else 0.0
    # -- data parallelism: gradients of this GPU's share, over the inter-node link when DP spans nodes --
    dp_link = dev["link"] if tp * dp <= node_size else inter
    grads = 2 * shape.n_params / (tp * pp)
    if dp == 1:
        dp_comm = 0.0
    elif zero <= 1:   # gradients accumulate full-size over the m micro-batches: one AllReduce per step
        dp_comm = ring_allreduce_s(grads, dp, dp_link.bandwidth, dp_link.latency)
    elif zero == 2:   # sharded gradients: a ReduceScatter per micro-batch, one AllGather of the updated shard
        dp_comm = (m + 1) * _ring_half(grads, dp, dp_link)
    else:             # ZeRO-3: a ReduceScatter and two weight AllGathers (forward, backward) per micro-batch
        dp_comm = 3 * m * _ring_half(grads, dp, dp_link)
    optimizer = roofline_s(0, 2 * (state["optimizer"] + state["params"] + state["grads"]), peak, dev["bandwidth"],
                           1.0, fr["bandwidth_fraction"])[0]
    parts = {"compute": compute, "bubble": bubble, "tp_comm": tp_comm, "pp_p2p": p2p, "dp_comm": dp_comm,
             "optimizer": optimizer}
    step = sum(parts.values())
    model_flops = f["total"] * gb * T
    return {"dp": dp, "tp": tp, "pp": pp, "zero_stage": zero, "checkpointing": checkpointing,
            "micro_batches": m, "layers_per_stage": layers,
            "state_bytes": state["total"], "states": state, "activation_bytes": act, "zero3_gather_bytes": gather,
            "bytes_per_gpu": total, "usable_bytes": dev["usable"], "fits": total <= dev["usable"],
            "step_s": step, "parts": parts, "bottleneck": max(parts, key=parts.get),
            "tokens_per_s": gb * T / step, "model_flops": model_flops, "mfu": model_flops / step / (n_gpus * peak),
            "dp_link": dp_link.name, "precision": precision, "label": "predicted"}


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
    rule; PyTorch's FSDP + PP holds ZeRO-1's bytes during a step: the module's docstring).
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
    """Layouts teams published (``published_layouts.json``), each with its citation (``source``, ``cite``, ``url``)
    and ``verified``, the provenance for maintainers; a fresh list each call."""
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


