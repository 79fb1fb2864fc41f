"""Memory in practice: the tools of chapter 08 (sequence length, the step-2 out-of-memory, the allocator,
bytes per parameter).

    rows = labkit.memlab.seq_sweep(config, [64, 128, 256])     # activation bytes against T, measured
    labkit.memlab.activation_formula(L, d, n_head, T, B, "math")  # ... and by formula, part by part
    steps = labkit.memlab.first_updates(config)                 # weights, grads, AdamW state, activations
    rows = labkit.memlab.bytes_per_param(config)                # bytes per parameter of three recipes, counted

On a CUDA GPU the allocator's own numbers are used (memory_allocated, memory_stats, its history); on a
CPU, which has no such allocator statistics, bytes are counted storage by storage (labkit.memtrace's
tracer) -- never estimated and shown as measured. Tools that build a model build their own copy.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from .config import Config, ConfigError
from .data import make_loader
from .device import capabilities, intra_op_threads, torch_device
from .kernels import _figure as figure
from .measure import activation_bytes, count_flops, state_bytes
from .memtrace import Tracer
from .model import GPT, VOCAB
from .precision import autocast
from .train import make_optimizer, run

__all__ = ["activation_formula", "seq_sweep", "attention_recompute_ready", "attention_recompute",
           "first_updates", "update_peaks", "peak_phase", "explain_update_peaks", "allocator_stats", "fragmentation_demo", "record_cuda_history",
           "bytes_per_param", "RECIPES", "run_memory", "plot_seq_sweep", "plot_first_updates",
           "plot_bytes_per_param"]


# ---- sequence length --------------------------------------------------------------------------------


def activation_formula(n_layer: int, d_model: int, n_head: int, seq_len: int, batch: int, attention: str = "auto",
                       vocab: int = VOCAB, bytes_per_value: int = 4) -> dict:
    """Bytes the forward pass keeps for backward, part by part (fp32: 4 bytes a value).

    Per block and token, 16·d values (LayerNorm outputs, q/k/v, attention output, residuals, MLP
    up-projection and GELU output: labkit.memtrace's count) plus n_head (the fused kernel's log-sum-exp) plus
    4 (LayerNorm statistics). The math backend instead keeps the softmax probabilities, one T×T matrix per
    head, causal mask included: n_head·T values per token, less the log-sum-exp it does not need, so
    n_head·(T − 1) more than the fused kernel. Outside the blocks: the embedding sum and the final
    LayerNorm (2·d + 2) and the log-softmax of the logits (vocab)."""
    B, T, d, h, L = batch, seq_len, d_model, n_head, n_layer
    linear = L * B * T * (16 * d + h + 4) * bytes_per_value
    square = L * B * h * T * (T - 1) * bytes_per_value if attention == "math" else 0
    outside = B * T * (2 * d + 2 + vocab) * bytes_per_value
    return {"blocks_linear": linear, "attention_square": square, "outside": outside,
            "total": linear + square + outside}


def seq_sweep(base: Config, seq_lens, attentions=("auto", "math"), batch: int = 2, n_threads: int | None = 1) -> list:
    """Activation bytes kept after one forward pass (the engine's own probe: live storages) at each sequence
    length and attention backend, beside the formula's parts. fp32 unless ``base`` says otherwise.

    ``batch`` >= 2 matches the formula exactly; with one sequence the math path's inputs have another
    layout, and it keeps scaled copies of q and k (2·d more values per token and block) as well."""
    dev = torch_device(capabilities(base.device).kind)
    rows = []
    with intra_op_threads(n_threads):
        for T in seq_lens:
            for att in attentions:
                cfg = base.replace(seq_len=T, attention=att)
                measured, copies = activation_bytes(cfg, dev, batch=batch)
                s = cfg.spec
                f = activation_formula(s.n_layer, s.d_model, s.n_head, T, batch, att)
                rows.append({"seq_len": T, "attention": att, "batch": batch, "measured_bytes": measured,
                             "weight_copy_bytes": copies, **{f"formula_{k}": v for k, v in f.items()},
                             "ratio": measured / f["total"] if f["total"] else None})
    return rows


def attention_recompute_ready() -> tuple:
    """(ok, reason): whether the engine has Megatron-style attention recompute, checkpointing="attention"."""
    try:
        Config(model="tiny", checkpointing="attention")
    except ConfigError as e:
        return False, (f"this labkit does not have checkpointing='attention' yet ({e}); the cell below runs once "
                       "the engine gains it")
    return True, "checkpointing='attention' recomputes each block's attention core (the T×T part) in backward"


def attention_recompute(base: Config, seq_lens, batch: int = 2, n_threads: int | None = 1) -> list:
    """Under the math backend: activation bytes with and without checkpointing='attention', and the FLOPs
    the recompute adds (hardware over model FLOPs, counted), at each sequence length.

    ``core_flops_ratio`` is what rerunning the whole attention core would cost (4·T²·d per block and
    sequence: the scores and the product with V, counted like FlopCounterMode, non-causal). The count comes
    out lower: PyTorch's non-reentrant checkpoint stops recomputing once it has rebuilt the last tensor
    backward needs (softmax's output), so the product with V is never rerun."""
    dev = torch_device(capabilities(base.device).kind)
    rows = []
    with intra_op_threads(n_threads):
        for T in seq_lens:
            plain = base.replace(seq_len=T, attention="math", checkpointing="none")
            recomp = plain.replace(checkpointing="attention")
            a0, _ = activation_bytes(plain, dev, batch=batch)
            a1, _ = activation_bytes(recomp, dev, batch=batch)
            model_f = count_flops(plain.spec)
            hw_f = count_flops(recomp.spec, "attention", recomp.checkpoint_every)
            s = plain.spec
            core = s.n_layer * 4 * T * T * s.d_model  # the attention core's forward, one sequence
            rows.append({"seq_len": T, "bytes_none": a0, "bytes_attention": a1, "saved_frac": 1 - a1 / a0,
                         "flops_ratio": hw_f / model_f, "core_flops_ratio": 1 + core / model_f})
    return rows


# ---- the first two updates: where AdamW's state appears -----------------------------------------------


class _Counter:
    """Bytes of the tensors held at a moment, by role: counted storage by storage on a CPU; on CUDA also
    what the allocator says (memory_allocated)."""

    def __init__(self, model, opt, dev):
        self.model, self.opt, self.dev = model, opt, dev

    def weights(self) -> int:
        return state_bytes(self.model.parameters())

    def grads(self) -> int:
        return state_bytes(p.grad for p in self.model.parameters())

    def optimizer(self) -> int:
        return sum(state_bytes(s.values()) for s in self.opt.state.values())

    def allocated(self):
        return torch.cuda.memory_allocated(self.dev) if self.dev.type == "cuda" else None


def _forward_backward(model, x, y, kind: str, precision: str, dev) -> tuple:
    """Forward then backward of one batch: (bytes the forward pass left for backward, peak bytes held during
    both on top of what existed before). CUDA: the allocator's numbers; elsewhere labkit's dispatch tracer
    (every storage an op made, from its birth to its death)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        with autocast(kind, precision):
            loss = model(x, y)
        acts = torch.cuda.memory_allocated(dev) - base
        loss.backward()
        torch.cuda.synchronize(dev)
        return acts, torch.cuda.max_memory_allocated(dev) - base
    tracer = Tracer(model)
    with tracer:
        with autocast(kind, precision):
            loss = model(x, y)
        tracer.end_forward()
        acts = sum(r["bytes"] for r in tracer.finish(model).kept(include_weight_copies=True))
        loss.backward()
        del loss
        trace = tracer.finish(model)
    return acts, trace.peak_bytes()


def _step_peak(opt, model, dev) -> int:
    """``opt.step()``; the peak bytes it held on top of what existed (its new state and temporaries)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        opt.step()
        torch.cuda.synchronize(dev)
        return torch.cuda.max_memory_allocated(dev) - base
    tracer = Tracer(model)
    with tracer:
        opt.step()
        trace = tracer.finish(model)
    return trace.peak_bytes()


def first_updates(config: Config, updates: int = 2, n_threads: int | None = 1) -> dict:
    """Train ``updates`` updates of ``config`` by hand and record, after each phase, the bytes of the
    weights, gradients, optimizer state and activations, and each update's peak.

    The optimizer's state is created inside the first ``step()``: the second update's forward and
    backward run with it already in memory, so its peak is higher by that much. CUDA: the allocator's
    numbers; CPU: counted storage by storage."""
    kind = capabilities(config.device).kind
    dev = torch_device(kind)
    moments, peaks, where = [], {}, {}
    with intra_op_threads(n_threads):
        torch.manual_seed(config.seed)
        model = GPT(config.spec, config.dropout, config.checkpointing, config.checkpoint_every).to(dev)
        opt = make_optimizer(config, model.parameters())
        batches = iter(make_loader(config)[0])
        c = _Counter(model, opt, dev)

        def moment(label, activations=0):
            moments.append({"moment": label, "weights": c.weights(), "grads": c.grads(), "optimizer": c.optimizer(),
                            "activations": activations, "allocated": c.allocated()})

        moment("model built")
        for u in range(1, updates + 1):
            x, y = (t.to(dev) for t in next(batches))
            start = {"weights": c.weights(), "grads": c.grads(), "optimizer": c.optimizer()}  # forward starts with
            acts, fb_peak = _forward_backward(model, x, y, kind, config.precision, dev)
            moments.append({"moment": f"update {u}: forward done", **start, "activations": acts, "allocated": None})
            moment(f"update {u}: backward done")
            held = c.weights() + c.grads() + c.optimizer()  # what the optimizer step starts with
            opt_peak = _step_peak(opt, model, dev)
            moment(f"update {u}: optimizer step done")
            opt.zero_grad(set_to_none=True)  # once per update, as the engine does
            moments[-1]["grads"] = c.grads()
            # the update's peak is in its forward/backward or in its optimizer step: say which
            fb, step = sum(start.values()) + fb_peak, held + opt_peak
            peaks[f"update {u}"] = max(fb, step)
            where[f"update {u}"] = {"forward and backward": fb, "optimizer step": step}
    n = sum(p.numel() for p in model.parameters())
    del model, opt
    return {"moments": moments, "peaks": peaks, "peak_phases": where, "n_params": n, "device": kind,
            "source": "the CUDA allocator (memory_allocated)" if kind == "cuda" else
            "tensors counted storage by storage (labkit's dispatch tracer)"}


def update_peaks(result: dict) -> tuple:
    """(peak of update 1, peak of update 2, the difference) from ``first_updates``."""
    p1, p2 = result["peaks"]["update 1"], result["peaks"]["update 2"]
    return p1, p2, p2 - p1


def peak_phase(result: dict, update: int) -> str:
    """Where update ``update``'s peak was: 'forward and backward' or 'optimizer step'."""
    parts = result["peak_phases"][f"update {update}"]
    return max(parts, key=parts.get)


def explain_update_peaks(result: dict) -> str:
    """The step-2 story told from ``first_updates``' numbers: how much higher update 2's peak is, and why
    that is all of AdamW's state only when update 1's peak was in its forward and backward (bytes per
    parameter are left for the learner to work out)."""
    mib = 2**20
    p1, p2, extra = update_peaks(result)
    state = result["moments"][-1]["optimizer"]
    w1, w2 = peak_phase(result, 1), peak_phase(result, 2)
    head = (f"Peak of update 1: **{p1 / mib:.1f} MiB** (in its {w1}); of update 2: **{p2 / mib:.1f} MiB** (in its "
            f"{w2}) — **{extra / mib:.1f} MiB** more. AdamW's state: {state / mib:.1f} MiB.")
    if w1 == w2 == "forward and backward":
        return (head + " Both peaks came in forward and backward, and update 2's ran with the state already in "
                f"memory: the difference is the whole state ({extra / state:.0%} of it).")
    if w1 == "optimizer step" and w2 == "forward and backward":
        grads = max(m["grads"] for m in result["moments"])
        below = p1 - result["peak_phases"]["update 1"]["forward and backward"]
        return (head + f" Update 1's peak came in its optimizer step, where its gradients ({grads / mib:.1f} MiB) "
                "and the state it was creating were held together; update 2's forward and backward, with the state "
                f"in memory, went above that by {extra / mib:.1f} MiB — {extra / state:.0%} of the state. Update 1's "
                f"own forward and backward stayed {below / mib:.1f} MiB below its step: with that much more "
                "activation memory (a larger batch, longer sequences) its peak moves into forward and backward, "
                "and the difference becomes the whole state.")
    return (head + " For this model and batch the activations are smaller than the gradients plus the optimizer's "
            "temporaries, so the first optimizer step — which already holds the new state — sets the peak; update 2 "
            "adds little to it.")


# ---- the CUDA caching allocator ---------------------------------------------------------------------------


def allocator_stats(device=None) -> dict:
    """The caching allocator's view (CUDA only): bytes handed to tensors (allocated), bytes held from the
    driver (reserved), cached-but-unusable splits (inactive_split), retries and segments."""
    if not torch.cuda.is_available():
        raise RuntimeError("allocator statistics come from the CUDA caching allocator; this machine has no CUDA GPU")
    s = torch.cuda.memory_stats(device)
    alloc = s.get("allocated_bytes.all.current", 0)
    reserved = s.get("reserved_bytes.all.current", 0)
    return {"allocated": alloc, "reserved": reserved, "peak_allocated": s.get("allocated_bytes.all.peak", 0),
            "peak_reserved": s.get("reserved_bytes.all.peak", 0),
            "inactive_split": s.get("inactive_split_bytes.all.current", 0),
            "segments": s.get("segment.all.current", 0), "alloc_retries": s.get("num_alloc_retries", 0),
            "ooms": s.get("num_ooms", 0), "fragmentation": 1 - alloc / reserved if reserved else 0.0}


def _fragment(step_mib: int = 24, count: int = 24, big_mib: int = 512) -> dict:
    """Allocate tensors of growing sizes, free every other one, then ask for one larger than any hole:
    the holes stay reserved and the big tensor needs new memory (CUDA, this process)."""
    dev = torch.device("cuda", 0)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    mib = 2**20
    keep = [torch.empty((i + 1) * step_mib * mib, dtype=torch.uint8, device=dev) for i in range(count)]
    for i in range(0, count, 2):
        keep[i] = None  # free every other tensor: holes of growing sizes between live ones
    holes = allocator_stats(dev)
    big = torch.empty(big_mib * mib, dtype=torch.uint8, device=dev)
    after = allocator_stats(dev)
    del big, keep
    torch.cuda.synchronize(dev)
    return {"after_freeing_every_other": holes, "after_big_tensor": after,
            "settings": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}


def fragmentation_demo(expandable: bool, timeout_s: float = 120.0) -> dict:
    """Run the fragmentation pattern in a fresh Python process with ``PYTORCH_CUDA_ALLOC_CONF`` set
    (``expandable_segments:True`` or not): the allocator reads it when CUDA starts, so a process of its
    own is the documented way to switch it."""
    if not torch.cuda.is_available():
        raise RuntimeError("the caching allocator's segments exist on CUDA only; this machine has no CUDA GPU")
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=f"expandable_segments:{'True' if expandable else 'False'}")
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, "-m", "labkit.memlab", "--fragment"], capture_output=True, text=True,
                         env=env, timeout=timeout_s, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"the allocator demo failed (exit {out.returncode}): {out.stderr.strip()[-400:]}")
    return {"expandable_segments": expandable, **json.loads(lines[-1])}


