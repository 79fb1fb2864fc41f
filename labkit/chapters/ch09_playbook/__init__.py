"""Chapter 09's room (the playbook): a measured grid search and its Pareto front (``search``), convergence
on a token budget and the critical batch size (``batch``); and here, what to do when a model still does not
fit -- ZeRO's stages, offloading and 8-bit Adam on ``whatif.layouts``'s byte counts, whether each fits a card
-- and a small FSDP demo: a GPT sharded with ``fully_shard`` over a few CPU processes (gloo), what each rank
holds against a full replica, its losses beside one process on the whole batch.

    pb.smallest_fix(13e9, 8, 80e9, 20e9)                                 # 'zero2': the least intrusive fit
    demo = pb.fsdp_demo(model="tiny", world_size=2, micro_batch=4, steps=3)

The FSDP ranks are started, watched and reaped by the engine's launcher (``engine.launch.spawn_ranks``): a
FileStore in a private folder (no listening port), the loopback interface only; none outlives the call.
"""
from __future__ import annotations

import textwrap
import time

import torch
import torch.distributed as dist

from ...base.compat import has, message
from ...base.runtime import ConfigError, RunError
from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS, _choice, real, whole
from ...engine.ddp import demo_batches, local_bytes, shard
from ...engine.launch import spawn_ranks
from ...engine.model import GPT
from ...whatif.layouts import (GRAD_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES,  # noqa: F401 -- pb.*
                              activation_bytes_estimate, state_bytes_per_gpu)
from ..course import table  # rows that show themselves as a markdown table
from .batch import (batch_rows, convergence_rows, critical_batch_chart, critical_batch_estimate,  # noqa: F401
                    critical_batch_fit, critical_batch_rows, final_loss, fit_verdict, grows_as_loss_falls,
                    interval_shape, loss_chart, loss_targets, lr_chart, monotone_fit, run_noise, steps_to_target,
                    tokens_seen)
from .search import (KNOB_KEYS, best_within, config_of, faster, fixed_digits, grid, grid_search,  # noqa: F401
                     label, launch_bound, measured, memory_of, pareto_chart, pareto_front, predicted_ms,
                     predicted_table, reference_rows, row_from_summary, row_list, run_scatter, saved_pick,
                     table_rows, within_scatter)


GB = 1e9  # datasheets quote decimal gigabytes ("80 GB"); the charts of measured bytes use MiB/GiB

# the remedies, least intrusive first (chapter 09's markdown table says what each keeps and costs)
REMEDIES = ("ddp", "zero1", "zero2", "zero3", "zero3+offload_optimizer", "zero3+offload_params")


def zero_bytes_per_gpu(n_params: float, n_gpus: int, stage: int) -> float:
    """Model-state bytes per GPU for mixed-precision Adam under ZeRO ``stage`` (16 bytes/param at 0)."""
    return state_bytes_per_gpu(n_params, n_gpus, stage)["total"]


def remedies(n_params: float, n_gpus: int, gpu_bytes: float, activation_bytes: float = 0.0,
             optimizer: str = "adam") -> list:
    """One row per option, least intrusive first: bytes per GPU (states + activations) and whether
    it fits in ``gpu_bytes``. Offloading needs ``cpu`` bytes of host memory per rank."""
    real("gpu_bytes", gpu_bytes, strict=True)
    real("activation_bytes", activation_bytes)
    rows = []
    for name in REMEDIES:
        stage = {"ddp": 0, "zero1": 1, "zero2": 2}.get(name, 3)
        st = state_bytes_per_gpu(n_params, n_gpus, stage, optimizer,
                                 offload_optimizer="offload" in name, offload_params=name.endswith("params"))
        total = st["total"] + activation_bytes
        rows.append({"remedy": name, **st, "activations": activation_bytes,
                     "per_gpu": total, "fits": total <= gpu_bytes})
    return rows


def remedies_rows(models: dict, n_gpus: int, gpu_bytes: float) -> list:
    """Model state only (no activations), bytes per GPU: one row per model (``models``: {name: parameters}),
    one column per remedy and 8-bit Adam with ZeRO-2. Full offload leaves no model state on the GPU: its 0 is
    shown as "≈0 (CPU memory)" rather than a bare 0.0 that would read as a broken cell."""
    if not isinstance(models, dict) or not models:
        raise ConfigError("models", models, "{name: number of parameters}, e.g. {'7 B': 7e9}")
    rows = []
    for name, n in models.items():
        row = {"model": name, **{r["remedy"]: r["total"] for r in remedies(n, n_gpus, gpu_bytes)}}
        row["adam8bit+zero2"] = state_bytes_per_gpu(n, n_gpus, stage=2, optimizer="adam8bit")["total"]
        rows.append(row)
    heads = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
             "zero3+offload_optimizer": "+ offload optimizer", "zero3+offload_params": "+ offload params",
             "adam8bit+zero2": "8-bit Adam + ZeRO-2"}
    return table(rows, [("model", "model", "{}")] + [(k, h + " (GB)", _gb) for k, h in heads.items()])


