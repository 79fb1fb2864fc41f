"""Chapter 11's sentences, tables and chart about distributed checkpoints (taught in chapter 11), built from
``dcp.dcp_demo``'s measured values -- never typed numbers.

    res = lr.dcp.dcp_demo(model=size["model"], micro_batch=size["micro_batch"])
    display(lr.notes_dcp.dcp_size_table(res)); lr.notes_dcp.dcp_async_chart(res)
"""
from __future__ import annotations

from ..course import Note


def _bytes(n: float) -> str:
    return f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{n / 1024:,.1f} KiB"


def _ms(s: float) -> str:
    return f"{s * 1e3:,.0f} ms" if s >= 0.01 else f"{s * 1e3:,.1f} ms"


def _spread(d: dict) -> str:
    """A median with its range over the timed rounds."""
    return f"{_ms(d['median'])} ({_ms(d['min'])}–{_ms(d['max'])})"


def _where(res: dict) -> str:
    ws = res["world_size"]
    return (f"{ws} ranks with NCCL, one GPU each" if res["kind"] == "cuda"
            else f"{ws} gloo ranks on this machine's CPU")


def _busy(res: dict) -> str:
    load = res.get("load") or {}
    if not load.get("busy"):
        return ""
    other = load.get("other_cores")
    return (f" Other processes used {other:.1f} cores of this machine meanwhile: the times carry that noise."
            if other is not None else " This machine was busy meanwhile: the times carry that noise.")


def dcp_roundtrip_note(res: dict) -> Note:
    """Save, load into a fresh model and optimizer, one more update: bit for bit or not."""
    rt, loop = res["round_trip"], res["loop"]
    same = rt["params_equal"] and rt["loss_equal"]
    before = ("its weights differed before the load" if rt["differed_before_load"] else
              "its weights were already equal -- the check proves nothing")
    verdict = ("**bit for bit the same** (`torch.equal` on every full parameter and AdamW moment)" if same else
               f"**not the same**: {', '.join(rt['mismatches_after_next_update'][:4]) or 'the loss'} differ")
    return Note(
        f"Round trip on {_where(res)}: the sharded {res['model']} GPT trained {res['updates']} updates "
        f"(losses {', '.join(f'{v:.4f}' for v in rt['losses'])}) and was saved with `dcp.save`; a second model, "
        f"initialised differently ({before}), "
        f"and a fresh AdamW were loaded from the folder. The next update gave loss {rt['next_loss_saved_run']:.6f} "
        f"in the saved run and {rt['next_loss_loaded_run']:.6f} in the loaded one, and the parameters and "
        f"optimizer state after it are {verdict}. The training loop with `async_save` after every update "
        f"(`train_with_async_saves`) left {len(loop['folders'])} checkpoint folders; its last one, loaded into "
        f"a fresh model, {'equals' if loop['equal'] else 'does NOT equal'} the final state bit for bit.")