def record_cuda_history(config: Config, path, steps: int = 2, max_entries: int = 200_000) -> str:
    """Run ``steps`` updates of ``config`` with the CUDA allocator recording every allocation and free,
    and write the snapshot to ``path`` (a pickle: drag it onto https://pytorch.org/memory_viz)."""
    if capabilities(config.device).kind != "cuda":
        raise RuntimeError("the allocator's history is a CUDA feature (torch.cuda.memory._record_memory_history)")

    rec = torch.cuda.memory._record_memory_history
    rec(max_entries=max_entries)
    try:
        run(config.replace(steps=steps, warmup=min(config.warmup, steps - 1)))
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        rec(enabled=None)  # stop recording: it costs time on every allocation
    return str(path)


# ---- bytes per parameter of three mixed-precision recipes ---------------------------------------------------

# recipe -> what it keeps per parameter, in words (the measurement counts the real tensors)
RECIPES = {
    "autocast": "fp32 weights (4) + fp32 gradients (4) + AdamW m, v in fp32 (8); autocast's 16-bit weight copies "
                "live only during forward/backward",
    "16-bit weights + fp32 master": "16-bit weights (2) + 16-bit gradients (2) + fp32 master weights (4) + "
                                    "AdamW m, v (8)",
    "16-bit weights + fp32 master + fp32 grad accumulation": "as above + an fp32 gradient accumulator (4) that "
                "each micro-batch's 16-bit .grad is added into; the 16-bit .grad stays allocated beside it",
}


