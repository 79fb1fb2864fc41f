"""Surviving a failure (taught in chapter 11): a rank killed mid-run, the whole job relaunched, resumed from
the last checkpoint, and ending with the same parameters -- bit for bit -- as a run nobody killed.

    res = lr.restart.failure_demo(model="tiny", micro_batch=4, updates=12, save_every=4, kill_at=10)
    res.equal, res.redone_updates, res.redone_s, res.restart_s, res.attempts, res.left_processes

The job: DDP on ``world_size`` ranks, labkit's GPT, AdamW, the batch a function of the update index, no
dropout; rank 0 saves every ``save_every`` updates, every rank loads the latest checkpoint when it starts,
and on the first attempt the last rank SIGKILLs itself at update ``kill_at`` (a crash: no exception, no
cleanup). ``run_with_restarts`` is the loop ``torchrun --max-restarts`` runs for you; the ranks meet through
labkit's FileStore in a private folder, with no listening socket (chapter 11 says why not torchrun here).
"""
from __future__ import annotations

import os
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ...base.runtime import ConfigError, RunError
from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS, _choice, real, whole
from ...engine.data import ByteWindows, corpus_path
from ...engine.launch import live_children, spawn_ranks
from ...engine.model import GPT
from ...tools.collectives import device_kind
from .state import device_for

CHECKPOINT = "latest.pt"
MAX_WORLD = 8

# ---- what the chapter shows: the code a learner writes at work ------------------------------------------

def save_latest(model, optimizer, step, path):
    """Write model + optimizer + step so that a crash in the middle -- of the process or of the machine -- never
    leaves a half-written file. That is all THIS job needs (no dropout, a constant learning rate, fp32, its data
    a function of the step); a run with more state saves more -- ``lr.state.save_checkpoint``, and each rank its
    own generators. Shown in 11_long_runs_and_failures."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, f)
        f.flush()
        os.fsync(f.fileno())  # its bytes on the disk first: a machine crash could otherwise keep an empty file
    os.replace(tmp, path)  # atomic rename: the previous checkpoint stays whole until the new one is complete
    folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    os.fsync(folder)  # the rename itself on the disk too (a process crash needs none of this; a host crash does)
    os.close(folder)


def load_latest(model, optimizer, path) -> int:
    """Load the latest checkpoint if there is one; the update to start from (0 on the first launch).
    Shown in 11_long_runs_and_failures."""
    if not os.path.exists(path):
        return 0
    device = next(model.parameters()).device
    state = torch.load(path, map_location=device, weights_only=True)  # tensors only: never unpickle code
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"]


def train_resumable(ddp_model, optimizer, batch_for, updates, save_every, path, before_update=None):
    """A DDP job that may die at any moment and be launched again: each launch resumes from the latest
    checkpoint and trains to ``updates``. Returns the update this launch started from.
    Shown in 11_long_runs_and_failures."""
    model = ddp_model.module
    start = load_latest(model, optimizer, path)  # every launch is a fresh process: it restores itself
    for step in range(start, updates):
        if before_update is not None:
            before_update(step)  # the demo's clock and its injected failure
        x, y = batch_for(step)  # the batch is a function of the update: a resumed job sees the same data
        ddp_model(x, y).backward()  # DDP averages the gradients over the ranks during the backward
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % save_every == 0 or step + 1 == updates:
            if dist.get_rank() == 0:  # the replicas are identical: one rank writes
                save_latest(model, optimizer, step + 1, path)
            dist.barrier()  # no rank runs ahead of a checkpoint that is not on disk yet
    return start


def run_with_restarts(target, world_size, args=(), max_restarts=3, timeout_s=120.0, what="the job", kind="cpu",
                      keep_warm=True):
    """Launch ``world_size`` ranks running ``target(rank, restart_count, *args)``; when a rank fails or dies,
    every rank of that attempt is ended and all are launched again -- at most ``max_restarts`` times, as
    ``torchrun --max-restarts`` does. Returns ({rank: result}, the attempts); gives up with a RunError.

    ``keep_warm``: relaunch from labkit's warm server (a fork of a Python that imported torch once: a rank's
    death leaves it untouched); False stops it after a failure, so the relaunch imports torch afresh, as a
    cluster's relaunch does. Shown in 11_long_runs_and_failures (code-11-restart)."""
    attempts = []
    for restart in range(max_restarts + 1):
        began, codes, error, first = time.monotonic(), {}, None, None
        try:
            with spawn_ranks(target, world_size, (restart, *args), kind=kind, prefix="labkit-ch11-ranks-") as ranks:
                try:
                    results = ranks.collect(timeout_s, f"{what}, attempt {restart + 1}")
                except RunError as e:
                    # collect() waited for the others to report or be reaped, then read the codes -- before the
                    # survivors were ended -- and named the rank that ended first (a killed rank's exit code is
                    # known only once it is reaped; its survivor's "connection closed" often arrives sooner)
                    codes = getattr(e, "exit_codes", {})
                    first = getattr(e, "first", None)
                    error = first.words() if first is not None else str(e)
                    ranks.failed = not keep_warm  # the block's end still ends every rank of this attempt
        except RunError as e:  # the launch itself failed
            codes, error, first = {}, str(e), None
        if error is not None:
            attempts.append(Attempt(restart + 1, False, error, codes, began, time.monotonic(),
                                    first.rank if first is not None else None))
            continue
        attempts.append(Attempt(restart + 1, True, "", {r: 0 for r in range(world_size)}, began, time.monotonic()))
        return results, attempts
    err = RunError(f"{what} failed {len(attempts)} time{'s' if len(attempts) > 1 else ''} and max_restarts="
                   f"{max_restarts} allows no more restarts; the last failure: {attempts[-1].error}")
    err.attempts = attempts
    raise err


