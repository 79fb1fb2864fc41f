"""What DDP communicates besides gradients: module buffers, counted on real processes.

``DistributedDataParallel`` keeps replicas identical in two ways. Gradients are all-reduced in
backward (chapter 06 counts those with a comm hook). Module *buffers* -- tensors a module keeps that
are not parameters, such as BatchNorm's running mean and variance -- are broadcast from rank 0 at the
start of a forward pass. The switch is ``forward_sync_buffers`` from torch 2.13 on (checked on 2.13.0 and
2.14.1; it replaces the deprecated ``broadcast_buffers``, the only one up to 2.11, the course's floor 2.9.1
included; on by default either way: ``sync_flag`` asks the torch in use), and DDP broadcasts only before a forward whose
*previous* forward ran with gradient synchronisation on -- so ``no_sync`` changes how often it happens.

``buffer_sync_counts`` measures that rhythm: two gloo processes on this CPU train a small module with
buffers, K micro-batches per update, with ``no_sync`` and with every micro-batch synchronised, and count
the broadcasts two independent ways:

1. every call of ``torch.distributed._broadcast_coalesced`` (what DDP calls to broadcast buffers),
   counted by a wrapper in each rank;
2. the effect: before every forward each rank writes its own number into a marker buffer; when rank 1's
   forward sees rank 0's number, a broadcast happened.

The ranks meet through a FileStore in a private folder and talk over the loopback interface, like
the engine's runs (``labkit.engine.launch``); nothing outlives the call.

The last section turns chapter 06's measurements into rows and verdict names (``sweep_rows``,
``exact_rows``, ``buffer_rows``, ``buffer_rhythm``, ``reference_table``): the chapter draws the tables and
says the sentence each verdict calls for, in its own cells.
"""
from __future__ import annotations

import contextlib
import inspect
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ..engine import ddp as ddp_mod
from ..engine import launch
from ..engine.config import PRESETS, _choice, _int, _num
from ..base.errors import ConfigError
from ..engine.ddp import RunError
from ..engine.model import GPT
from ..tools import reference
from . import course

# no_sync on the first K-1 micro-batches; every micro-batch synchronised; the same with buffer sync switched off
MODES = ("no_sync", "every_micro", "sync_off")
_MARK = 1_000_000  # rank r writes r * _MARK + i before micro-step i: rank 0's values are plain i


def sync_flag() -> str:
    """The DDP argument that switches the forward-time buffer broadcast in this torch version."""
    params = inspect.signature(DDP.__init__).parameters
    return "forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers"


class BufferProbe(nn.Module):
    """Linear -> BatchNorm1d -> Linear, plus a marker buffer that forward reads (see the module doc)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
        self.register_buffer("marker", torch.zeros((), dtype=torch.long))
        self.seen = []  # the marker's value at the start of each forward, after DDP's broadcast

    def forward(self, x):
        self.seen.append(int(self.marker))
        return self.body(x).pow(2).mean()


@contextlib.contextmanager
def _counting_broadcasts(counter: list):
    """Count calls of dist._broadcast_coalesced (DDP looks it up on every call, so a wrapper sees them)."""
    real = getattr(dist, "_broadcast_coalesced", None)
    if real is None:  # another torch: the effect count still works
        counter.append(None)
        yield
        return

    def counted(*args, **kwargs):
        counter[0] += 1
        return real(*args, **kwargs)

    dist._broadcast_coalesced = counted
    try:
        yield
    finally:
        dist._broadcast_coalesced = real


def _one_mode(mode: str, rank: int, accum: int, updates: int, seed: int) -> dict:
    """Train the probe for ``updates`` updates of ``accum`` micro-batches under one sync mode."""
    torch.manual_seed(seed)  # the same replica on every rank
    module = BufferProbe()
    calls = [0]
    with _counting_broadcasts(calls):
        ddp = DDP(module, **({sync_flag(): False} if mode == "sync_off" else {}))
        at_wrap = calls[0]  # DDP's one-off broadcast of parameters and buffers when it wraps the model
        opt = torch.optim.SGD(module.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(seed + 1 + rank)  # each rank its own data, as in DDP
        synced, i = [], 0
        for u in range(updates):
            for k in range(accum):
                i += 1
                module.marker.fill_(rank * _MARK + i)
                quiet = mode == "no_sync" and k < accum - 1
                with ddp.no_sync() if quiet else contextlib.nullcontext():
                    ddp(torch.randn(4, 8, generator=g)).backward()
                if module.seen[-1] == i:  # rank 0's number: a broadcast arrived before this forward
                    synced.append([u, k])
            opt.step()
            opt.zero_grad(set_to_none=True)
    return {"broadcasts": None if calls[-1] is None else calls[0] - at_wrap,
            "at_wrap": None if calls[-1] is None else at_wrap,
            "synced_micro_steps": synced, "flag_default": bool(getattr(ddp, "forward_sync_buffers",
                                                                       getattr(ddp, "broadcast_buffers", True)))
            if mode != "sync_off" else None}


def _buffer_rank(rank, accum: int, updates: int, seed: int) -> dict:
    """A rank (``launch.rank_main`` runs it, warm or spawned): join the group the engine's way, run every mode."""
    torch.set_num_threads(1)
    with ddp_mod.process_group("cpu", rank.rank, rank.world_size, rank.file_store()):
        return {mode: _one_mode(mode, rank.rank, accum, updates, seed) for mode in MODES}


