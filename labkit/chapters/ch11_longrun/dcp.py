"""Distributed checkpoints (taught in chapter 11): ``torch.distributed.checkpoint`` (DCP) saving and loading a
sharded (FSDP2) GPT and its AdamW state, each rank writing only its own shards -- measured on real processes.

    res = lr.dcp.dcp_demo(model="tiny", micro_batch=4)
    res["round_trip"]["params_equal"]        # save, load into a fresh model: the next update is bit for bit
    res["reshard"]["2->1"]["params_equal"]   # saved by 2 ranks, loaded by 1 plain process (and "1->2")
    res["sizes"]["tiny"]["disk_bytes"]       # the folder's files against 4 N + 8 N bytes (weights, moments)
    res["save_s"], res["async_block_s"]      # median sync save; median time async_save blocks the loop

Rank 0 first saves a plain GPT alone (world size 1, for 1 -> 2); then ``world_size`` FSDP2 ranks run the
round trip, the sizes and times, and async_save; then one fresh process loads their checkpoint unsharded
(2 -> 1). FSDP2 runs only in the spawned ranks, never in the calling process (chapter 10 says why).
"""
from __future__ import annotations

import tempfile
import time

import torch

from ...base.compat import has, message
from ...base.runtime import ConfigError, RunError
from ...engine.config import PRESETS, _choice, whole
from ...engine.device import LoadMeter
from ...engine.launch import spawn_ranks
from ...tools.collectives import device_kind  # also read as lr.dcp.device_kind in the chapter
from . import dcp_ranks
# the code the chapter shows, reachable here as lr.dcp.<name>
from .dcp_ranks import async_checkpoint, load_checkpoint, save_checkpoint, train_with_async_saves  # noqa: F401

MAX_WORLD = 4
SIZE_ORDER = ("tiny", "small", "base", "large")


# ---- the demo --------------------------------------------------------------------------------------------

def _check(model, micro_batch, world_size, sizes, updates, repeats, seed, timeout_s):
    _choice("model", model, PRESETS)
    whole("micro_batch", micro_batch)
    if whole("world_size", world_size) < 2 or world_size > MAX_WORLD:
        raise ConfigError("world_size", world_size, f"2 to {MAX_WORLD} ranks (one rank shards nothing)")
    if not isinstance(sizes, (list, tuple)) or not sizes:
        raise ConfigError("sizes", sizes, "a non-empty tuple of model presets, e.g. ('tiny', 'small')")
    for name in sizes:
        _choice("sizes", name, PRESETS)
    if len(set(sizes)) != len(sizes):
        raise ConfigError("sizes", sizes, "each model preset once")
    if model not in sizes:
        raise ConfigError("sizes", sizes, f"a tuple that includes the baseline model {model!r}")
    whole("updates", updates)
    if whole("repeats", repeats) < 2:
        raise ConfigError("repeats", repeats, "2 or more timed rounds (a spread needs two)")
    whole("seed", seed, 0)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ConfigError("timeout_s", timeout_s, "seconds > 0")


def dcp_demo(model: str = "tiny", micro_batch: int = 4, world_size: int = 2, sizes=("tiny", "small"),
             updates: int = 2, repeats: int = 3, seed: int = 0, timeout_s: float = 120.0) -> dict:
    """DCP measured on ``world_size`` FSDP2 ranks and on single processes: the round trip (``round_trip``),
    resharding on load (``reshard``: "2->1", "1->2"), bytes on disk and save / load / async-save seconds per
    model size in ``sizes`` (``repeats`` timed rounds after a warm-up), and, for the baseline ``model``,
    ``save_s`` / ``load_s`` / ``async_block_s`` / ``async_total_s`` (medians, seconds) and
    ``critical_path_share`` (async_critical_s / save_s: the call's block plus the slowdown of the updates that
    overlapped the write, against a synchronous save), ``block_share`` (async_block_s / save_s). ``ok`` False with ``error`` when it could not run here;
    nothing outlives the call and the temporary folder is removed."""
    _check(model, micro_batch, world_size, sizes, updates, repeats, seed, timeout_s)
    if not has("fully_shard"):
        return {"ok": False, "error": message("fully_shard")}
    sizes = tuple(sorted(sizes, key=SIZE_ORDER.index))
    spec, kind = PRESETS[model], device_kind(world_size)
    res = {"ok": True, "torch": torch.__version__, "model": model, "micro_batch": micro_batch,
           "world_size": world_size, "updates": updates, "repeats": repeats, "sizes_run": list(sizes),
           "kind": kind, "seconds": {}}
    t_all, meter = time.monotonic(), LoadMeter()
    with tempfile.TemporaryDirectory(prefix="labkit-ch11-") as folder:
        try:
            t0 = time.monotonic()
            args = (kind, spec, micro_batch, updates, seed, folder, sizes, repeats)
            ranks = _spawn(dcp_ranks.rank_main, world_size, args, kind, timeout_s, f"DCP on {world_size} ranks")
            res["seconds"]["ranks"] = time.monotonic() - t0
            t0 = time.monotonic()
            one = _spawn(dcp_ranks.load_at_one, 1, (device_kind(1), spec, seed, folder), device_kind(1), timeout_s,
                         "DCP load at world size 1")[0]
            res["seconds"]["load_at_one"] = time.monotonic() - t0
        except RunError as e:
            return {**res, "ok": False, "error": str(e)}
    res["seconds"]["total"] = time.monotonic() - t_all
    res["load"] = meter.read()  # others' CPU use meanwhile: the times are this machine's, as loaded as it was
    _summarise(res, ranks, one)
    return res