def measure_save(model: str = "tiny", repeats: int = 5) -> dict:
    """Seconds ``save_latest`` takes for the GPT ``model`` with AdamW's state (after one update), on this
    machine's temporary folder: median, min and max of ``repeats`` saves (the first, warm-up, left out)."""
    _choice("model", model, tuple(PRESETS))
    if whole("repeats", repeats) > 50:
        raise ConfigError("repeats", repeats, "1 to 50 saves")
    torch.manual_seed(0)
    net = GPT(PRESETS[model])
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (1, PRESETS[model].seq_len))
    net(x, x).backward()
    opt.step()  # AdamW's moments exist only after a step
    times = []
    with tempfile.TemporaryDirectory(prefix="labkit-ch11-") as tmp:
        path = os.path.join(tmp, CHECKPOINT)
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            save_latest(net, opt, 1, path)
            if i:  # the first save warms the file system's caches and torch's pickler: left out
                times.append(time.perf_counter() - t0)
        size = os.path.getsize(path)
    return {"model": model, "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "repeats": repeats, "bytes": size}


# ---- plumbing: the demo's ranks, clock and result --------------------------------------------------------

@dataclass
class Attempt:
    """One launch of the job: ``number`` from 1, how it ended, the ranks' exit codes when it failed (a
    negative code: killed by that signal), and when it began and ended (``time.monotonic()``, seconds)."""

    number: int
    ok: bool
    error: str
    exit_codes: dict
    began: float
    ended: float
    first_rank: int | None = None  # the rank that failed or died first (launch.first_end), when one did


def _batch_for(ds, step, batch, seed, mine, device):
    """Update ``step``'s global batch (the same on every rank, a function of the step alone); this rank's slice."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    idx = torch.randint(0, len(ds), (batch,), generator=g)[mine].tolist()
    xs, ys = zip(*(ds[i] for i in idx))
    return torch.stack(xs).to(device), torch.stack(ys).to(device)


def _job_rank(rank, restart, kind, model, micro_batch, updates, save_every, kill_at, run_dir, corpus, seed):
    """A rank of the demo's job: the clock (one line per update start in this attempt's log), the failure
    (the last rank SIGKILLs itself at ``kill_at`` on the first attempt), and ``train_resumable``."""
    t_start = time.monotonic()
    r, ws = rank.rank, rank.world_size
    device = device_for(kind, r, strict=True)
    spec = PRESETS[model]
    ds = ByteWindows(corpus, spec.seq_len)
    mine = slice(r * micro_batch, (r + 1) * micro_batch)
    log = open(os.path.join(run_dir, f"log-{restart}-{r}.txt"), "a", buffering=1)  # noqa: SIM115 -- may be killed

    def before_update(step):
        log.write(f"{step} {time.monotonic()!r}\n")  # line-buffered: on disk before a kill
        if restart == 0 and step == kill_at and r == ws - 1:
            os.kill(os.getpid(), signal.SIGKILL)  # a real, abrupt death: no exception, no cleanup

    with ddp_mod.process_group(kind, r, ws, rank.file_store()):
        torch.manual_seed(seed)
        net = GPT(spec).to(device)
        ddp_model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[r] if kind == "cuda" else None)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.0)
        t_ready = time.monotonic()
        try:
            start = train_resumable(ddp_model, opt, lambda s: _batch_for(ds, s, micro_batch * ws, seed, mine, device),
                                    updates, save_every, os.path.join(run_dir, CHECKPOINT), before_update)
        finally:
            # DDP's reducer holds the group: free it while the group exists. Freed after the group is destroyed,
            # the reducer's destructor joins gloo's worker thread holding the GIL that thread may be waiting for:
            # a rank stuck for good (seen here about one run in ten, under load).
            del ddp_model
    log.close()
    return {"start": start, "t_start": t_start, "t_ready": t_ready, "t_end": time.monotonic()}


def _unique_numel(state: dict) -> int:
    """Parameters in a state dict, a tied weight counted once (torch.save keeps the two names on one storage)."""
    return sum({v.untyped_storage().data_ptr(): v.numel() for v in state.values()}.values())


def _log(run_dir, restart, r) -> list:
    """[(update, monotonic time its work began)] from one rank's log of one attempt."""
    path = os.path.join(run_dir, f"log-{restart}-{r}.txt")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [(int(a), float(b)) for a, b in (line.split() for line in f if line.strip())]


