"""Choosing a DP x TP x PP (x ZeRO) layout for a fixed number of GPUs, taught in chapter 10: every layout that
obeys the rules, its bytes per GPU, whether it fits, and a **predicted** step time -- arithmetic only, nothing
here runs on a GPU.

    rows = layouts("llama2-70b", "h100-sxm", 64, node_size=8, interconnect="infiniband", global_batch=128)
    best = best_layout(rows)                     # the fastest that fits, or None
    choose("llama2-70b", "h100-sxm", 64)         # a Note: the choice and why
    check_layout(scenario, {"dp": 4, "tp": 8, "pp": 2, "zero_stage": 1})   # (ok, reason)

The step-time model (every figure predicted, none measured):

* compute: the model's FLOPs (matmuls 6 x matmul-parameters per token, attention 12 x layers x T x d per token,
  non-causal as the course counts MFU) shared over the GPUs, at the GPU's datasheet peak times the what-if model's
  achievable fraction (``whatif.DEFAULTS``: matmul and attention fractions) through ``whatif.roofline_s``;
  element-wise ops, norms and kernel launches are not charged (large shapes: the matmuls dominate);
* tensor parallelism: 2 AllReduces forward + 2 backward per block and micro-batch (``formulas``), a ring over
  the node's own link (the catalogue's NVLink/PCIe figure);
* pipeline parallelism: the 1F1B bubble, (p - 1) idle slots of one micro-batch (``bubble_fraction``), and the
  activation sends between stages (2 per micro-batch per stage);
* data parallelism: one gradient AllReduce per step (ZeRO 0/1), or ReduceScatter + AllGather (ZeRO 2), or for
  ZeRO 3 a ReduceScatter plus two parameter AllGathers per micro-batch (re-gathered for backward), over the
  inter-node link when the DP group spans nodes;
* nothing overlaps: a real run hides much of the DP and TP communication behind compute, so this model
  leans slow where communication matters, and it favours layouts with less of it.

Ranks are placed TP innermost (a TP group inside one node), then DP, then PP.
"""
from __future__ import annotations

import difflib
import math

from ...base.errors import ConfigError
from ...engine.config import _choice
from ...engine.peaks import value as _value
from ...whatif import DEFAULTS, catalogue, roofline_s
from ..course import Note
from ..netmodel import LINKS, Link, ring_allreduce_s
from ..playbook.args import whole
from ..playbook.zero import activation_bytes_estimate
from .formulas import bubble_fraction, layout_state_bytes, tp_allreduce_bytes, tp_collectives_per_block
from .shapes import MODELS, Shape, flops_per_token, model_shape, n_params_of  # re-exported: the contract's names

__all__ = ["Shape", "MODELS", "model_shape", "n_params_of", "flops_per_token", "gpu_spec", "layouts",
           "best_layout", "choose", "choice_note", "check_layout", "layout_view", "layout_table", "layout_widget",
           "published_layouts", "published_check", "published_note", "INTERCONNECTS", "PRECISIONS", "PARTS"]

GB = 1e9
INTERCONNECTS = tuple(LINKS)          # the link between nodes: netmodel's InfiniBand, Ethernet, NVLink
PRECISIONS = ("bf16", "fp8")          # fp8: the linear layers' GEMMs at the FP8 peak (see fp8.py)
PARTS = ("compute", "bubble", "tp_comm", "pp_p2p", "dp_comm", "optimizer")
MAX_GPUS = 1 << 20


def gpu_spec(gpu: str) -> dict:
    """The catalogue's figures of one GPU in SI units, with the what-if model's achievable fractions."""
    devs = catalogue()["devices"]
    if not isinstance(gpu, str) or gpu not in devs:
        close = difflib.get_close_matches(gpu, list(devs), n=1) if isinstance(gpu, str) else []
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError("gpu", gpu, hint + "a GPU of the what-if catalogue: " + ", ".join(devs))
    d = devs[gpu]
    peaks = {p: (_value(e) or 0.0) * 1e12 for p, e in d["peak_tflops"].items()}
    fp8 = _value(d.get("fp8_peak_tflops") or {})
    return {"key": gpu, "name": d["name"], "peak": peaks, "fp8_peak": fp8 * 1e12 if fp8 else None,
            "memory": _value(d["memory_gb"]) * GB, "usable": _value(d["memory_gb"]) * GB * DEFAULTS[
                "usable_memory_fraction"], "bandwidth": _value(d["memory_bandwidth_gbps"]) * 1e9,
            "link": Link(f"{d['name']} in-node link", _value(d["interconnect_gbps"]) * 1e9,
                         DEFAULTS["link_latency_s"]), "fractions": dict(DEFAULTS[d["vendor"]])}


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
    _choice("checkpointing", checkpointing, ("none", "full"))
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
    return shape, dev, gb, stages


