"""What DDP communicates besides gradients: module buffers, counted on real processes.

``DistributedDataParallel`` keeps replicas identical in two ways. Gradients are all-reduced in
backward (chapter 06 counts those with a comm hook). Module *buffers* -- tensors a module keeps that
are not parameters, such as BatchNorm's running mean and variance -- are broadcast from rank 0 at the
start of a forward pass. In torch 2.13 the switch is ``forward_sync_buffers`` (it replaces the
deprecated ``broadcast_buffers``; on by default), and DDP broadcasts only before a forward whose
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

The last section holds the sentences chapter 06 shows beside its counts (``two_procs_note`` & co.):
the words live here, every figure in them comes from the run the chapter hands in.
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
from ..engine.gpus import world_size
from ..base.errors import ConfigError
from ..engine.ddp import RunError
from ..engine.model import GPT
from ..tools import reference
from .course import Note, reference_note as course_note

MODES = ("no_sync", "every_micro", "sync_off")
MODE_WORDS = {
    "no_sync": "`no_sync` on the first K-1 micro-batches",
    "every_micro": "every micro-batch synchronised",
    "sync_off": "every micro-batch synchronised, buffer sync switched off",
}
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


# ---- what chapter 06 says beside its counts ----------------------------------------------------------------
# The words stay here, each figure comes from the run handed in: a chapter cell reads
# ``display(ddplab.two_procs_note(s))`` instead of the f-strings that build the sentence.

def _mib(nbytes) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


def _summary(name: str, value, keys) -> dict:
    if not isinstance(value, dict) or not set(keys) <= set(value):
        raise ConfigError(name, type(value).__name__, f"a run's summary with {', '.join(sorted(keys))}")
    return value


def setup_note(n_gpus: int, planned_s: float, device: str, smoke: bool) -> Note:
    """The chapter's opening line: the device, and how long its one timed A/B takes."""
    _int("n_gpus", n_gpus, 0, 1 << 20)
    _num("planned_s", planned_s, 0.0, 86_400.0)
    # the GPU plan's world size decides where the two processes run: two GPUs (NCCL), else CPU processes (gloo)
    where = ("Two GPUs are visible, so this chapter runs real NCCL DDP at world size 2: the AllReduce counts are "
             "the same as on the CPU, the times are NCCL's" if world_size(n_gpus) == 2 else
             "Fewer than two GPUs are visible, so the two processes are CPU processes talking over gloo")
    # the set-up cell has said the device: this line adds what DDP needs, the number of GPUs
    gpus = f"{n_gpus} GPU" + ("" if n_gpus == 1 else "s")
    return Note(f"{gpus} visible; short mode: {'on' if smoke else 'off'}. {where}. The "
                f"timed A/B comparison of this chapter repeats its two-process runs, interleaved, for about "
                f"**{planned_s / 60:.1f} minutes**; everything else is counted exactly and takes less.")


def baseline_note(baseline: dict) -> Note:
    """Which baseline the chapter runs, and where: GPUs with NCCL or CPU processes with gloo."""
    b = _summary("baseline", baseline, ("model", "device", "accum", "micro_batch", "bucket_cap_mb"))
    where = "GPUs (NCCL)" if b["device"] == "cuda" else "CPU processes (gloo)"
    return Note(f"`{b['model']}` on {where}: world size 2, K={b['accum']}, micro-batch {b['micro_batch']}, "
                f"buckets of {b['bucket_cap_mb']} MB.")


def two_procs_note(s: dict) -> Note:
    """The two-process baseline's counts: AllReduce calls and bytes per update, replicas, loss, time."""
    _summary("s", s, ("world_size", "steps", "accum", "allreduce_calls_per_update", "n_buckets",
                      "allreduce_bytes_per_update", "grad_bytes", "replicas_identical", "first_loss",
                      "final_loss", "step_time_s"))
    return Note(f"{s['world_size']} processes, {s['steps']} updates of K={s['accum']}: "
                f"**{s['allreduce_calls_per_update']:.0f} AllReduce calls per update** ({s['n_buckets']} buckets, "
                f"once per update), {_mib(s['allreduce_bytes_per_update'])} per update against "
                f"{_mib(s['grad_bytes'])} of gradients; replicas identical after training: "
                f"**{s['replicas_identical']}**; loss {s['first_loss']:.2f} → {s['final_loss']:.2f}; "
                f"{1e3 * s['step_time_s']:.0f} ms per update.")