@dataclass
class FailureResult:
    """What ``failure_demo`` measured. Seconds are wall time on this machine (``time.monotonic``); the
    timeline's times are seconds from the interrupted job's first launch."""

    model: str
    kind: str                # "cpu" (gloo) or "cuda" (NCCL)
    world_size: int
    micro_batch: int
    updates: int
    save_every: int
    kill_at: int
    n_params: int
    equal: bool              # every final parameter torch.equal to the uninterrupted run's
    max_abs_diff: float
    killed: str              # how the first attempt ended, e.g. "rank 1 died (killed by SIGKILL)"
    n_attempts: int
    resumed_from: int        # the checkpoint's step the second attempt loaded
    redone_updates: int      # kill_at - resumed_from
    lost_s: float            # first attempt: from the last checkpoint to the kill (work thrown away)
    redone_s: float          # second attempt: the seconds it spent redoing those updates
    detect_s: float          # from the kill until every rank of that attempt was ended
    restart_s: float         # from then until the new rank 0 started its first update (new processes + load)
    spawn_s: float           # of restart_s: until the new rank 0 ran its first line
    setup_s: float           # of restart_s: process group, model, DDP
    load_s: float            # of restart_s: reading the checkpoint and loading it
    update_s: float          # median seconds per update, uninterrupted run
    reference_s: float       # the uninterrupted run, wall
    interrupted_s: float     # the interrupted run, every attempt, wall
    checkpoint_bytes: int
    left_processes: int | None  # processes left after the demo (None: psutil not installed)
    attempts: list = field(default_factory=list)  # Attempt per launch
    timeline: dict = field(default_factory=dict)  # for the chart: attempts' update starts, the kill, checkpoints


def _check(model, micro_batch, updates, save_every, kill_at, world_size, seed, max_restarts, timeout_s):
    _choice("model", model, tuple(PRESETS))
    whole("micro_batch", micro_batch)
    if whole("updates", updates) < 2:
        raise ConfigError("updates", updates, "2 or more updates (one to fail in, one to finish)")
    if whole("save_every", save_every) > updates:
        raise ConfigError("save_every", save_every, f"1 to updates={updates} updates between checkpoints")
    if whole("kill_at", kill_at, 0) >= updates:
        raise ConfigError("kill_at", kill_at, f"an update from 0 to updates - 1 = {updates - 1} (the failure "
                          "must come before the run ends)")
    if not 1 <= whole("world_size", world_size) <= MAX_WORLD:
        raise ConfigError("world_size", world_size, f"1 to {MAX_WORLD} ranks (each is a process)")
    whole("seed", seed, 0)
    if whole("max_restarts", max_restarts, 0) > 10:
        raise ConfigError("max_restarts", max_restarts, "0 to 10 restarts")
    real("timeout_s", timeout_s, strict=True, allowed="seconds > 0")