def _ring_half(nbytes, n, link: Link) -> float:
    """A ReduceScatter or an AllGather: half a ring AllReduce."""
    return ring_allreduce_s(nbytes, n, link.bandwidth, link.latency) / 2 if n > 1 else 0.0


def _row(shape, dev, n_gpus, node_size, inter: Link, gb, T, b, dp, tp, pp, zero, precision, checkpointing) -> dict:
    """One layout's bytes per GPU and predicted step time (every time labelled predicted)."""
    m = gb // (dp * b)                                 # micro-batches per DP rank per step
    layers = math.ceil(shape.n_layer / pp)             # the deepest stage sets the pace
    state = layout_state_bytes(shape.n_params, dp=dp, tp=tp, pp=pp, zero_stage=zero)
    per_mb = activation_bytes_estimate(layers, shape.d_model, shape.n_head, T, b, checkpointing, True)
    in_flight = min(pp, m)                             # 1F1B: stage 0 holds p micro-batches' activations
    act = per_mb / tp * in_flight                      # /tp: with sequence parallelism every term splits
    layer_params = shape.n_params / shape.n_layer
    gather = 2 * 2 * layer_params / tp if zero == 3 else 0.0   # ZeRO-3: one layer gathered + one prefetched
    total = state["total"] + act + gather
    # -- compute: the FLOPs of one micro-batch on one stage's GPU, at the achievable peak --
    f = flops_per_token(shape, T)
    share = layers / shape.n_layer / tp                # this GPU's share of the model's layers
    tokens = b * T
    peak = dev["peak"]["bf16"]
    mm_peak = dev["fp8_peak"] if precision == "fp8" else peak
    fr = dev["fractions"]
    t_mb = roofline_s(f["matmul"] * tokens * share, 0, mm_peak, dev["bandwidth"], fr["matmul_fraction"])[0] + \
        roofline_s(f["attention"] * tokens * share, 0, peak, dev["bandwidth"], fr["attention_fraction"])[0]
    compute = m * t_mb
    bubble = compute * bubble_fraction(pp, m, relative_to="ideal") if pp > 1 else 0.0  # (p - 1) x t_mb
    # -- tensor parallelism: 4 AllReduces per block and micro-batch inside the node --
    calls = tp_collectives_per_block()
    tp_bytes = tp_allreduce_bytes(b, T, shape.d_model)
    tp_comm = m * layers * (calls["forward"] + calls["backward"]) * ring_allreduce_s(
        tp_bytes, tp, dev["link"].bandwidth, dev["link"].latency) if tp > 1 else 0.0
    # -- pipeline: each stage sends one activation forward and one gradient back per micro-batch --
    pp_link = dev["link"] if n_gpus <= node_size else inter    # stages sit tp x dp ranks apart: other nodes
    p2p = 2 * m * (tp_bytes / pp_link.bandwidth + pp_link.latency) if pp > 1 else 0.0
    # -- data parallelism: gradients of this GPU's share, over the inter-node link when DP spans nodes --
    dp_link = dev["link"] if tp * dp <= node_size else inter
    grads = 2 * shape.n_params / (tp * pp)
    if dp == 1:
        dp_comm = 0.0
    elif zero <= 2:   # AllReduce, or ReduceScatter + AllGather of the updated shard: the same bytes on a ring
        dp_comm = ring_allreduce_s(grads, dp, dp_link.bandwidth, dp_link.latency)
    else:             # ZeRO-3: gather the weights for forward and again for backward, every micro-batch
        dp_comm = _ring_half(grads, dp, dp_link) + 2 * m * _ring_half(grads, dp, dp_link)
    optimizer = roofline_s(0, 2 * (state["optimizer"] + state["params"] + state["grads"]), peak, dev["bandwidth"],
                           1.0, fr["bandwidth_fraction"])[0]
    parts = {"compute": compute, "bubble": bubble, "tp_comm": tp_comm, "pp_p2p": p2p, "dp_comm": dp_comm,
             "optimizer": optimizer}
    step = sum(parts.values())
    model_flops = f["total"] * gb * T
    return {"dp": dp, "tp": tp, "pp": pp, "zero_stage": zero, "micro_batches": m, "layers_per_stage": layers,
            "state_bytes": state["total"], "states": state, "activation_bytes": act, "zero3_gather_bytes": gather,
            "bytes_per_gpu": total, "usable_bytes": dev["usable"], "fits": total <= dev["usable"],
            "step_s": step, "parts": parts, "bottleneck": max(parts, key=parts.get),
            "tokens_per_s": gb * T / step, "mfu": model_flops / step / (n_gpus * peak),
            "dp_link": dp_link.name, "precision": precision, "label": "predicted"}