def dcp_size_table(res: dict) -> Note:
    """Bytes on disk against the model's parameter bytes and AdamW's state, per model size."""
    head = ("| model | parameters N | weights 4 N | AdamW moments 8 N | model + optimizer | files on disk "
            "(one per rank + .metadata) | disk / (model + optimizer) |\n|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name, s in res["sizes"].items():
        files = " + ".join(_bytes(b) for b in s["files"].values())
        rows.append(f"| {name} | {s['n_params']:,} | {_bytes(s['param_bytes'])} | {_bytes(s['moment_bytes'])} | "
                    f"{_bytes(s['state_bytes'])} | {_bytes(s['disk_bytes'])} ({files}) | "
                    f"{s['disk_bytes'] / s['state_bytes']:.3f} |")
    return Note(head + "\n" + "\n".join(rows))


def dcp_size_note(res: dict) -> Note:
    """Where the bytes on disk beyond 12 N come from: a tied weight under two names, .metadata, per-item
    containers."""
    parts = []
    for name, s in res["sizes"].items():
        lay = s["layout"]
        meta = s["files"].get(".metadata", 0)
        per_item = (s["disk_bytes"] - lay["tensor_bytes"] - meta) / lay["items"]
        parts.append(f"{name}: {_bytes(s['disk_bytes'])} on disk for {_bytes(s['state_bytes'])} of state; "
                     f"the tensors listed in `.metadata` hold {_bytes(lay['tensor_bytes'])} "
                     f"({_bytes(lay['model'])} model, {_bytes(lay['optim'])} optimizer), `.metadata` itself "
                     f"{_bytes(meta)}, and the rest is about {per_item:,.0f} bytes of container per stored chunk "
                     f"({lay['items']} chunks: a sharded tensor has one per rank)")
    first = next(iter(res["sizes"].values()))
    extra = (f"The model's state dict also lists {', '.join(f'`{n}`' for n in first['extra_names'])} -- the "
             f"tied output head, the same tensor as the embedding -- and DCP writes it under both names "
             f"({_bytes(first['extra_bytes'])} more for {next(iter(res['sizes']))}). "
             if first["extra_names"] else "")
    return Note(
        "A checkpoint that can resume training holds the weights (4 bytes per parameter in fp32) and AdamW's two "
        "moments (8 bytes), plus a step count per tensor: 12 N bytes, three times the weights alone. "
        + "; ".join(parts) + ". " + extra
        + f"Each rank's file holds only its shards: {_where(res)} wrote one file each, in parallel.")


def dcp_time_table(res: dict) -> Note:
    """Save and load seconds (median and range over the timed rounds, warm-up left out) per model size."""
    head = ("| model | on disk | `dcp.save` | `dcp.load` | `async_save` blocked | `async_save` until written | "
            "save throughput |\n|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name, s in res["sizes"].items():
        rows.append(f"| {name} | {_bytes(s['disk_bytes'])} | {_spread(s['save_s'])} | {_spread(s['load_s'])} | "
                    f"{_spread(s['async_block_s'])} | {_spread(s['async_total_s'])} | "
                    f"{s['disk_bytes'] / s['save_s']['median'] / 2**20:,.0f} MiB/s |")
    return Note(f"Median (min–max) of {res['repeats']} timed rounds after a warm-up, the slowest rank's time, "
                f"{_where(res)}:\n\n" + head + "\n" + "\n".join(rows))


def dcp_time_note(res: dict) -> Note:
    """Save time against size: a fixed cost per save, then bytes."""
    names = list(res["sizes"])
    lo, hi = res["sizes"][names[0]], res["sizes"][names[-1]]
    bytes_x = hi["disk_bytes"] / lo["disk_bytes"]
    time_x = hi["save_s"]["median"] / lo["save_s"]["median"]
    return Note(
        f"From {names[0]} to {names[-1]} the checkpoint grew {bytes_x:.0f}x and the synchronous save took "
        f"{time_x:.1f}x as long ({_ms(lo['save_s']['median'])} against {_ms(hi['save_s']['median'])}): a save has "
        f"a fixed part -- planning with the other ranks (gathering every rank's write plan on rank 0 and "
        f"sending it back), one `torch.save` container per chunk, `fsync` of every file, rank 0's `.metadata` -- "
        f"and a part that grows with the bytes. Throughput measured on tiny checkpoints is not the disk's "
        f"bandwidth." + _busy(res))


def dcp_reshard_note(res: dict) -> Note:
    """Saved at one world size, loaded at another: bit for bit, both ways; and dcp_to_torch_save."""
    rs, ws = res["reshard"], res["world_size"]
    down, up = rs["2->1"], rs["1->2"]
    word = lambda ok: "**bit for bit equal**" if ok else "**NOT equal**"  # noqa: E731
    text = (f"Saved by {ws} FSDP2 ranks, loaded by one fresh process into a plain, unsharded GPT and AdamW "
            f"(no process group at all): every parameter and moment is {word(down['params_equal'])} to the "
            f"{ws}-rank model's full tensors (and differed before the load: "
            f"{'yes' if down['differed_before'] else 'no'}). The reverse -- saved by one process with a plain "
            f"GPT, loaded into the model sharded over {ws} ranks -- is {word(up['params_equal'])} too. Nobody "
            f"converted anything: `.metadata` records each tensor's full shape and which slice each file holds, "
            f"and each loading rank reads every stored chunk that overlaps its own shard, whole, and keeps the "
            f"overlapping slice.")
    t = res.get("to_torch_save") or {}
    if t.get("ok"):
        text += (f" `format_utils.dcp_to_torch_save` turned the {ws}-rank folder into one `torch.save` file of "
                 f"{_bytes(t['bytes'])} in {_ms(t['seconds'])} (one process; it holds the whole state in memory, "
                 f"so it is for small models and for handing weights to tools that read `torch.load`); loaded with "
                 f"`weights_only=True`, its model tensors are {word(t['model_equal'])} to the reference.")
    return Note(text)


def dcp_async_table(res: dict) -> Note:
    """Per model size: the synchronous save against the time async_save blocks, and the critical-path share."""
    head = ("| model | `dcp.save` (blocks the loop) | `async_save` blocks | the call's share of a sync save | "
            "`async_save` until written |\n|---|---:|---:|---:|---:|")
    rows = [f"| {name} | {_spread(s['save_s'])} | {_spread(s['async_block_s'])} | "
            f"{s['async_block_s']['median'] / s['save_s']['median']:.0%} | {_spread(s['async_total_s'])} |"
            for name, s in res["sizes"].items()]
    return Note(head + "\n" + "\n".join(rows))


def _async_verdict(share: float) -> str:
    """What the measured share means, in words (the writer thread shares this machine's cores and the GIL)."""
    if share >= 1.0:
        return ("Here nothing left the critical path: the write slowed the updates it overlapped by more than the "
                "synchronous save costs -- on this CPU the writer thread competes with the ranks for the same "
                "cores (and for Python's GIL). ")
    if share > 0.6:
        return ("Little left the critical path here: the writer thread competes with the ranks for the same cores "
                "(and for Python's GIL). ")
    return f"{1 - share:.0%} of the save's cost left the critical path here. "


def dcp_async_note(res: dict) -> Note:
    """How much of a save stays on the critical path with async_save, measured, and the rules around it."""
    a, m = res["async"], res["model"]
    n_upd = a["updates_while_writing"]
    return Note(
        f"At the baseline model ({m}) a synchronous `dcp.save` held the training loop for {_ms(res['save_s'])} "
        f"(median); `dcp.async_save` returned after {_ms(res['async_block_s'])} ({res['block_share']:.0%} of "
        f"that) -- the time to collect the state dict and copy every shard to CPU memory (staging, as DCP's "
        f"default stager does it; on GPUs a `DefaultStager(StagingOptions(...))` with async staging and pinned "
        f"memory takes that copy off the loop too -- it needs CUDA, so not here). That is not "
        f"the whole cost: while DCP's thread wrote the files, training went on, "
        f"{min(n_upd) if min(n_upd) == max(n_upd) else f'{min(n_upd)}–{max(n_upd)}'} update(s) per save, each taking {_spread(a['update_during_save_s'])} against {_spread(a['update_s'])} "
        f"with no save, so those updates lost {_spread(a['slowdown_s'])} in all. The loop's whole cost of an "
        f"async save, block plus slowdown, was {_spread(a['critical_s'])}: **{res['critical_path_share']:.0%}** "
        f"of the synchronous save's. "
        + _async_verdict(res["critical_path_share"])
        + "on GPUs the staging copy is device-to-host and the write competes only for host CPU, memory and the "
        "file system; `async_checkpointer_type=AsyncCheckpointerType.PROCESS` moves the write out of the "
        "training process altogether. "
        f"The async checkpoint, started at a state the next update then changed, is "
        f"{'**bit for bit**' if a['equals_sync'] else '**NOT**'} "
        f"the synchronous checkpoint of that state ({'and not' if a['staged_before_update'] else 'yet equal to'} "
        f"the state after the update): the staging copy, not the live weights, is what gets written. Two rules "
        f"the code keeps: wait for the previous save's future before starting the next (two in flight double the "
        f"CPU copies and interleave their collectives), and before the process exits (an unfinished save is a "
        f"checkpoint that is not there). `async_save` needs a CPU (gloo) process group for its collectives; "
        f"giving it a group of its own keeps them apart from the training loop's, which run at the same time "
        f"on another thread (collectives on one group must come in the same order on every rank). Here on this "
        f"CPU with gloo; on GPUs the staging copy is device-to-host (over PCIe), "
        f"and the write goes to a parallel file system shared by the whole cluster: there, with the default "
        f"stager, the copy is the part the loop must wait for (async staging overlaps even that) -- measure the "
        f"overlapped updates there too before counting on the rest." + _busy(res))


def dcp_why_note(res: dict) -> Note:
    """Why DCP, not torch.save(model.state_dict()) on rank 0."""
    ws = res["world_size"]
    return Note(
        f"Why not `torch.save(model.state_dict())` on rank 0? Under FSDP every rank holds 1/{ws} of each tensor: "
        f"rank 0 would first have to gather the whole model and optimizer state into its own memory (for a "
        f"model sharded because it does not fit, it does not fit there either), and then write it alone while "
        f"the others wait. With DCP each rank writes its own shards in parallel (here {ws} files), nothing is "
        f"gathered, and the folder can be loaded at another world size -- a restart on fewer healthy GPUs, or a "
        f"single process for evaluation. One caution: DCP reads `.metadata` with plain `pickle` (torch 2.13), "
        f"so load checkpoint folders only from your own job's storage. And save each checkpoint to a new folder "
        f"(one per step): saving into an existing one overwrites its shard files while the old `.metadata` is "
        f"still there, so a crash in between leaves a folder that is neither. DCP writes `.metadata` last; "
        f"count a folder complete only once it is there, and keep the previous one until then.")


def dcp_async_chart(res: dict, width: float = 7.0, height: float = 2.8):
    """Bars per model size: the synchronous save, the time async_save blocks, and until its files are
    written (medians; the range over the timed rounds as whiskers)."""
    from ...tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(min(width, 8.0), min(height, 3.0))
    ax = fig.add_subplot(1, 1, 1)
    names = list(res["sizes"])
    series = (("save_s", "dcp.save (blocks)", "#c44e52"), ("async_block_s", "async_save blocks", "#55a868"),
              ("async_total_s", "async_save until written", "#8fbf9a"))
    w = 0.26
    for j, (key, label, color) in enumerate(series):
        xs = [i + (j - 1) * w for i in range(len(names))]
        med = [res["sizes"][n][key]["median"] * 1e3 for n in names]
        err = [[m - res["sizes"][n][key]["min"] * 1e3 for m, n in zip(med, names)],
               [res["sizes"][n][key]["max"] * 1e3 - m for m, n in zip(med, names)]]
        ax.bar(xs, med, w, yerr=err, color=color, label=label, capsize=3, error_kw={"elinewidth": 0.8})
    for i, n in enumerate(names):
        s = res["sizes"][n]
        share = s["async_block_s"]["median"] / s["save_s"]["median"]
        top = max(s[key]["max"] for key, _, _ in series) * 1e3
        ax.text(i, top, f"the call blocks: {share:.0%} of a sync save", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(names)), [f"{n}\n{_bytes(res['sizes'][n]['disk_bytes'])}" for n in names], fontsize=8)
    ax.set_ylabel("ms (median, range)", fontsize=8)
    ax.set_title(f"Checkpoint save, {_where(res)}", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.legend(frameon=False, fontsize=7)
    ax.margins(y=0.15)
    return fig