def buckets_note(tl: dict) -> Note:
    """When bucket 0 and the last bucket were ready, as shares of backward (``netmodel.bucket_timeline``)."""
    _summary("tl", tl, ("buckets", "backward_s", "bucket_cap_mb", "first_update_buckets"))
    bk, bw = tl["buckets"], tl["backward_s"]
    return Note(f"{len(bk)} buckets of at most {tl['bucket_cap_mb']:g} MB (the first update used "
                f"**{tl['first_update_buckets']}**). Bucket 0 was ready after **{bk[0]['t_s'] / bw:.0%}** of "
                f"backward, the last at **{bk[-1]['t_s'] / bw:.0%}**: everything before the last bucket can "
                "overlap with the rest of backward.")


def first_bucket_note(run) -> Note:
    """AllReduce calls of a run's first update (one bucket: DDP learns the order) against its last."""
    recs = getattr(run, "records", None)
    if not recs or "allreduce_calls" not in recs[0]:
        raise ConfigError("run", type(run).__name__, "a result of lab.run() / lk.run() with its records")
    return Note(f"In the two-process run: update 1 launched **{recs[0]['allreduce_calls']}** AllReduce call(s), "
                f"the last update **{recs[-1]['allreduce_calls']}**.")


def _sweep_ks(sweep: dict) -> list:
    if not isinstance(sweep, dict) or not sweep or not all(isinstance(k, tuple) and len(k) == 2 for k in sweep):
        raise ConfigError("sweep", type(sweep).__name__, "a dict {(ddp_sync, K): run summary}")
    return sorted({k for _, k in sweep})


def sync_sweep_note(sweep: dict) -> Note:
    """The sweep as a table (calls and MiB per update, per K and loop) and the ratio at the largest K."""
    ks = _sweep_ks(sweep)
    rows = ["| K | no_sync calls | no_sync MiB | every_micro calls | every_micro MiB |", "|---|---|---|---|---|"]
    for k in ks:
        a, b = sweep["no_sync", k], sweep["every_micro", k]
        rows.append(f"| {k} | {a['allreduce_calls_per_update']:.0f} | {a['allreduce_bytes_per_update'] / 2**20:.2f} "
                    f"| {b['allreduce_calls_per_update']:.0f} | {b['allreduce_bytes_per_update'] / 2**20:.2f} |")
    top = ks[-1]
    calls = {sync: sweep[sync, top]["allreduce_calls_per_update"] for sync in ("no_sync", "every_micro")}
    times = calls["every_micro"] / calls["no_sync"]
    return Note("\n".join(rows) + f"\n\nAt K={top} the naive loop launched **{times:.0f}×** the AllReduce calls of "
                "the `no_sync` loop.")


def sweep_vs_baseline_note(sweep: dict, s: dict, seq_len: int, base_seq_len: int) -> Note:
    """How the sweep's runs (short sequences) compare with the two-process baseline: the gradient bytes differ
    when the sequence length does (the position embedding has one row per position), and whether the bucket
    count -- what the calls depend on -- came out the same, from the two runs' own counts."""
    a = _summary("sweep", sweep.get(("no_sync", _sweep_ks(sweep)[0])), ("grad_bytes", "n_buckets"))
    _summary("s", s, ("grad_bytes", "n_buckets"))
    same = a["n_buckets"] == s["n_buckets"]
    bytes_words = (f"Gradient bytes: {_mib(a['grad_bytes'])} in these runs against {_mib(s['grad_bytes'])} in "
                   f"the two-process baseline"
                   + (f": the position embedding has one row per position, {seq_len} here against "
                      f"{base_seq_len} there, so the model is a little smaller. " if a["grad_bytes"] != s["grad_bytes"]
                      else ". "))
    return Note(bytes_words + (f"Both cut the gradients into {s['n_buckets']} buckets, so the calls per update "
                               "are the ones the baseline would count." if same else
                               f"That moved a bucket boundary: {a['n_buckets']} buckets here against "
                               f"{s['n_buckets']} there, so the calls below differ from the baseline's too."))


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


def bytes_note(sweep: dict) -> Note:
    """Bytes per update over gradient bytes, per K and loop: 1 with no_sync, K with every_micro."""
    ks = _sweep_ks(sweep)
    g = sweep["no_sync", ks[0]]["grad_bytes"]
    rows = ["| K | no_sync: bytes / gradient bytes | every_micro: bytes / gradient bytes |", "|---|---|---|"]
    rows += [f"| {k} | {sweep['no_sync', k]['allreduce_bytes_per_update'] / g:.2f} | "
             f"{sweep['every_micro', k]['allreduce_bytes_per_update'] / g:.2f} |" for k in ks]
    return Note("\n".join(rows))