def _gb(b: float) -> str:
    return f"{b / GB:,.1f}" if b else "≈0 (CPU memory)"


def smallest_fix(n_params: float, n_gpus: int, gpu_bytes: float, activation_bytes: float = 0.0,
                 optimizer: str = "adam"):
    """The least intrusive option that fits (None when even full offload does not)."""
    fits = (r["remedy"] for r in remedies(n_params, n_gpus, gpu_bytes, activation_bytes, optimizer) if r["fits"])
    return next(fits, None)


def _tick_words(remedy: str) -> str:
    """'zero3+offload_optimizer' -> 'zero3 +\noffload\noptimizer': at ~10 characters a line each option's
    label stays inside its own bar's width at the chart's 6.4 in, apart from its neighbours'."""
    return "\n".join(textwrap.wrap(remedy.replace("+", " + ").replace("_", " "), 10))


def remedy_chart(rows: list, gpu_bytes: float, title: str = "", ax=None):
    """Stacked bars of bytes per GPU for each option, the card's memory as a dashed line."""
    from ...tools import plots  # deferred: matplotlib is optional; loaded only to draw

    if not row_list("rows", rows):
        raise ConfigError("rows", rows, "at least one option, e.g. remedies(...)")
    real("gpu_bytes", gpu_bytes, strict=True)
    if ax is None:
        ax = plots.new_figure(6.4, 3.0).add_subplot()
    fig = ax.figure
    names = [_tick_words(r["remedy"]) for r in rows]
    bottom = [0.0] * len(rows)
    for key, words, color in (("params", "weights", plots.COLORS["param_bytes"]),
                              ("grads", "gradients", plots.COLORS["grad_bytes"]),
                              ("optimizer", "optimizer", plots.COLORS["optimizer_bytes"]),
                              ("activations", "activations", plots.COLORS["activation_bytes"])):
        vals = [r[key] / GB for r in rows]
        ax.bar(names, vals, bottom=bottom, color=color, label=words)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(gpu_bytes / GB, ls="--", color="#222222", lw=1)
    ax.text(len(rows) - 0.5, gpu_bytes / GB, f" GPU {gpu_bytes / GB:.0f} GB", va="bottom", ha="right",
            fontsize=plots.FONT)
    ax.set_ylabel("GB per GPU", fontsize=plots.FONT)
    ax.set_title(title or "Memory per GPU, by option", fontsize=plots.TITLE)
    ax.tick_params(labelsize=plots.FONT)
    ax.legend(fontsize=plots.FONT, loc="upper right")
    return fig


# ---- FSDP on a few CPU processes -----------------------------------------------------------------

