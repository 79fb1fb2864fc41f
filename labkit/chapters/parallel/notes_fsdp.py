"""Chapter 10's sentences and charts about FSDP2 (taught in chapter 10), built from ``fsdp2.fsdp_lab``'s measured
values -- never typed numbers.

    display(par.fsdp_memory_note(lab)); par.fsdp_memory_chart(lab)
"""
from __future__ import annotations

from ..course import Note
from .fsdp_counting import expected_calls, ring_bytes_per_rank

PARTS = ("params", "grads", "optimizer")


def _kib(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"


def _where(lab: dict, ws: int) -> str:
    kind = lab["kinds"][ws]
    return "NCCL on one GPU per rank" if kind == "cuda" else "gloo on this machine's CPU"


def fsdp_memory_table(lab: dict) -> Note:
    """Measured bytes per rank (the largest rank) against ZeRO-3's fp32 arithmetic, per world size."""
    head = ("Bytes per rank:\n\n| world size | params | grads | AdamW state | total (measured, largest rank) | "
            "16 N / world size (fp32 formula) |\n|---:|---:|---:|---:|---:|---:|")
    rows = []
    for ws, m in sorted(lab["memory"].items()):
        big = max(m["ranks"], key=lambda r: r["total"])
        rows.append(f"| {ws} | {big['params']:,} | {big['grads']:,} | {big['optimizer']:,} | {big['total']:,} | "
                    f"{m['formula_fp32']['total']:,.0f} |")
    return Note(head + "\n" + "\n".join(rows))


def fsdp_memory_note(lab: dict) -> Note:
    """What each rank holds against the formula, in both accountings, and whether shards came out uneven."""
    n = next(iter(lab["memory"].values()))["n_params"]
    parts = []
    for ws, m in sorted(lab["memory"].items()):
        f = m["formula_fp32"]
        same = all(abs(r[k] - f[k]) < 0.5 for r in m["ranks"] for k in PARTS)
        word = ("exactly the fp32 formula" if same else
                f"{', '.join(_kib(r['total']) for r in m['ranks'])} against the formula's {_kib(f['total'])}")
        parts.append(f"world size {ws}: {_kib(m['ranks'][0]['total'])} on rank 0 ({word})")
    text = (f"The {lab['model']} GPT has N = {n:,} parameters. Measured model state per rank "
            f"(fp32 weights 4 + gradients 4 + AdamW's two moments 8 bytes per parameter, sharded ZeRO-3 style): "
            + "; ".join(parts) + ". ")
    uneven = [ws for ws, m in lab["memory"].items() if m["uneven"]]
    if uneven:
        for ws in uneven:
            m = lab["memory"][ws]
            mean = sum(r["total"] for r in m["ranks"]) / ws
            text += (f"At world size {ws} the ranks differ: FSDP2 cuts every parameter's first dimension into "
                     f"chunks of ceil(rows / {ws}) rows, in rank order, until the rows run out -- the trailing ranks "
                     f"get fewer rows, or none (padded to the same size in FSDP's own buffers), so rank 0 holds "
                     f"{_kib(m['ranks'][0]['total'])} against the formula's "
                     f"{_kib(m['formula_fp32']['total'])}; the mean over the ranks, {_kib(mean)}, is the formula. ")
    else:
        text += "Every parameter's first dimension divides by each world size here, so no shard needed padding. "
    mixed = lab["memory"][max(lab["memory"])]["formula_mixed"]
    text += (f"The mixed-precision accounting (`formulas.layout_state_bytes`: bf16 weights 2 + bf16 gradients 2 + "
             f"fp32 master weights and moments 12) gives the same 16 bytes per parameter in total but splits them "
             f"{_kib(mixed['params'])} / {_kib(mixed['grads'])} / {_kib(mixed['optimizer'])} at world size "
             f"{max(lab['memory'])}.")
    return Note(text)


def _wire(buffer_bytes: float, ws: int) -> str:
    """A collective's full buffer and what one rank sends (and receives) of it on a ring."""
    return (f"{_kib(buffer_bytes)} of full-size buffers (each rank sends and receives ({ws} - 1) / {ws} of it "
            f"on a ring: {_kib(ring_bytes_per_rank(buffer_bytes, ws))})")


def fsdp_reshard_note(lab: dict) -> Note:
    """AllGather calls per step with reshard_after_forward True and False on the blocks (the root left at
    torch's default) and True on the root too, against the unit structure, and the gathered bytes still held
    when the forward ends."""
    L, t, f, ws = lab["n_blocks"], lab["reshard"][True], lab["reshard"][False], lab["detail_world_size"]
    root = lab["reshard_root"]
    e_t, e_f = expected_calls(L, True)["allgather"], expected_calls(L, False)["allgather"]
    e_r = expected_calls(L, True, root_reshard_after_forward=True)["allgather"]
    ok = "as" if (t["allgather"], f["allgather"], root["allgather"]) == (e_t, e_f, e_r) else "NOT as"
    fns = ", ".join(f"`dist.{n}`" for n in t.get("allgather_functions", [])) or "no function"
    return Note(
        f"AllGather calls per step, counted on rank 0 of {ws} ({_where(lab, ws)}, through {fns}): "
        f"**{t['allgather']}** with `reshard_after_forward=True` on the blocks, **{f['allgather']}** with False "
        f"-- {ok} the unit structure says ({L} blocks + the root: {L + 1} gathers for the forward, and with True "
        f"{L} more for the backward). The root was left at `fully_shard`'s default, `reshard_after_forward=None`, "
        f"which means True for every other unit and False for the root: it stays gathered, since its backward "
        f"comes first. `fully_shard(model, reshard_after_forward=True)` reshards the root too: "
        f"**{root['allgather']}** AllGathers ({L + 1} + {L} + 1). The price of False: when the forward ended, "
        f"rank 0 still held {_kib(f['held_after_forward'])} of gathered weights (the whole model's "
        f"{_kib(f['full_param_bytes'])}) against {_kib(t['held_after_forward'])} with True (the root only) and "
        f"{_kib(root['held_after_forward'])} with the root resharded too; the most held during the forward was "
        f"{_kib(f['forward_peak'])} against {_kib(t['forward_peak'])} (the root + one block). On GPUs FSDP2 "
        f"issues the next block's AllGather while the current one computes, and in backward it prefetches the "
        f"next unit, so two blocks' weights are alive at times. Gathered per step: with False "
        f"{_wire(f['allgather_bytes'], ws)}, with True {_wire(t['allgather_bytes'], ws)}. "
        f"(An integer `reshard_after_forward=n` keeps an n-way shard after forward, so the backward's AllGather "
        f"runs over n ranks, e.g. within a node, for more memory than True.)")


def fsdp_precision_note(lab: dict) -> Note:
    """What MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) changed in the collectives, and what a
    rank keeps under it."""
    p, t, ws = lab["precision"], lab["reshard"][True], lab["detail_world_size"]
    m = lab["memory"][lab["detail_world_size"]]["ranks"][0]
    kept = p["params"] + p["grads"] + p["optimizer"]
    return Note(
        f"With `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)` the same step "
        f"gathered {_kib(p['allgather_bytes'])} in {', '.join(p['allgather_dtypes'])} against "
        f"{_kib(t['allgather_bytes'])} in fp32 ({p['allgather_bytes'] / t['allgather_bytes']:.2f} of it; these "
        f"are buffer sizes: on a ring each rank sends ({ws} - 1) / {ws} of them), while the ReduceScatter's "
        f"buffers stayed {_kib(p['reducescatter_bytes'])} in {', '.join(p['reducescatter_dtypes'])} (each rank sends "
        f"{_kib(ring_bytes_per_rank(p['reducescatter_bytes'], ws))}). "
        f"What rank 0 keeps does not shrink: its shards of the parameters and gradients stay "
        f"{', '.join(p['param_dtypes'])} / {', '.join(p['grad_dtypes'])} -- FSDP2's sharded parameters are the "
        f"fp32 master copy, the bf16 weights exist only while a unit is gathered -- so it holds {_kib(kept)} of "
        f"model state, as in fp32 ({_kib(m['total'])}). The 2 + 2 + 12 accounting above describes separate "
        "bf16 weights beside an fp32 master copy; FSDP2's policy saves on the wire and on the gathered "
        "weights, not on the shards.")


def fsdp_clip_note(lab: dict) -> Note:
    """The sharded model's clip_grad_norm_ against one process's on the whole batch."""
    c = lab["clip"]
    worst = max(abs(a - b) / b for a, b in zip(c["norms"], c["reference_norms"]))
    return Note(
        f"`clip_grad_norm_` on the sharded model returned total norms {', '.join(f'{v:.5f}' for v in c['norms'])}; "
        f"one process on the whole batch: {', '.join(f'{v:.5f}' for v in c['reference_norms'])} (largest relative "
        f"difference {worst:.1e}). Each rank holds a shard of every gradient, so the squares are summed over all "
        f"ranks' shards before the square root -- not the local shard's norm. Clipped to {lab['max_norm']:g}, the "
        f"parameters after {len(c['norms'])} update{'s' if len(c['norms']) > 1 else ''} differ from the single "
        f"process's by at most {c['max_param_diff']:.1e}.")


def fsdp_accum_note(lab: dict) -> Note:
    """ReduceScatter calls per update and gradient bytes held, syncing every micro-batch or only the last."""
    a, L, k, ws = lab["accum"], lab["n_blocks"], lab["accumulation"], lab["detail_world_size"]
    every, once = a["sync_every"], a["no_sync"]
    return Note(
        f"{k} micro-batches per update, {L} blocks + the root = {L + 1} units. Syncing every micro-batch: "
        f"**{every['reducescatter']}** ReduceScatter calls per update ({k} x {L + 1}); with "
        f"`set_requires_gradient_sync(False)` until the last: **{once['reducescatter']}** ({L + 1}, one per unit), "
        f"{_kib(once['reducescatter_bytes'])} of buffers reduced instead of {_kib(every['reducescatter_bytes'])} "
        f"(each rank sends ({ws} - 1) / {ws} of it on a ring: "
        f"{_kib(ring_bytes_per_rank(once['reducescatter_bytes'], ws))} instead of "
        f"{_kib(ring_bytes_per_rank(every['reducescatter_bytes'], ws))}). The price: "
        f"between micro-batches each rank held {_kib(once['grad_bytes_between'])} of full-size gradients, against "
        f"{_kib(every['grad_bytes_between'])} of sharded ones when syncing. AllGathers are the same both ways "
        f"({every['allgather']} per update: FSDP2 reshards after every backward, so each micro-batch gathers again; "
        "`set_reshard_after_backward(False)` would trade memory for fewer). Final parameters: the two ways differ "
        "by at most "
        f"{a['max_param_diff_between']:.1e}, and from one process on the whole batch by at most "
        f"{max(every['max_param_diff_vs_reference'], once['max_param_diff_vs_reference']):.1e} "
        "(float sums in another order).")


def fsdp_memory_chart(lab: dict, ax=None):
    """Bytes per rank against world size: params / grads / AdamW state stacked, measured (the largest rank)
    beside the fp32 formula."""
    import matplotlib.pyplot as plt  # deferred: a chart only, and matplotlib is slow to import

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 2.8))
    sizes = sorted(lab["memory"])
    colors = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868"}
    for i, ws in enumerate(sizes):
        m = lab["memory"][ws]
        big = max(m["ranks"], key=lambda r: r["total"])
        for x, source, hatch in ((i - 0.18, big, None), (i + 0.18, m["formula_fp32"], "//")):
            bottom = 0.0
            for part in PARTS:
                kib = source[part] / 1024
                ax.bar(x, kib, 0.34, bottom=bottom, color=colors[part], hatch=hatch, edgecolor="white",
                       label=part if i == 0 and hatch is None else None)
                bottom += kib
    ax.set_xticks(range(len(sizes)), [f"{ws} rank{'s' if ws > 1 else ''}\nmeasured | formula" for ws in sizes])
    ax.set_ylabel("KiB per rank")
    ax.set_title("Model state per rank under FSDP2 (fp32 + AdamW)")
    ax.legend(frameon=False, fontsize=8)
    return ax