def buffer_sync_counts(accum: int = 4, updates: int = 3, world_size: int = 2, seed: int = 0,
                       timeout_s: float = 120.0) -> dict:
    """Count DDP's buffer broadcasts per update under ``no_sync`` and with every micro-batch synchronised.

    Runs ``world_size`` gloo processes on this CPU. Returns the torch version, the flag's name and
    default, the probe's buffers, and per mode (``MODES``): ``broadcasts`` (calls counted in rank 0;
    None if this torch has no such function to count), ``seen`` (forwards in which rank 1 saw rank 0's
    marker), ``per_update`` and ``synced_micro_steps`` ([update, micro-step] pairs), plus ``at_wrap``
    (the one-off broadcast when DDP wraps the model, not counted in ``broadcasts``)."""
    _int("accum", accum, 1, 64)
    _int("updates", updates, 1, 100)
    _int("world_size", world_size, 2, 8)  # gloo processes on this CPU: more would only wait for cores
    _int("seed", seed, 0, 2**63 - 1)
    _num("timeout_s", timeout_s, 0.0, 3600.0, lo_open=True)
    t0 = time.monotonic()
    # spawned ranks (a forked torch can deadlock) that meet in a private folder; none outlives the block
    with launch.spawn_ranks(_buffer_rank, world_size, (accum, updates, seed), prefix="labkit-ddplab-") as ranks:
        reports = ranks.collect(timeout_s, "buffer-sync measurement")
    probe = BufferProbe()
    modes = {}
    for mode in MODES:
        r0, r1 = reports[0][mode], reports[1][mode]
        modes[mode] = {"broadcasts": r0["broadcasts"], "broadcasts_rank1": r1["broadcasts"],
                       "seen": len(r1["synced_micro_steps"]), "synced_micro_steps": r1["synced_micro_steps"],
                       "per_update": len(r1["synced_micro_steps"]) / updates, "at_wrap": r0["at_wrap"]}
    return {"torch_version": torch.__version__, "flag": sync_flag(),
            "flag_default": reports[0]["no_sync"]["flag_default"], "accum": accum, "updates": updates,
            "world_size": world_size, "backend": "gloo",
            "buffers": [n for n, _ in probe.named_buffers()],
            "buffer_bytes": sum(b.numel() * b.element_size() for b in probe.buffers()),
            "modes": modes, "seconds": round(time.monotonic() - t0, 1)}


def gpt_buffers(model: str = "small") -> list:
    """The buffers of labkit's GPT for a preset (built on the meta device: no memory, no time)."""
    _choice("model", model, tuple(PRESETS))
    with torch.device("meta"):
        return [name for name, _ in GPT(PRESETS[model]).named_buffers()]


def pattern(result: dict, mode: str) -> str:
    """One character per micro-batch, updates separated by '|': 'B' where buffers were broadcast."""
    _choice("mode", mode, MODES)
    if not isinstance(result, dict) or not {"modes", "accum", "updates"} <= set(result):
        raise ConfigError("result", type(result).__name__, "the dict buffer_sync_counts returns")
    hit = {tuple(s) for s in result["modes"][mode]["synced_micro_steps"]}
    return " | ".join("".join("B" if (u, k) in hit else "." for k in range(result["accum"]))
                      for u in range(result["updates"]))


# ---- chapter 06's measurements as rows and verdict names -------------------------------------------------
# The chapter's cells draw the tables (``lk.course.table``) and choose their sentences (``lk.course.explain``);
# what is computed here is figures and the names of outcomes, never the words.

def _summary(name: str, value, keys) -> dict:
    if not isinstance(value, dict) or not set(keys) <= set(value):
        raise ConfigError(name, type(value).__name__, f"a run's summary with {', '.join(sorted(keys))}")
    return value


def _sweep_ks(sweep: dict) -> list:
    if not isinstance(sweep, dict) or not sweep or not all(isinstance(k, tuple) and len(k) == 2 for k in sweep):
        raise ConfigError("sweep", type(sweep).__name__, "a dict {(ddp_sync, K): run summary}")
    return sorted({k for _, k in sweep})