def fp16_note(fp16: dict, plain: dict) -> Note:
    """Bytes per update with the fp16_compress hook against the plain AllReduce."""
    a = _summary("fp16", fp16, ("allreduce_bytes_per_update",))["allreduce_bytes_per_update"]
    b = _summary("plain", plain, ("allreduce_bytes_per_update",))["allreduce_bytes_per_update"]
    return Note(f"fp16 compression: **{_mib(a)}** per update against {_mib(b)} ({a / b:.2f}×).")


def reference_lines() -> Note:
    """The GPU reference points of the accumulation and DDP sections: calls and time per update -- empty where
    none are shipped (the chapter's opening cell has said so once)."""
    pts = [p for p in reference.points(section="accumulation") + reference.points(section="ddp")
           if p.get("status") == "ok"]
    if not pts:
        return Note("")
    lines = [str.__str__(course_note("ddp"))]
    for p in pts:
        rs = p.get("summary") or {}
        lines.append(f"- {p.get('label')}: {rs['allreduce_calls_per_update']:.0f} AllReduce calls per update, "
                     f"{1e3 * rs['step_time_s']:.1f} ms per update")
    return Note("\n".join(lines))


def exact_note(calls, nbytes, cmp, accum: int) -> Note:
    """A comparison's exact counts (``calls`` and ``nbytes`` per update, the same in every run, a then b) and
    both arms' final losses: the same maths, different traffic."""
    for name, v in (("calls", calls), ("nbytes", nbytes)):
        if not isinstance(v, (list, tuple)) or len(v) != 2 or not v[0]:
            raise ConfigError(name, v, "the pair (a, b) a comparison's .exact holds, "
                                       "e.g. cmp.exact['allreduce_calls_per_update']")
    if not hasattr(cmp, "results_a"):
        raise ConfigError("cmp", type(cmp).__name__, "a comparison of lk.compare_configs")
    loss = [rs[0].summary["final_loss"] for rs in (cmp.results_a, cmp.results_b)]
    return Note(f"Exact, the same in every run: `{cmp.label_a}` **{calls[0]:.0f}** AllReduce calls and "
                f"{_mib(nbytes[0])} per update, `{cmp.label_b}` **{calls[1]:.0f}** calls and {_mib(nbytes[1])} — "
                f"**{calls[1] / calls[0]:.0f}×**, with K={accum}. Final losses {loss[0]:.4f} and {loss[1]:.4f}: "
                "the same maths, different traffic.")


def buffer_sync_note(bs: dict, model: str) -> Note:
    """``buffer_sync_counts``' result as the chapter shows it: the pattern per mode, then what it means."""
    if not isinstance(bs, dict) or not {"modes", "accum", "flag", "buffers", "torch_version"} <= set(bs):
        raise ConfigError("bs", type(bs).__name__, "the dict buffer_sync_counts returns")
    ns, em, off = (bs["modes"][m] for m in MODES)
    k, flag = bs["accum"], bs["flag"]
    lines = [f"torch {bs['torch_version']}: DDP's switch is `{flag}`, default {bs['flag_default']}; the probe's "
             f"buffers: {', '.join(bs['buffers'])}. `B` = buffers broadcast before that micro-batch's forward, "
             "`|` between updates:", ""]
    lines += [f"- {mode}: `{pattern(bs, mode)}`, {m['seen']} broadcasts, {m['per_update']:g} per update (DDP's "
              f"broadcast calls counted: {m['broadcasts']})" for mode, m in bs["modes"].items()]
    rhythm = ("the rhythm of the gradient AllReduce: only the first micro-batch of each update follows a "
              "synchronised step, so under `no_sync` only it pays" if ns["per_update"] == 1 and em["per_update"] == k
              else "a different rhythm from the gradient AllReduce in this torch version: read the pattern above")
    agree = all(m["broadcasts"] == m["seen"] for m in bs["modes"].values())
    gpt = gpt_buffers(model)
    lines += ["", f"With K={k}: buffers broadcast **{ns['per_update']:g}×** per update with `no_sync`, "
              f"**{em['per_update']:g}×** with every micro-batch synchronised, {off['per_update']:g}× with "
              f"`{flag}=False` — {rhythm}. Plus one broadcast of parameters and buffers when DDP wraps the model. "
              + ("Both counts agree (DDP's broadcast calls and what rank 1 saw). " if agree else
                 "The two counts disagree: this torch version broadcasts in another way; trust the marker. ")
              + (f"labkit's GPT (`{model}`) has **no buffers**, so its runs in this chapter make none of these "
                 "broadcasts: there, only gradients travel." if not gpt else
                 f"labkit's GPT has buffers ({', '.join(gpt)}): its runs broadcast them too.")]
    return Note("\n".join(lines))
