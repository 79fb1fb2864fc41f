"""Bytes per parameter of three mixed-precision recipes, counted tensor by tensor, and what one engine run
held (taught in chapter 08).

    rows = memlab.bytes_per_param(config)    # autocast, 16-bit + fp32 master, + fp32 grad accumulation
    memlab.run_memory(config)                # weights, gradients, optimizer state and activations of a run
"""
from __future__ import annotations

import torch

from ...engine.config import Config, ConfigError
from ...engine.data import make_loader
from ...engine.device import capabilities, intra_op_threads, torch_device
from ...engine.measure import activation_bytes, state_bytes
from ...engine.model import GPT
from ...engine.precision import autocast
from ...engine.tracer import Tracer
from ...engine.step import make_optimizer
from ...engine.train import run
from ._common import _config, _threads
from ..course import table  # rows that show themselves as a markdown table
from ..measured import grading_tool



# the recipes measured, in order: what each keeps per parameter is chapter 08's markdown (the measurement counts
# the real tensors): autocast 4 + 4 + 8; 16-bit weights + fp32 master 2 + 2 + 4 + 8; with an fp32 accumulator + 4
RECIPES = ("autocast", "16-bit weights + fp32 master", "16-bit weights + fp32 master + fp32 grad accumulation")


def _half_dtype(kind: str):
    """bf16 where the hardware runs it (compute capability 8.0+ on CUDA; any CPU), else fp16."""
    if kind == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        return torch.float16
    return torch.bfloat16


def _one_update_autocast(config, dev, x, y, half):
    """labkit's engine: fp32 weights, autocast makes 16-bit copies for the matmuls, AdamW steps the fp32 weights.
    Returns (bytes by role, every tensor the recipe keeps until its next update)."""
    torch.manual_seed(config.seed)
    model = GPT(config.spec).to(dev)
    opt = make_optimizer(config, model.parameters())
    with autocast(dev.type, "bf16" if half == torch.bfloat16 else "fp16"):
        loss = model(x, y)
    loss.backward()
    opt.step()
    return {"weights": state_bytes(model.parameters()), "grads": state_bytes(p.grad for p in model.parameters()),
            "master": 0, "accumulator": 0, "optimizer": sum(state_bytes(s.values()) for s in opt.state.values())}, \
        {"model": model, "opt": opt}


def _one_update_master(config, dev, x, y, half, accumulate_fp32: bool, micro: int = 2):
    """16-bit model weights; the optimizer steps fp32 master copies. With ``accumulate_fp32`` each
    micro-batch's 16-bit .grad is added into an fp32 buffer, which the master weights use as their gradient,
    and the 16-bit .grad stays allocated beside it (the accounting of the Ultra-Scale Playbook's memory table).
    Megatron Core's distributed optimizer instead has backward add straight into an fp32 main_grad and keeps
    no 16-bit .grad: its documentation counts 18 bytes per parameter for that (16-bit params, fp32 grads).
    Returns (bytes by role, every tensor the recipe keeps until its next update)."""
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
            m.grad = None  # the fp32 gradient copy is transient (ZeRO's accounting); the accumulator lives on in acc
    held = {"weights": state_bytes(params), "grads": state_bytes(p.grad for p in params),
            "master": state_bytes(master), "accumulator": state_bytes(acc or []),
            "optimizer": sum(state_bytes(s.values()) for s in opt.state.values())}
    return held, {"model": model, "master": master, "opt": opt, "acc": acc}


def _step_counter_bytes(opt) -> int:
    """Bytes of AdamW's step counters (one small tensor per parameter tensor), part of its state."""
    return state_bytes(s["step"] for s in opt.state.values() if "step" in s)


def _traced(recipe, config, dev, x, y, *args) -> tuple:
    """Run one recipe's update under labkit's tracer: (bytes by role, the kept tensors, the bytes of every
    storage the update made that is still alive while they are kept -- what the process really holds, so a
    tensor the roles forget, such as a gradient copy never freed, shows up as a difference)."""
    tracer = Tracer(torch.nn.Module(), exclude=(x, y))  # the recipe makes every other tensor itself
    with tracer:
        held, kept = recipe(config, dev, x, y, *args)
        alive = sum(tracer.alive_bytes())
    return held, kept, alive