def sweep_rows(sweep: dict) -> list:
    """One row per K of a ``{(ddp_sync, K): summary}`` sweep: each loop's AllReduce calls and MiB per update,
    and its bytes per update over the gradient bytes (1 with no_sync, K with every_micro when DDP syncs every
    gradient once per synchronisation)."""
    rows = []
    for k in _sweep_ks(sweep):
        row = {"K": k}
        for sync in ("no_sync", "every_micro"):
            s = _summary("sweep", sweep.get((sync, k)), ("allreduce_calls_per_update", "allreduce_bytes_per_update",
                                                          "grad_bytes"))
            row.update({f"{sync}_calls": s["allreduce_calls_per_update"],
                        f"{sync}_mib": s["allreduce_bytes_per_update"] / 2**20,
                        f"{sync}_per_grad": s["allreduce_bytes_per_update"] / s["grad_bytes"]})
        row["calls_ratio"] = row["every_micro_calls"] / row["no_sync_calls"] if row["no_sync_calls"] else None
        rows.append(row)
    return rows


def plot_sync_sweep(sweep: dict, width: float = 5.0, height: float = 2.8):
    """AllReduce calls per update against K, one line per loop."""
    ks = _sweep_ks(sweep)
    from ..tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height)
    ax = fig.add_subplot(1, 1, 1)
    for sync, color in (("every_micro", "#c44e52"), ("no_sync", "#4c72b0")):
        ax.plot(ks, [sweep[sync, k]["allreduce_calls_per_update"] for k in ks], "o-", color=color, label=sync)
    ax.set_xlabel("accumulation steps K")
    ax.set_ylabel("AllReduce calls per update")
    ax.set_xticks(ks)
    ax.legend(fontsize=8)
    return fig


def reference_table():
    """The GPU reference points of the accumulation and DDP sections as a table (label, AllReduce calls and ms
    per update) -- None where none are shipped (the chapter's opening cell has said so once), so a cell that
    ends with it shows nothing."""
    pts = [p for p in reference.points(section="accumulation") + reference.points(section="ddp")
           if p.get("status") == "ok"]
    rows = []
    for p in pts:
        s = p.get("summary") or {}
        ms = 1e3 * s["step_time_s"] if s.get("step_time_s") is not None else None
        rows.append({"label": p.get("label"), "calls": s.get("allreduce_calls_per_update"), "ms": ms})
    return course.table(rows, [("label", "GPU reference", "{}"), ("calls", "AllReduce calls per update", "{:.0f}"),
                               ("ms", "ms per update", "{:.1f}")]) if rows else None


def exact_rows(cmp) -> list:
    """A comparison's exact counts, one row per arm: its label, AllReduce calls and MiB per update (the same in
    every run) and the final loss of its first run -- the same maths, different traffic."""
    if not all(hasattr(cmp, k) for k in ("results_a", "results_b", "exact", "label_a", "label_b")):
        raise ConfigError("cmp", type(cmp).__name__, "a comparison of lk.compare_configs")
    calls = cmp.exact.get("allreduce_calls_per_update")
    nbytes = cmp.exact.get("allreduce_bytes_per_update")
    for name, v in (("allreduce_calls_per_update", calls), ("allreduce_bytes_per_update", nbytes)):
        if not isinstance(v, (list, tuple)) or len(v) != 2 or not v[0]:
            raise ConfigError(name, v, "the pair (a, b) a comparison's .exact holds for an AllReduce count")
    return [{"loop": label, "calls": calls[i], "mib": nbytes[i] / 2**20,
             "calls_ratio": calls[i] / calls[0], "final_loss": rs[0].summary.get("final_loss")}
            for i, (label, rs) in enumerate(((cmp.label_a, cmp.results_a), (cmp.label_b, cmp.results_b)))]


def _buffer_result(bs) -> dict:
    if not isinstance(bs, dict) or not {"modes", "accum", "updates", "flag", "buffers"} <= set(bs):
        raise ConfigError("bs", type(bs).__name__, "the dict buffer_sync_counts returns")
    return bs


def buffer_rows(bs: dict) -> list:
    """``buffer_sync_counts``' result, one row per mode: the broadcast pattern (``pattern``), the broadcasts
    rank 1 saw, per update, and DDP's broadcast calls counted in rank 0 (None where this torch has none to
    count)."""
    _buffer_result(bs)
    return [{"mode": mode, "pattern": pattern(bs, mode), "seen": m["seen"], "per_update": m["per_update"],
             "broadcasts": m["broadcasts"]} for mode, m in bs["modes"].items()]


def buffer_rhythm(bs: dict) -> str:
    """The verdict name of ``buffer_sync_counts``' result: 'counts_disagree' when DDP's broadcast calls and
    what rank 1 saw differ (this torch broadcasts another way: trust the marker), 'gradient_rhythm' when
    ``no_sync`` broadcast once per update and every micro-batch synchronised K times (the gradient
    AllReduce's rhythm), else 'other_rhythm'."""
    _buffer_result(bs)
    modes, k = bs["modes"], bs["accum"]
    if any(m["broadcasts"] is not None and m["broadcasts"] != m["seen"] for m in modes.values()):
        return "counts_disagree"
    if modes["no_sync"]["per_update"] == 1 and modes["every_micro"]["per_update"] == k:
        return "gradient_rhythm"
    return "other_rhythm"