def _half_dtype(kind: str):
    """bf16 where the hardware runs it (compute capability 8.0+ on CUDA; any CPU), else fp16."""
    if kind == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        return torch.float16
    return torch.bfloat16


def _one_update_autocast(config, dev, x, y, half):
    """labkit's engine: fp32 weights, autocast makes 16-bit copies for the matmuls, AdamW steps the fp32 weights."""
    torch.manual_seed(config.seed)
    model = GPT(config.spec).to(dev)
    opt = make_optimizer(config, model.parameters())
    with autocast(dev.type, "bf16" if half == torch.bfloat16 else "fp16"):
        loss = model(x, y)
    loss.backward()
    opt.step()
    return {"weights": state_bytes(model.parameters()), "grads": state_bytes(p.grad for p in model.parameters()),
            "master": 0, "accumulator": 0, "optimizer": sum(state_bytes(s.values()) for s in opt.state.values())}, \
        model, _step_counter_bytes(opt)


def _one_update_master(config, dev, x, y, half, accumulate_fp32: bool, micro: int = 2):
    """16-bit model weights; the optimizer steps fp32 master copies. With ``accumulate_fp32`` each
    micro-batch's 16-bit .grad is added into an fp32 buffer, which the master weights use as their gradient,
    and the 16-bit .grad stays allocated beside it (the accounting of the Ultra-Scale Playbook's memory table).
    Megatron Core's distributed optimizer instead has backward add straight into an fp32 main_grad and keeps
    no 16-bit .grad: its documentation counts 18 bytes per parameter for that (16-bit params, fp32 grads)."""
    torch.manual_seed(config.seed)
    model = GPT(config.spec).to(dev).to(half)
    params = list(model.parameters())
    master = [p.detach().float().clone().requires_grad_() for p in params]
    opt = torch.optim.AdamW(master, lr=config.lr, weight_decay=0.01)
    acc = [torch.zeros_like(m) for m in master] if accumulate_fp32 else None
    for _ in range(micro):
        (model(x, y) / micro).backward()
        if acc is not None:
            for a, p in zip(acc, params):
                a.add_(p.grad.float())  # fp32 sums: small 16-bit gradients are not lost in the addition
                p.grad.zero_()          # the 16-bit buffer stays allocated for the next micro-batch
    for m, p, a in zip(master, params, acc or [None] * len(params)):
        m.grad = a if a is not None else p.grad.float()
    opt.step()
    with torch.no_grad():
        for m, p in zip(master, params):
            p.copy_(m)  # the updated master weights, rounded to 16 bits for the next forward
    held = {"weights": state_bytes(params), "grads": state_bytes(p.grad for p in params),
            "master": state_bytes(master), "accumulator": state_bytes(acc or []),
            "optimizer": sum(state_bytes(s.values()) for s in opt.state.values())}
    return held, model, _step_counter_bytes(opt)