def bytes_per_param(config: Config, n_threads: int | None = 1) -> list:
    """Each recipe of RECIPES trained for one update on ``config``'s model: the bytes of the tensors it
    keeps between updates, by role, counted; and per parameter. ``traced_bytes``: every byte the update's
    own tensors still hold afterwards (labkit's tracer) -- equal to ``total`` when nothing is left uncounted.
    ``step_counter_bytes``: the part of the optimizer's bytes that is AdamW's step counters."""
    _config(config)
    _threads(n_threads)
    kind = capabilities(config.device).kind
    dev = torch_device(kind)
    half = _half_dtype(kind)
    rows = []
    with intra_op_threads(n_threads):
        x, y = (t.to(dev) for t in next(iter(make_loader(config)[0])))
        for name in RECIPES:
            if name == "autocast":
                held, kept, alive = _traced(_one_update_autocast, config, dev, x, y, half)
            else:
                held, kept, alive = _traced(_one_update_master, config, dev, x, y, half, "accumulation" in name)
            model = kept["model"]
            n = sum(p.numel() for p in model.parameters())
            total = sum(held.values())
            rows.append({"recipe": name, **held, "total": total, "traced_bytes": alive, "n_params": n,
                         "bytes_per_param": total / n, "half": str(half).replace("torch.", ""),
                         "step_counter_bytes": _step_counter_bytes(kept["opt"]),
                         "param_tensors": len(list(model.parameters()))})
            del model, kept
    return rows


def run_memory(config: Config) -> dict:
    """What one engine run of ``config`` held: weights, gradients and optimizer state (bytes, from the run's
    summary) and the activations kept for backward, counted at the run's micro-batch.

    The engine's summary counts one sequence's activations and multiplies by the micro-batch; under
    attention="math" one sequence keeps scaled copies of q and k as well (see seq_sweep), so the count here
    runs the whole micro-batch. ``engine_activation_bytes`` keeps the summary's own figure."""
    _config(config)
    s = run(config.replace(steps=1, warmup=0)).summary
    parts = {k: s[k] or 0 for k in ("param_bytes", "grad_bytes", "optimizer_bytes")}
    with intra_op_threads(config.threads):
        acts, _ = activation_bytes(config, torch_device(capabilities(config.device).kind), batch=config.micro_batch)
    parts["activation_bytes"] = acts
    return {**parts, "total": sum(parts.values()), "n_params": s["n_params"],
            "engine_activation_bytes": s["activation_bytes"]}


# ---- what the chapter's cells draw from these counts (rows and figures; the words are the chapter's) -------

def bpp_table(rows: list) -> list:
    """Bytes per parameter of each recipe, role by role, and any bytes the tracer found alive that no role
    counts (``untracked``: 0.00 when every byte is accounted for)."""
    keys = ("weights", "grads", "master", "accumulator", "optimizer")
    per = [{"recipe": r["recipe"], **{k: r[k] / r["n_params"] for k in keys}, "total": r["bytes_per_param"],
            "untracked": (r["traced_bytes"] - r["total"]) / r["n_params"]} for r in rows]
    return table(per, [("recipe", "recipe", "{}"), ("weights", "weights", "{:.2f}"), ("grads", "gradients", "{:.2f}"),
                       ("master", "master", "{:.2f}"), ("accumulator", "accumulator", "{:.2f}"),
                       ("optimizer", "AdamW", "{:.2f}"), ("total", "bytes per parameter", "{:.2f}"),
                       ("untracked", "alive, in no role", "{:.2f}")])


def budget_beside_run(calculator, config: Config) -> dict:
    """The learner's calculator for ``config`` beside what one run of it held (one thread), in bytes:
    {"graded": False, "predicted", "run"}. While a grader runs the notebook nothing is called (the exercise is
    graded from the learner's saved measurements, and the grader's CPU measures nothing for it):
    {"graded": True}."""
    _config(config)
    if not callable(calculator):
        raise ConfigError("calculator", calculator, "your budget function, e.g. my_budget")
    if grading_tool() is not None:
        return {"graded": True, "predicted": None, "run": None}
    return {"graded": False, "predicted": calculator(config), "run": run_memory(config.replace(threads=1))["total"]}