def _left() -> int | None:
    try:
        return len(live_children())
    except ImportError:  # psutil (the course extras) lists the processes
        return None


def failure_demo(model: str = "tiny", micro_batch: int = 4, updates: int = 12, save_every: int = 4,
                 kill_at: int = 10, world_size: int = 2, seed: int = 0, max_restarts: int = 3,
                 timeout_s: float = 120.0) -> FailureResult:
    """The same DDP job twice: uninterrupted, then with its last rank SIGKILLed at update ``kill_at`` of the
    first attempt and relaunched by ``run_with_restarts``. Compares the final parameters bit for bit and
    measures the redone work, the restart's cost and what is left running. Files live in a temporary folder
    (removed); a job that runs out of restarts raises RunError (after every process is gone)."""
    _check(model, micro_batch, updates, save_every, kill_at, world_size, seed, max_restarts, timeout_s)
    kind, corpus = device_kind(world_size), str(corpus_path(None))  # the corpus built once, here, not by each rank
    with tempfile.TemporaryDirectory(prefix="labkit-ch11-") as tmp:
        ref_dir, run_dir = os.path.join(tmp, "uninterrupted"), os.path.join(tmp, "interrupted")
        os.mkdir(ref_dir)
        os.mkdir(run_dir)
        job = (kind, model, micro_batch, updates, save_every)
        t0 = time.monotonic()
        run_with_restarts(_job_rank, world_size, (*job, None, ref_dir, corpus, seed), 0, timeout_s,
                          "the uninterrupted job", kind)
        reference_s = time.monotonic() - t0
        results, attempts = run_with_restarts(_job_rank, world_size, (*job, kill_at, run_dir, corpus, seed),
                                              max_restarts, timeout_s, "the interrupted job", kind)
        interrupted_s = time.monotonic() - t0 - reference_s
        ref = torch.load(os.path.join(ref_dir, CHECKPOINT), map_location="cpu", weights_only=True)["model"]
        got = torch.load(os.path.join(run_dir, CHECKPOINT), map_location="cpu", weights_only=True)["model"]
        size = os.path.getsize(os.path.join(run_dir, CHECKPOINT))
        ref_log = _log(ref_dir, 0, 0)
        logs = {a.number - 1: _log(run_dir, a.number - 1, 0) for a in attempts}
        kill_log = _log(run_dir, 0, world_size - 1)
    equal = ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
    diff = max(float((ref[k].double() - got[k].double()).abs().max()) for k in ref)
    last, first, second = results[0], attempts[0], attempts[1] if len(attempts) > 1 else attempts[0]
    resumed, t_kill = last["start"], kill_log[-1][1]
    starts = dict(logs[len(attempts) - 1])
    first_starts = dict(logs[0])
    step_times = [b[1] - a[1] for a, b in zip(ref_log, ref_log[1:])]
    timeline = {"origin": first.began, "kill": (kill_at, t_kill - first.began),
                "checkpoints": sorted({*range(save_every, updates + 1, save_every), updates}),
                "attempts": [{"number": a.number, "ok": a.ok, "began": a.began - first.began,
                              "ended": a.ended - first.began,
                              "updates": [(s, t - first.began) for s, t in logs[a.number - 1]]} for a in attempts],
                "end": last["t_end"] - first.began}
    return FailureResult(
        model=model, kind=kind, world_size=world_size, micro_batch=micro_batch, updates=updates,
        save_every=save_every, kill_at=kill_at, n_params=_unique_numel(ref),
        equal=bool(equal), max_abs_diff=diff, killed=first.error, n_attempts=len(attempts), resumed_from=resumed,
        redone_updates=kill_at - resumed,
        lost_s=t_kill - first_starts.get(resumed, t_kill),
        redone_s=starts.get(kill_at, last["t_end"]) - starts.get(resumed, last["t_ready"]),
        detect_s=first.ended - t_kill, restart_s=starts.get(resumed, last["t_ready"]) - second.began,
        spawn_s=last["t_start"] - second.began, setup_s=last["t_ready"] - last["t_start"],
        load_s=starts.get(resumed, last["t_ready"]) - last["t_ready"],
        update_s=statistics.median(step_times) if step_times else 0.0, reference_s=reference_s,
        interrupted_s=interrupted_s, checkpoint_bytes=size, left_processes=_left(), attempts=attempts,
        timeline=timeline)