def _step_counter_bytes(opt) -> int:
    """Bytes of AdamW's step counters (one small tensor per parameter tensor), part of its state."""
    return state_bytes(s["step"] for s in opt.state.values() if "step" in s)


def bytes_per_param(config: Config, n_threads: int | None = 1) -> list:
    """Each recipe of RECIPES trained for one update on ``config``'s model: the bytes of the tensors it
    keeps between updates, by role, counted; and per parameter. ``step_counter_bytes``: the part of the
    optimizer's bytes that is AdamW's step counters."""
    kind = capabilities(config.device).kind
    dev = torch_device(kind)
    half = _half_dtype(kind)
    rows = []
    with intra_op_threads(n_threads):
        x, y = (t.to(dev) for t in next(iter(make_loader(config)[0])))
        for name in RECIPES:
            if name == "autocast":
                held, model, counters = _one_update_autocast(config, dev, x, y, half)
            else:
                held, model, counters = _one_update_master(config, dev, x, y, half,
                                                           accumulate_fp32="accumulation" in name)
            n = sum(p.numel() for p in model.parameters())
            total = sum(held.values())
            rows.append({"recipe": name, **held, "total": total, "n_params": n, "bytes_per_param": total / n,
                         "half": str(half).replace("torch.", ""), "step_counter_bytes": counters,
                         "param_tensors": len(list(model.parameters()))})
            del model
    return rows