def layouts(model, gpu: str, n_gpus: int, node_size: int = 8, interconnect: str = "infiniband",
            global_batch: int | None = None, seq_len: int | None = None, micro_batch: int = 1,
            zero_stages=(0, 1, 2, 3), precision: str = "bf16", checkpointing: str = "none",
            even_stages: bool = True) -> list:
    """Every DP x TP x PP (x ZeRO stage) of ``n_gpus`` that obeys the rules, fastest predicted first:
    tp divides the heads and the node (a TP group stays in one node: its 4 AllReduces per block and micro-batch
    need the node's own link); pp divides the layers (``even_stages=False`` allows uneven stages: the deepest sets
    the pace); dp x micro_batch divides the global batch (in sequences; default 2 x n_gpus x micro_batch).
    ZeRO stages other than 0 only where dp > 1. Each row: bytes per GPU, fits, a **predicted** step time."""
    shape, dev, gb, stages = _check_scenario(model, gpu, n_gpus, node_size, interconnect, global_batch, seq_len,
                                             micro_batch, zero_stages, precision, checkpointing)
    T = seq_len or shape.seq_len
    rows = []
    for tp in _divisors(n_gpus):
        if shape.n_head % tp or tp > node_size or node_size % tp:
            continue
        for pp in _divisors(n_gpus // tp):
            if pp > shape.n_layer or (even_stages and shape.n_layer % pp):
                continue
            dp = n_gpus // (tp * pp)
            if gb % (dp * micro_batch):
                continue
            for zero in (stages if dp > 1 else (0,)):
                rows.append(_row(shape, dev, n_gpus, node_size, LINKS[interconnect], gb, T, micro_batch, dp, tp, pp,
                                 zero, precision, checkpointing))
    rows.sort(key=lambda r: (not r["fits"], r["step_s"]))
    return rows


def best_layout(rows: list):
    """The fastest predicted layout that fits (None when none does)."""
    fit = [r for r in rows if r["fits"]]
    return min(fit, key=lambda r: r["step_s"]) if fit else None


def _name(r) -> str:
    return f"DP {r['dp']} × TP {r['tp']} × PP {r['pp']}, ZeRO-{r['zero_stage']}"


_PART_WORDS = {"compute": "compute", "bubble": "the pipeline bubble", "tp_comm": "TP AllReduces",
               "pp_p2p": "pipeline sends", "dp_comm": "DP gradient/parameter traffic", "optimizer": "the optimizer"}


def choice_note(rows: list, gpu: str = "") -> Note:
    """The choice and why, from the rows' numbers: fits because..., faster than the runner-up because..."""
    best = best_layout(rows)
    if best is None:
        if not rows:
            return Note("No layout obeys the rules for this scenario (tp must divide the heads and the node, pp the "
                        "layers, dp x micro-batch the global batch).")
        least = min(rows, key=lambda r: r["bytes_per_gpu"])
        return Note(f"**No layout fits.** The smallest, {_name(least)}, needs {least['bytes_per_gpu'] / GB:,.1f} GB "
                    f"per GPU against {least['usable_bytes'] / GB:,.1f} GB usable: more GPUs, activation "
                    "checkpointing or a GPU with more memory.")
    shape_of = lambda r: (r["dp"], r["tp"], r["pp"])  # noqa: E731 -- the runner-up is another split, not a ZeRO stage
    fit = [r for r in rows if r["fits"] and shape_of(r) != shape_of(best)]
    s = best["states"]
    text = (f"**Predicted choice: {_name(best)}** — {best['step_s']:,.2f} s per step (predicted), MFU "
            f"{best['mfu']:.0%}. It fits because each GPU holds {best['state_bytes'] / GB:,.1f} GB of model state "
            f"(weights {s['params'] / GB:,.1f}, gradients {s['grads'] / GB:,.1f}, optimizer {s['optimizer'] / GB:,.1f})"
            f" + {best['activation_bytes'] / GB:,.1f} GB of activations = {best['bytes_per_gpu'] / GB:,.1f} GB of "
            f"{best['usable_bytes'] / GB:,.1f} GB usable.")
    if fit:
        ru = min(fit, key=lambda r: r["step_s"])  # the fastest other dp x tp x pp
        diff = {k: ru["parts"][k] - best["parts"][k] for k in PARTS}
        k = max(diff, key=diff.get)
        ratio = ru["step_s"] / best["step_s"]
        how = f"{ratio:.2f}× faster than" if ratio >= 1.005 else "about as fast as (within 0.5 %)"
        text += (f" It is predicted {how} the next split, {_name(ru)} "
                 f"({ru['step_s']:,.2f} s), mostly because of {_PART_WORDS[k]}: {best['parts'][k]:,.2f} s against "
                 f"{ru['parts'][k]:,.2f} s.")
    return Note(text + " No overlap of communication with compute is assumed.")


def choose(model, gpu: str, n_gpus: int, **kw) -> Note:
    """``layouts`` then ``choice_note``: the fastest predicted layout that fits, and why."""
    return choice_note(layouts(model, gpu, n_gpus, **kw), gpu)


def _answer(answer) -> dict:
    if isinstance(answer, (tuple, list)) and len(answer) in (3, 4):
        answer = dict(zip(("dp", "tp", "pp", "zero_stage"), answer))
    if not isinstance(answer, dict) or not {"dp", "tp", "pp"} <= set(answer):
        raise ConfigError("answer", answer, "a dict with dp, tp, pp (and zero_stage), or a tuple (dp, tp, pp[, zero])")
    out = {k: answer.get(k, 0 if k == "zero_stage" else None) for k in ("dp", "tp", "pp", "zero_stage")}
    for k, v in out.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if k == "zero_stage" else 1):
            raise ConfigError(k, v, "a whole number >= 1" if k != "zero_stage" else "a ZeRO stage: 0, 1, 2 or 3")
    return out