def _train(model, spec, batch: int, steps: int, seed: int, mine: slice = slice(None), world_size: int = 1):
    """AdamW on the demo's batches, each step on the ``mine`` slice of the batch -- the one loop of the FSDP
    ranks and the single process alike. Returns (losses, the optimizer, gradient bytes after the last
    backward); with ``world_size`` > 1 each loss is the mean over the ranks."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    losses, grads = [], 0
    for x, y in demo_batches(spec, batch, steps, seed):
        loss = model(x[mine], y[mine])
        loss.backward()  # under FSDP a reduce-scatter: each rank keeps the averaged gradient of its shard
        grads = local_bytes(p.grad for p in model.parameters())
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.detach().clone()
        if world_size > 1:
            dist.all_reduce(loss)  # every rank's loss on its slice, summed: the whole batch's mean below
        losses.append(float(loss) / world_size)
    return losses, opt, grads


def _fsdp_rank(rank, spec, micro_batch: int, steps: int, seed: int) -> dict:
    """A spawned FSDP rank (``rank``: the launcher's Rank): shard a GPT with ``shard``, train on its
    slice of each batch, and report the bytes it holds."""
    torch.set_num_threads(1)  # the ranks share this machine's cores
    # the engine's way: the launcher's FileStore (no listening port) and gloo on the loopback interface only
    with ddp_mod.process_group("cpu", rank.rank, rank.world_size, rank.file_store()):
        torch.manual_seed(seed)
        model = GPT(spec)
        full_params = local_bytes(model.parameters())
        shard(model)  # fp32 throughout: the losses must match one process's exactly
        mine = slice(rank.rank * micro_batch, (rank.rank + 1) * micro_batch)
        losses, opt, grads = _train(model, spec, micro_batch * rank.world_size, steps, seed, mine, rank.world_size)
        opt_bytes = sum(local_bytes(v for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
                        for st in opt.state.values())
        return dict(param_bytes=local_bytes(model.parameters()), grad_bytes=grads, optimizer_bytes=opt_bytes,
                    full_param_bytes=full_params, losses=losses)


def single_process_losses(spec, batch: int, steps: int, seed: int = 0) -> list:
    """The same training as the FSDP demo, in one process on the whole batch: the losses to match."""
    if spec not in PRESETS.values() and not hasattr(spec, "n_layer"):
        raise ConfigError("spec", spec, "a model shape such as lk.PRESETS['tiny']")
    whole("batch", batch)
    whole("steps", steps)
    whole("seed", seed, 0)
    torch.manual_seed(seed)
    return _train(GPT(spec), spec, batch, steps, seed)[0]


def fsdp_demo(model: str = "tiny", world_size: int = 2, micro_batch: int = 4, steps: int = 3, seed: int = 0,
              timeout_s: float = 120.0) -> dict:
    """Train a GPT under FSDP (``torch.distributed.fsdp.fully_shard``) on ``world_size`` CPU processes
    (gloo) and report what each rank holds against a full replica, and the losses beside one
    process training on the whole batch. Nothing outlives the call; a failed or late rank gives
    ``ok`` False and the reason in ``error``."""
    _choice("model", model, PRESETS)
    if whole("world_size", world_size, 2) > 8:  # one rank shards nothing; each rank is a spawned process
        raise ConfigError("world_size", world_size, "2 to 8 processes for this demo")
    whole("micro_batch", micro_batch)
    whole("steps", steps)
    whole("seed", seed, 0)
    real("timeout_s", timeout_s, strict=True, allowed="seconds > 0")
    if not has("fully_shard"):  # no processes to spawn: the chapter says FSDP did not run here, and why
        return {"ok": False, "error": message("fully_shard"), "ranks": {}}
    t0 = time.monotonic()
    try:
        with spawn_ranks(_fsdp_rank, world_size, (PRESETS[model], micro_batch, steps, seed),
                         prefix="labkit-fsdp-") as ranks:
            results = ranks.collect(timeout_s, "FSDP demo")
    except RunError as e:  # the chapter says FSDP did not run here, and why; the arithmetic still holds
        return {"ok": False, "error": str(e), "ranks": {}}
    full = results[0]["full_param_bytes"]
    return {"ok": True, "world_size": world_size, "model": model, "ranks": [results[r] for r in range(world_size)],
            "replica": {"param_bytes": full, "grad_bytes": full, "optimizer_bytes": 2 * full},
            "losses": results[0]["losses"], "seconds": time.monotonic() - t0}


def fsdp_rows(demo: dict) -> list:
    """What FSDP rank 0 holds against a full replica (DDP), in plain bytes, with the share: one row per kind of
    state (parameters, gradients, optimizer)."""
    if not isinstance(demo, dict) or not demo.get("ok") or "replica" not in demo:
        raise ConfigError("demo", type(demo).__name__, "what fsdp_demo returned, with ok True")
    r0, rep = demo["ranks"][0], demo["replica"]
    return [{"state": k.replace("_bytes", ""), "replica": rep[k], "rank0": r0[k], "share": r0[k] / rep[k]}
            for k in ("param_bytes", "grad_bytes", "optimizer_bytes")]


def loss_rows(demo: dict, single: list) -> list:
    """The FSDP run's loss after each update beside one process's on the whole batch, and their difference
    (plain digits: a difference of 4e-7 must read as a number, not as e-notation)."""
    if not isinstance(demo, dict) or "losses" not in demo:
        raise ConfigError("demo", type(demo).__name__, "what fsdp_demo returned")
    if not isinstance(single, (list, tuple)) or len(single) != len(demo["losses"]):
        raise ConfigError("single", single, f"{len(demo['losses'])} losses, one per update of the FSDP run")
    return [{"update": i + 1, "fsdp": a, "single": b, "diff": abs(a - b)}
            for i, (a, b) in enumerate(zip(demo["losses"], single))]