def run_memory(config: Config) -> dict:
    """What one engine run of ``config`` held: weights, gradients and optimizer state (bytes, from the run's
    summary) and the activations kept for backward, counted at the run's micro-batch.

    The engine's summary counts one sequence's activations and multiplies by the micro-batch; under
    attention="math" one sequence keeps scaled copies of q and k as well (see seq_sweep), so the count here
    runs the whole micro-batch. ``engine_activation_bytes`` keeps the summary's own figure."""
    s = run(config.replace(steps=1, warmup=0)).summary
    parts = {k: s[k] or 0 for k in ("param_bytes", "grad_bytes", "optimizer_bytes")}
    with intra_op_threads(config.threads):
        acts, _ = activation_bytes(config, torch_device(capabilities(config.device).kind), batch=config.micro_batch)
    parts["activation_bytes"] = acts
    return {**parts, "total": sum(parts.values()), "n_params": s["n_params"],
            "engine_activation_bytes": s["activation_bytes"]}


# ---- pictures -----------------------------------------------------------------------------------------------


def _figure(width: float, height: float):
    return figure(width, height)


def plot_seq_sweep(rows, width: float = 6.0, height: float = 3.0):
    """Measured activation bytes against T (dots) and the formula (lines), one colour per backend, on linear
    axes so that the math backend's T² term shows as a bend."""
    fig = _figure(width, height)
    ax = fig.add_subplot()
    colors = {"auto": "#4c72b0", "math": "#c44e52", "flash": "#4c72b0"}
    for att in dict.fromkeys(r["attention"] for r in rows):
        pts = [r for r in rows if r["attention"] == att]
        xs = [r["seq_len"] for r in pts]
        ax.plot(xs, [r["measured_bytes"] / 2**20 for r in pts], "o", color=colors.get(att, "#555555"),
                label=f"{att}: measured")
        ax.plot(xs, [r["formula_total"] / 2**20 for r in pts], "-", color=colors.get(att, "#555555"), lw=1,
                label=f"{att}: formula")
    lens = sorted({r["seq_len"] for r in rows})
    ax.set_xticks(lens, [str(t) for t in lens])  # linear axes: a straight line is linear in T, a bend is T²
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("sequence length T", fontsize=8)
    ax.set_ylabel("activation MiB kept for backward", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
    return fig


ROLE_COLORS = {"weights": "#4c72b0", "master": "#64b5cd", "grads": "#dd8452", "accumulator": "#ccb974",
               "optimizer": "#55a868", "activations": "#c44e52"}


def plot_first_updates(result: dict, width: float = 9.0, height: float = 3.0):
    """Stacked bytes by role after each phase of the first updates, with each update's peak as a line."""
    fig = _figure(width, height)
    ax = fig.add_subplot()
    ms = result["moments"]
    bottom = [0.0] * len(ms)
    for role in ("weights", "optimizer", "grads", "activations"):
        vals = [m[role] / 2**20 for m in ms]
        ax.bar(range(len(ms)), vals, bottom=bottom, color=ROLE_COLORS[role], label=role)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, (name, peak) in enumerate(result["peaks"].items()):
        idx = [j for j, m in enumerate(ms) if m["moment"].startswith(name + ":")]
        if idx:
            ax.hlines(peak / 2**20, idx[0] - 0.4, idx[-1] + 0.4, colors="#222222", linestyles="--", lw=1)
            ax.text(idx[0] - 0.4, peak / 2**20, f" peak of {name}", fontsize=7, va="bottom")
    ax.set_xticks(range(len(ms)), [m["moment"].replace(": ", "\n") for m in ms], fontsize=7)
    ax.set_ylabel("MiB", fontsize=8)
    ax.set_ylim(0, max(result["peaks"].values()) / 2**20 * 1.2)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(f"held bytes by role ({result['source']})", fontsize=9)
    return fig


def plot_bytes_per_param(rows, width: float = 6.5, height: float = 2.4):
    """One horizontal stacked bar per recipe: bytes per parameter by role."""
    fig = _figure(width, height)
    ax = fig.add_subplot()
    for i, r in enumerate(rows):
        left = 0.0
        for role in ("weights", "grads", "master", "accumulator", "optimizer"):
            v = r[role] / r["n_params"]
            if v:
                ax.barh(i, v, left=left, color=ROLE_COLORS[role], label=role if role not in
                        {t.get_label() for t in ax.patches} else None)
                ax.text(left + v / 2, i, f"{v:.0f}", ha="center", va="center", fontsize=7, color="white")
            left += v
    ax.set_yticks(range(len(rows)), [r["recipe"] for r in rows], fontsize=7)
    ax.set_xlabel("bytes per parameter kept between updates", fontsize=8)
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    fig.legend(seen.values(), seen.keys(), fontsize=7, loc="outside lower center", ncols=5)
    ax.invert_yaxis()
    return fig


if __name__ == "__main__":  # the allocator demo's own process (fragmentation_demo)
    if "--fragment" in sys.argv:
        print(json.dumps(_fragment()))