def fsdp_calls_chart(lab: dict, ax=None):
    """Collective calls counted against the unit structure: AllGather per step (reshard True / False on the
    blocks, and True on the root too) and
    ReduceScatter per update (sync every micro-batch / only the last)."""
    import matplotlib.pyplot as plt  # deferred: a chart only, and matplotlib is slow to import

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 2.6))
    L, k = lab["n_blocks"], lab["accumulation"]
    bars = [("AllGather / step\nreshard=True", lab["reshard"][True]["allgather"],
             expected_calls(L, True)["allgather"]),
            ("AllGather / step\nreshard=False", lab["reshard"][False]["allgather"],
             expected_calls(L, False)["allgather"]),
            ("AllGather / step\nroot resharded too", lab["reshard_root"]["allgather"],
             expected_calls(L, True, root_reshard_after_forward=True)["allgather"]),
            (f"ReduceScatter / update\nsync every of {k}", lab["accum"]["sync_every"]["reducescatter"],
             expected_calls(L, micro_batches=k)["reducescatter"]),
            ("ReduceScatter / update\nsync last only", lab["accum"]["no_sync"]["reducescatter"],
             expected_calls(L, micro_batches=k, sync_every_micro_batch=False)["reducescatter"])]
    xs = range(len(bars))
    ax.bar(xs, [b[1] for b in bars], 0.6, color=["#4c72b0", "#8fa8d6", "#2d4a7a", "#dd8452", "#f0b98d"], label="counted")
    ax.scatter(xs, [b[2] for b in bars], marker="_", s=600, color="black", label="unit structure", zorder=3)
    for x, b in zip(xs, bars):
        ax.text(x, b[1] / 2, str(b[1]), ha="center", va="center", fontsize=9, color="white")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_xticks(list(xs), [b[0] for b in bars], fontsize=7)
    ax.set_ylabel("calls")
    ax.set_title(f"FSDP2's collectives, {L} blocks + root, rank 0 of {lab['detail_world_size']}")
    ax.legend(frameon=False, fontsize=8)
    return ax