SCENARIO_KEYS = ("model", "gpu", "n_gpus", "node_size", "interconnect", "global_batch", "seq_len", "micro_batch",
                 "precision", "checkpointing", "even_stages")


# The chapter's example, and exercise-10-layout-fits' scenario: Llama 2 70B on 64 H100s in 8 nodes of 8,
# InfiniBand between nodes, 128 sequences of 4,096 tokens per step, micro-batch 1.
EXAMPLE_SCENARIO = dict(model="llama2-70b", gpu="h100-sxm", n_gpus=64, node_size=8, interconnect="infiniband",
                        global_batch=128, seq_len=4096, micro_batch=1)


def check_layout(scenario: dict, answer) -> tuple:
    """(ok, reason) for a learner's layout (dict, or tuple (dp, tp, pp[, zero_stage])) in a stated scenario: it
    must use all the GPUs, keep TP inside a node and on whole heads, split the layers evenly, split the global
    batch, and fit in memory. The reason names what is wrong in plain words."""
    if not isinstance(scenario, dict) or not {"model", "gpu", "n_gpus"} <= set(scenario):
        raise ConfigError("scenario", scenario, "a dict with model, gpu, n_gpus (and node_size, interconnect, ...)")
    sc = {k: v for k, v in scenario.items() if k in SCENARIO_KEYS}
    a = _answer(answer)
    dp, tp, pp, zero = a["dp"], a["tp"], a["pp"], a["zero_stage"]
    shape = model_shape(sc["model"])
    n, node = sc["n_gpus"], sc.get("node_size", 8)
    b = sc.get("micro_batch", 1)
    gb = sc.get("global_batch") or 2 * n * b
    if zero not in (0, 1, 2, 3):
        return False, f"ZeRO stage {zero} does not exist: 0 (none), 1, 2 or 3."
    if dp * tp * pp != n:
        more = "more" if dp * tp * pp > n else "fewer"
        return False, (f"dp × tp × pp = {dp} × {tp} × {pp} = {dp * tp * pp} GPUs, {more} than the {n} you have: "
                       "the three must multiply to the GPU count.")
    if tp > node:
        return False, (f"tp = {tp} is larger than a node ({node} GPUs): TP's 4 AllReduces per block would cross "
                       "the slow link between nodes. Keep tp within a node.")
    if node % tp:
        return False, f"tp = {tp} does not divide the node size {node}: a TP group would straddle two nodes."
    if shape.n_head % tp:
        return False, f"tp = {tp} does not divide the {shape.n_head} attention heads: TP splits whole heads."
    if shape.n_layer % pp and sc.get("even_stages", True):
        return False, f"pp = {pp} does not divide the {shape.n_layer} layers: the stages would be uneven."
    if gb % (dp * b):
        return False, f"dp × micro-batch = {dp * b} does not divide the global batch of {gb} sequences."
    rows = layouts(sc["model"], sc["gpu"], n, node_size=node, interconnect=sc.get("interconnect", "infiniband"),
                   global_batch=gb, seq_len=sc.get("seq_len"), micro_batch=b, zero_stages=(zero,),
                   precision=sc.get("precision", "bf16"), checkpointing=sc.get("checkpointing", "none"),
                   even_stages=sc.get("even_stages", True))
    row = next(r for r in rows if (r["dp"], r["tp"], r["pp"]) == (dp, tp, pp))
    if not row["fits"]:
        return False, (f"it does not fit: {row['bytes_per_gpu'] / GB:,.1f} GB per GPU ({row['state_bytes'] / GB:,.1f} "
                       f"model state + {row['activation_bytes'] / GB:,.1f} activations) against "
                       f"{row['usable_bytes'] / GB:,.1f} GB usable. Shard more: a higher ZeRO stage, more TP or PP.")
    return True, (f"fits ({row['bytes_per_gpu'] / GB:,.1f} of {row['usable_bytes'] / GB:,.1f} GB per GPU) and obeys "
                  f"every rule; predicted step {row['step_s']:,.2f} s.")