def _spawn(target, ws, args, kind, timeout_s, what) -> dict:
    with spawn_ranks(target, ws, args, kind=kind, prefix="labkit-ch11-ranks-") as ranks:
        return ranks.collect(timeout_s, what)


def _summarise(res, ranks, back) -> None:
    r0 = ranks[0]
    rt = r0["round_trip"]
    rt["params_equal"] = all(not ranks[r]["round_trip"]["mismatches_after_next_update"] for r in ranks)
    res["round_trip"] = rt
    res["reshard"] = {
        "2->1": {"params_equal": not back["mismatches"], "mismatches": back["mismatches"],
                 "differed_before": back["differed_before"], "device": back["device"]},
        "1->2": {"params_equal": all(not ranks[r]["from_one"]["mismatches"] for r in ranks),
                 "mismatches": r0["from_one"]["mismatches"], "device": r0["device"]},
    }
    res["to_torch_save"] = back["to_torch_save"]
    res["loop"] = {**r0["loop"], "equal": all(not ranks[r]["loop"]["mismatches"] for r in ranks)}
    res["sizes"] = {}
    for name, s in r0["sizes"].items():
        st = s["state"]
        res["sizes"][name] = {
            "n_params": st["n_params"], "param_bytes": st["param_bytes"], "moment_bytes": st["moment_bytes"],
            "step_bytes": st["step_bytes"], "state_bytes": st["param_bytes"] + st["moment_bytes"] + st["step_bytes"],
            "extra_names": st["extra_names"], "extra_bytes": st["extra_bytes"],
            "disk_bytes": s["disk"]["total"], "files": s["disk"]["files"], "async_disk_bytes": s["async_disk"]["total"],
            "layout": s["layout"], "save_s": s["save_s"], "load_s": s["load_s"], "async_block_s": s["async_block_s"],
            "async_total_s": s["async_total_s"], "seconds": r0["seconds"][name]}
    ov = r0["overlap"]
    res["async"] = {"update_s": ov["update_s"], "update_during_save_s": ov["update_during_save_s"],
                    "updates_while_writing": ov["updates_while_writing"], "slowdown_s": ov["slowdown_s"],
                    "critical_s": ov["critical_s"],
                    "equals_sync": all(not ranks[r]["overlap"]["async_equals_sync"]["mismatches"] for r in ranks),
                    "mismatches": ov["async_equals_sync"]["mismatches"],
                    "staged_before_update": ov["async_equals_sync"]["differs_from_after_update"]}
    b = res["sizes"][res["model"]]
    res["save_s"], res["load_s"] = b["save_s"]["median"], b["load_s"]["median"]
    res["async_block_s"], res["async_total_s"] = b["async_block_s"]["median"], b["async_total_s"]["median"]
    # the loop's whole cost of an async save (its block + the overlapped updates' slowdown), against a sync save
    res["async_critical_s"] = res["async"]["critical_s"]["median"]
    res["critical_path_share"] = res["async_critical_s"] / res["save_s"]
    res["block_share"] = res["async_block_s"] / res["save_s"]
    res["seconds"]["ranks_inside"] = r0["seconds"]


# ---- what the chapter draws from a result: rows, verdict names, a chart (the words are the chapter's) --------

def size_text(n: float) -> str:
    """Bytes as the chapter's tables show them: MiB from one MiB up, else KiB."""
    return f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{n / 1024:,.1f} KiB"


def spread_text(d: dict) -> str:
    """A timed median with its range over the rounds, in ms: '12 ms (10–15)'."""
    ms = lambda s: f"{s * 1e3:,.0f}" if s >= 0.01 else f"{s * 1e3:,.1f}"  # noqa: E731
    return f"{ms(d['median'])} ms ({ms(d['min'])}–{ms(d['max'])})"


def round_trip_verdict(res: dict) -> str:
    """'same': save, load into a model whose weights differed, one more update -- bit for bit; 'vacuous': the
    loaded model's weights were already equal before the load (the check proves nothing); 'differs'."""
    rt = res["round_trip"]
    if not (rt["params_equal"] and rt["loss_equal"]):
        return "differs"
    return "same" if rt["differed_before_load"] else "vacuous"