# ---- what the chapter draws from a result: figures, verdict names, a chart (the words are the chapter's) -----

def first_exit(res: FailureResult) -> dict:
    """How the rank that ended first in the first attempt ended, by its exit status, read once that rank was
    reaped (a survivor's broken connection arrives sooner; it is a consequence, never the one blamed):
    {"how": "signal" | "code" | "unknown", "rank", "code", "signal"} -- "unknown" when the first attempt did
    not fail or its code was not read; a negative code is the signal that ended it."""
    first = res.attempts[0] if res.attempts else None
    rank = first.first_rank if first is not None else None
    code = first.exit_codes.get(rank) if rank is not None else None
    if code in (None, 0):
        return dict(how="unknown", rank=rank, code=code, signal=None)
    return dict(how="signal" if code < 0 else "code", rank=rank, code=code, signal=-code if code < 0 else None)


def leftover(res: FailureResult) -> str:
    """'none': no process outlived the demo; 'uncounted': psutil is not installed, so none were counted;
    'left': some did (``res.left_processes``)."""
    return {0: "none", None: "uncounted"}.get(res.left_processes, "left")


def costs(res: FailureResult) -> dict:
    """The failure's price, measured: updates redone and their seconds (lost in the first attempt, spent again
    in the second), the time to notice, the restart and its parts, one update, the checkpoint's MiB."""
    return dict(kill_at=res.kill_at, resumed_from=res.resumed_from, redone=res.redone_updates, lost_s=res.lost_s,
                redone_s=res.redone_s, detect_s=res.detect_s, restart_s=res.restart_s, spawn_s=res.spawn_s,
                setup_s=res.setup_s, load_s=res.load_s, update_s=res.update_s,
                checkpoint_mib=res.checkpoint_bytes / 2**20, attempts=res.n_attempts)


def checkpoint_labels(checkpoints: list) -> list:
    """The y-axis labels of the checkpoints: the last save (at the run's end) shares one label with the save
    before it when they are under 3 updates apart, where two labels would print over each other."""
    labels = [f"ckpt {c}" for c in checkpoints]
    if len(checkpoints) > 1 and checkpoints[-1] - checkpoints[-2] < 3:
        labels[-2:] = ["", f"ckpt {checkpoints[-2]}, {checkpoints[-1]}"]
    return labels


def timeline_chart(res: FailureResult, ax=None):
    """The attempts on a time axis: each update rank 0 started, the checkpoints, the kill, the restart gap and
    the span of updates done twice."""
    import matplotlib.pyplot as plt  # deferred: a chart only, and matplotlib is slow to import

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 2.8))
    tl = res.timeline
    colors = ("#dd8452", "#4c72b0", "#55a868", "#8172b3")
    for i, a in enumerate(tl["attempts"]):
        ts = [t for _, t in a["updates"]]
        steps = [s for s, _ in a["updates"]]
        ax.step(ts, steps, where="post", color=colors[i % len(colors)], lw=2,
                label=f"attempt {a['number']} ({'finished' if a['ok'] else 'failed'})")
        ax.axvspan(a["began"], ts[0] if ts else a["ended"], color=colors[i % len(colors)], alpha=0.12, lw=0)
    k_step, k_t = tl["kill"]
    ax.plot([k_t], [k_step], "X", color="crimson", ms=10, label=f"rank SIGKILLed at update {k_step}")
    ax.axhspan(res.resumed_from, res.kill_at, color="crimson", alpha=0.10, lw=0,
               label=f"updates done twice ({res.redone_updates})")
    for c in tl["checkpoints"]:
        ax.axhline(c, color="grey", lw=0.6, ls=":")
    ax.set_yticks(tl["checkpoints"], checkpoint_labels(tl["checkpoints"]), fontsize=7)
    ax.set_xlabel("seconds since the first launch (shaded: start-up, restart included)")
    ax.set_ylabel("update")
    ax.set_title("A killed rank, the relaunch and the redone work (measured)", fontsize=10)
    ax.legend(frameon=False, fontsize=7, loc="lower right")
    return ax