# ---- the table and the widget ------------------------------------------------------------------------

def layout_table(rows: list, top: int = 8) -> Note:
    """The top layouts that fit as a markdown table, every time labelled predicted."""
    fit = [r for r in rows if r["fits"]][:top]
    if not fit:
        return Note("No layout fits (see the choice below).")
    lines = ["| DP | TP | PP | ZeRO | m | predicted step s | predicted MFU | GB per GPU (state + act.) | bottleneck |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in fit:
        lines.append(f"| {r['dp']} | {r['tp']} | {r['pp']} | {r['zero_stage']} | {r['micro_batches']} | "
                     f"{r['step_s']:,.2f} | {r['mfu']:.0%} | {r['bytes_per_gpu'] / GB:,.1f} "
                     f"({r['state_bytes'] / GB:,.1f} + {r['activation_bytes'] / GB:,.1f}) | "
                     f"{_PART_WORDS[r['bottleneck']]} |")
    n_fit = sum(r["fits"] for r in rows)
    lines.append(f"\n{n_fit} of {len(rows)} layouts that obey the rules fit; the {len(fit)} fastest shown "
                 "(all times **predicted**, no overlap assumed).")
    return Note("\n".join(lines))


def layout_view(model, gpu: str, n_gpus: int, **kw) -> tuple:
    """What the widget draws, without a front end: (rows, table Note, choice Note)."""
    rows = layouts(model, gpu, n_gpus, **kw)
    return rows, layout_table(rows), choice_note(rows, gpu)


WIDGET_MODELS = ("llama2-70b", "llama3-70b", "gpt3-175b", "llama3-405b", "large", "base")


def layout_widget(model: str = "llama2-70b", gpu: str = "h100-sxm", n_gpus: int = 64, node_size: int = 8,
                  interconnect: str = "infiniband", **kw):
    """An ipywidgets control: model, GPU, GPU count, node size, interconnect; redraws the layouts that fit and
    the choice. The returned box carries ``.view()`` -> (rows, table, choice) of its current values, so a test
    (or a notebook without a front end) reads what it would draw."""
    import ipywidgets as w  # deferred: ipywidgets loads only to draw the widget
    from IPython.display import display  # deferred: with the widget

    view = layout_view(model, gpu, n_gpus, node_size=node_size, interconnect=interconnect, **kw)  # checks first
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
        return layout_view(ctl["model"].value, ctl["gpu"].value, ctl["n_gpus"].value,
                           node_size=ctl["node_size"].value, interconnect=ctl["interconnect"].value, **kw)

    def redraw(_=None):
        out.clear_output()
        with out:
            try:
                state["view"] = current()
                display(state["view"][1], state["view"][2])
            except ConfigError as e:  # e.g. node size not dividing the GPU count: say so, keep the controls
                state["view"] = ([], Note(str(e)), Note(str(e)))
                print(e)

    for c in ctl.values():
        c.observe(redraw, names="value")
    redraw()
    box.view = lambda: state["view"]
    box.controls = ctl
    return box


# ---- published layouts --------------------------------------------------------------------------------

def published_layouts() -> list:
    """Layouts that teams published for a GPU count, each with its citation and whether labkit's reference search
    confirmed the figures ("verified") or they are quoted from memory ("unverified")."""
    return [
        {"name": "GPT-3 175B on 512 H100 (NeMo, FP8)", "model": "gpt3-175b", "gpu": "h100-sxm", "n_gpus": 512,
         "node_size": 8, "interconnect": "infiniband", "seq_len": 2048, "global_batch": 2048, "micro_batch": 2,
         "tp": 4, "pp": 8, "dp": 16, "cp": 1, "vp": 6, "precision": "fp8",
         "source": "NVIDIA NeMo Framework user guide, Performance Summary, pre-training table, System: DGX-H100 "
                   "(GPT3-175B: 512 GPUs, GBS 2048, MBS 2, seq 2048, TP 4, PP 8, CP 1, VP 6, FP8)",
         "url": "https://docs.nvidia.com/nemo-framework/user-guide/latest/performance/performance_summary.html",
         "verified": "verified (labkit's reference search, the page's DGX-H100 table)"},
        {"name": "Llama 3 405B on 16,384 H100 (Meta)", "model": "llama3-405b", "gpu": "h100-sxm", "n_gpus": 16384,
         "node_size": 8, "interconnect": "infiniband", "seq_len": 8192, "global_batch": 2048, "micro_batch": 1,
         "tp": 8, "pp": 16, "dp": 128, "cp": 1, "vp": None, "precision": "bf16", "even_stages": False,
         "source": "The Llama 3 Herd of Models (Meta, 2024), Table 4: 16,384 GPUs, TP 8, CP 1, PP 16, DP 128, "
                   "seq 8,192, 16M tokens per batch, 400 TFLOP/s per GPU (BF16)",
         "url": "https://arxiv.org/abs/2407.21783",
         "verified": "GPUs, TP, CP, PP, tokens per batch and TFLOP/s verified through a page quoting Meta's SC'24 "
                     "slide of the same table (glennklockwood.com/garden/llama-3.1); DP = 16384 / (8 × 16) derived; "
                     "the table number and the batch of 2,048 sequences (16M / 8,192) unverified; RoCE at 400 Gb/s "
                     "per GPU modelled as InfiniBand NDR (the same 400 Gb/s)"},
        {"name": "GPT-3 175B on 1,536 A100 (Megatron-LM paper)", "model": "gpt3-175b", "gpu": "a100-80gb",
         "n_gpus": 1536, "node_size": 8, "interconnect": "infiniband", "seq_len": 2048, "global_batch": 1536,
         "micro_batch": 1, "tp": 8, "pp": 8, "dp": 24, "cp": 1, "vp": None, "precision": "bf16",
         "source": "Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters Using "
                   "Megatron-LM (SC'21), Table 1, the 175B row: TP 8, PP 8, 1,536 GPUs, batch 1,536",
         "url": "https://arxiv.org/abs/2104.04473",
         "verified": "unverified: the reference search confirmed the paper and its 3,072-GPU 1T headline, not this "
                     "row; the cluster's 8 x 200 Gb/s HDR per node is modelled as 400 Gb/s per GPU (optimistic)"},
    ]


def published_check(entries=None) -> list:
    """For each published layout: its rank among the rows that fit (the best ZeRO stage of its dp x tp x pp, the
    source not saying which), its predicted step, the tool's own pick, and why they differ."""
    out = []
    for e in entries or published_layouts():
        kw = {k: e[k] for k in ("node_size", "interconnect", "global_batch", "seq_len", "micro_batch", "precision")}
        kw["even_stages"] = e.get("even_stages", True)
        rows = layouts(e["model"], e["gpu"], e["n_gpus"], **kw)
        fit = [r for r in rows if r["fits"]]
        mine = [r for r in rows if (r["dp"], r["tp"], r["pp"]) == (e["dp"], e["tp"], e["pp"])]
        theirs = min(mine, key=lambda r: (not r["fits"], r["step_s"])) if mine else None
        recompute = None
        if theirs is not None and not theirs["fits"]:  # would full activation recomputation make it fit?
            again = layouts(e["model"], e["gpu"], e["n_gpus"], **{**kw, "checkpointing": "full"})
            recompute = min((r for r in again if (r["dp"], r["tp"], r["pp"]) == (e["dp"], e["tp"], e["pp"])),
                            key=lambda r: (not r["fits"], r["step_s"]))
        rank = fit.index(theirs) + 1 if theirs is not None and theirs["fits"] else None
        out.append({"name": e["name"], "published": (e["dp"], e["tp"], e["pp"]), "source": e["source"],
                    "verified": e["verified"], "row": theirs, "rank": rank, "n_fit": len(fit),
                    "n_rows": len(rows), "best": best_layout(rows),
                    "strict_rules_allow": e["model"] in MODELS and MODELS[e["model"]].n_layer % e["pp"] == 0,
                    "vp": e.get("vp"), "precision": e["precision"], "with_recompute": recompute,
                    "label": "predicted"})
    return out


def published_note(checks=None) -> Note:
    """Each published layout against the tool's ranking, in words from the numbers."""
    lines = []
    for c in checks or published_check():
        dp, tp, pp = c["published"]
        head = f"- **{c['name']}** — DP {dp} × TP {tp} × PP {pp} ({c['source']}; {c['verified']})."
        if c["row"] is None:
            lines.append(head + " The tool's rules exclude it (see the check's row).")
            continue
        r, b = c["row"], c["best"]
        where = (f"ranked {c['rank']} of {c['n_fit']} layouts that fit" if c["rank"] else
                 f"predicted NOT to fit ({r['bytes_per_gpu'] / GB:,.0f} GB per GPU against "
                 f"{r['usable_bytes'] / GB:,.0f} GB usable)")
        text = (f"{head} The tool: {where}, predicted {r['step_s']:,.2f} s per step with ZeRO-{r['zero_stage']}"
                f" ({_PART_WORDS[r['bottleneck']]} the largest part)")
        rc = c["with_recompute"]
        if rc is not None:
            text += (f"; with full activation recomputation (not modelled in the ranking) it would need "
                     f"{rc['bytes_per_gpu'] / GB:,.0f} GB and {'fit' if rc['fits'] else 'still not fit'}")
        close = b is not None and c["rank"] not in (None, 1) and r["step_s"] / b["step_s"] - 1 < 0.02
        if close:
            text += (f"; the tool's own pick, {_name(b)} at {b['step_s']:,.2f} s, is within 2 % of it: a tie for a "
                     "model this rough")
        elif b is not None and c["rank"] != 1:
            text += (f"; its own pick is {_name(b)} at {b['step_s']:,.2f} s. It differs because the model assumes "
                     "no overlap (real runs hide DP and much TP traffic behind compute)")
            if c["vp"]:
                text += f", ignores interleaving (the published VP {c['vp']} cuts the bubble about {c['vp']}×)"
            text += ", and counts no activation recomputation or memory headroom the team kept"
        elif c["rank"] == 1:
            text += "; it is also the tool's own pick"
        if not c["strict_rules_allow"]:
            text += (f". Note: pp = {pp} does not divide the model's layers, so the strict rule (pp divides the "
                     "layers) excludes it; it is ranked here with uneven stages allowed (the team balanced them "
                     "by hand)")
        lines.append(text + ".")
    return Note("Published layouts against the tool (**predicted** step times):\n\n" + "\n".join(lines))