def size_rows(res: dict) -> list:
    """Per model size: N, the weights (4 N), AdamW's moments (8 N), both, the folder on disk and its ratio to
    the state; then where the disk's bytes go -- the tensors ``.metadata`` lists, ``.metadata`` itself, the
    container bytes per stored chunk (a sharded tensor has one chunk per rank), and the tied head's bytes
    (written under both names)."""
    rows = []
    for name, s in res["sizes"].items():
        lay, meta = s["layout"], s["files"].get(".metadata", 0)
        rows.append(dict(model=name, n_params=s["n_params"], param_bytes=s["param_bytes"],
                         moment_bytes=s["moment_bytes"], state_bytes=s["state_bytes"], disk_bytes=s["disk_bytes"],
                         files=len(s["files"]), ratio=s["disk_bytes"] / s["state_bytes"],
                         tensor_bytes=lay["tensor_bytes"], metadata_bytes=meta, chunks=lay["items"],
                         per_chunk=(s["disk_bytes"] - lay["tensor_bytes"] - meta) / lay["items"],
                         tied_bytes=s["extra_bytes"]))
    return rows


def reshard_rows(res: dict) -> list:
    """Saved at one world size, loaded at another, both ways: every parameter and moment bit for bit equal
    to the saving side's full tensors, and whether the loading model's weights differed before the load
    (None: not recorded for that direction)."""
    ws, rs = res["world_size"], res["reshard"]
    return [dict(saved_by=ws, loaded_by=1, params_equal=rs["2->1"]["params_equal"],
                 differed_before=rs["2->1"]["differed_before"]),
            dict(saved_by=1, loaded_by=ws, params_equal=rs["1->2"]["params_equal"],
                 differed_before=rs["1->2"].get("differed_before"))]


def time_rows(res: dict) -> list:
    """Per model size: bytes on disk, then save, load, async_save's block and until written (each a dict of
    median, min, max seconds over the timed rounds), the call's share of a sync save, and MiB/s saved."""
    return [dict(model=name, disk_bytes=s["disk_bytes"], save=s["save_s"], load=s["load_s"],
                 block=s["async_block_s"], written=s["async_total_s"],
                 block_share=s["async_block_s"]["median"] / s["save_s"]["median"],
                 mib_s=s["disk_bytes"] / s["save_s"]["median"] / 2**20)
            for name, s in res["sizes"].items()]


def growth(res: dict) -> dict:
    """From the smallest model size to the largest: how many times the bytes and the sync save's median grew;
    ``verdict`` 'fixed' when the time grew less than half as much as the bytes (a fixed cost per save
    dominates), else 'bytes'."""
    names = list(res["sizes"])
    lo, hi = res["sizes"][names[0]], res["sizes"][names[-1]]
    bytes_x = hi["disk_bytes"] / lo["disk_bytes"]
    time_x = hi["save_s"]["median"] / lo["save_s"]["median"]
    return dict(small=names[0], large=names[-1], bytes_x=bytes_x, time_x=time_x,
                verdict="fixed" if time_x < bytes_x / 2 else "bytes")


def overlap(res: dict) -> dict:
    """The baseline model's async save, whole (each a spread over the rounds): the call's block, the updates
    that overlapped the write (how many per save; each one's seconds against an update with no save), their
    slowdown in all, the loop's whole cost (block + slowdown), the sync save, and the share of it left on the
    critical path (``share``; in whole percent ``share_pct``, and ``kept_pct`` taken off it). ``verdict``:
    'nothing_left' (the share is 1 or more), 'little_left' (above 0.6) or 'left'."""
    a, share = res["async"], res["critical_path_share"]
    n, base = a["updates_while_writing"], res["sizes"][res["model"]]
    return dict(block=base["async_block_s"], during=a["update_during_save_s"], alone=a["update_s"],
                slowdown=a["slowdown_s"], critical=a["critical_s"], sync=base["save_s"], share=share,
                share_pct=round(100 * share), kept_pct=round(100 * (1 - share)),
                updates=str(min(n)) if min(n) == max(n) else f"{min(n)}–{max(n)}",
                verdict="nothing_left" if share >= 1.0 else "little_left" if share > 0.6 else "left")


def async_chart(res: dict, width: float = 7.0, height: float = 2.8):
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
    ax.set_xticks(range(len(names)), [f"{n}\n{size_text(res['sizes'][n]['disk_bytes'])}" for n in names],
                  fontsize=8)
    ax.set_ylabel("ms (median, range)", fontsize=8)
    where = (f"{res['world_size']} ranks with NCCL" if res["kind"] == "cuda"
             else f"{res['world_size']} gloo ranks on the CPU")
    ax.set_title(f"Checkpoint save, {where}", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.legend(frameon=False, fontsize=7)
    ax.margins(y=0.15)
    return fig
