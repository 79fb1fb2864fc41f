"""Resume exactly, measured (taught in chapter 11): N updates straight against N/2 + save + a FRESH process +
load + N/2, compared bit for bit -- then the same resume with one checkpoint item left out at a time.

    r = lr.exact.resume_demo("tiny", micro_batch=4, updates=8)
    r.params_equal, r.losses_equal          # True, True: every parameter tensor torch.equal, every loss ==
    r.ablation["rng"].first_loss_diff       # the first update after the resume whose loss differs

The run is built so that every item matters: dropout (the RNG), AdamW (moments), a warm-up + cosine schedule,
fp16 with a GradScaler whose scale moves within a few updates, a shuffled loader with workers whose epoch
ends after the resume. Every leg is its own process: a resume knows only what the file holds.
"""
from __future__ import annotations

import hashlib
import io
import math
import os
import random
import re
import tempfile
import time
import warnings
from dataclasses import dataclass, field

import torch

from ...base.runtime import ConfigError
from ...engine.config import PRESETS, _choice, _int, _num
from ...engine.device import LoadMeter
from ...engine.launch import spawn_ranks
from ...engine.model import GPT
from . import state as st

PRECISIONS = ("auto", "fp16", "bf16", "fp32")
ABLATED = st.ITEMS[1:]  # every item but the model: without the weights there is nothing to resume
MAX_UPDATES = 200


# ---- what the chapter shows: the training loop the checkpoint has to capture ------------------------------

def warmup_cosine(warmup, total):
    """The lr factor at update ``step``: linear warm-up, then a cosine down to 10 % at ``total``."""
    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def train_updates(model, optimizer, scheduler, scaler, data, updates, dtype, max_norm=1.0):
    """``updates`` optimizer updates, one micro-batch each; returns (loss, lr, loss scale) per update."""
    log = []
    for _ in range(updates):
        x, y = next(data)
        lr, scale = optimizer.param_groups[0]["lr"], scaler.get_scale() if scaler else 1.0
        with torch.autocast(x.device.type, dtype=dtype, enabled=dtype is not None):
            loss = model(x, y)
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(optimizer)  # true gradients, so clipping sees their real norm
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        if scaler:
            scaler.step(optimizer)  # skipped when a gradient is inf/NaN; then update() halves the scale
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        log.append((loss.item(), lr, scale))
    return log


# ---- one leg, in its own process --------------------------------------------------------------------------

def _digest(model) -> str:
    """A hash of every parameter's bytes: equal hashes after an update mean bit-identical weights."""
    h = hashlib.sha1()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _tap(seen: list, x, y):
    seen.append(hashlib.sha1(x.cpu().numpy().tobytes()).hexdigest()[:12])
    return x, y


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # CPU and every GPU
    if st.np is not None:
        st.np.random.seed(seed)


def _leg(rank, plan: dict) -> dict:
    """One run in this (fresh) process: build everything as a training script does, load a checkpoint when
    ``plan["load"]`` says so, train up to ``plan["stop"]``, save when ``plan["save"]`` says so."""
    # a GradScaler that skips the first optimizer.step() of a process (inf gradients) makes the scheduler warn
    # that it stepped first; the schedule is still followed exactly (the skip is the scaler's, by design)
    warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()` before"))
    t0 = time.perf_counter()
    dev = st.device_for("cuda" if torch.cuda.is_available() else "cpu")
    _seed_everything(plan["seed"])
    model = GPT(PRESETS[plan["model"]], dropout=plan["dropout"]).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=plan["lr"], weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(plan["warmup"], plan["updates"]))
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": None}[plan["precision"]]
    scaler = (torch.amp.GradScaler(dev.type, init_scale=plan["init_scale"], growth_interval=plan["growth_interval"])
              if plan["precision"] == "fp16" else None)
    ds = st.dataset(PRESETS[plan["model"]].seq_len)
    sampler = st.CountingSampler(plan["samples"], seed=plan["seed"])  # counts what it handed out too
    loader = st.make_loader(ds, sampler, plan["micro_batch"], plan["workers"], plan["seed"])
    step = st.load_checkpoint(plan["load"], model, optimizer, scheduler, scaler, sampler) if plan["load"] else 0
    seen = []  # plumbing: a fingerprint of each batch, to tell which data an update trained on
    data = (_tap(seen, x.to(dev), y.to(dev)) for x, y in st.batches(loader, sampler))
    t1 = time.perf_counter()
    log, digests, after = [], [], []
    for _ in range(plan["stop"] - step):  # one update at a time, to hash the weights after each
        log += train_updates(model, optimizer, scheduler, scaler, data, 1, dtype)
        digests.append(_digest(model))
        after.append(scaler.get_scale() if scaler else 1.0)
    t2 = time.perf_counter()
    out = {"start": step, "losses": [r[0] for r in log], "lrs": [r[1] for r in log],
           "scales": [r[2] for r in log], "skipped": [a < r[2] for a, r in zip(after, log)], "batches": seen,
           "digests": digests, "setup_s": t1 - t0, "train_s": t2 - t1,
           "position": {**sampler.state_dict(), "yielded": getattr(sampler, "yielded", None)},
           "device": dev.type}
    if plan["save"]:
        ts = time.perf_counter()
        st.save_checkpoint(plan["save"], model, optimizer, scheduler, scaler, sampler, step + len(log))
        out["save_s"] = time.perf_counter() - ts
        out["checkpoint_bytes"] = os.path.getsize(plan["save"])
        for item in plan["drops"]:  # plumbing: the same checkpoint with one item not stored
            st.drop_item(plan["save"], item, _dropped_path(plan["save"], item))
    buf = io.BytesIO()  # as bytes: a tensor sent through the queue would be shared memory the rank takes away
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, buf)
    out["params"] = buf.getvalue()
    del data, loader  # the loader's workers end here, before the process reports
    return out


def _dropped_path(path: str, item: str) -> str:
    return f"{path[:-3]}-without-{item}.pt"


# ---- the demo ----------------------------------------------------------------------------------------------

@dataclass
class Leg:
    """One process's run: updates ``start``+1 .. ``start``+len(losses), what each saw, and the time it took."""

    name: str
    start: int
    losses: list
    lrs: list             # the lr each update used
    scales: list          # the loss scale each update used (1.0: no GradScaler)
    skipped: list         # True where the GradScaler skipped the update (inf/NaN gradients)
    batches: list         # a fingerprint of each update's batch (equal: the same samples)
    digests: list         # a hash of every weight after each update (equal: bit-identical weights)
    seconds: float        # the whole process, start to report (parent's clock)
    train_s: float        # the updates only (the leg's clock)


@dataclass
class Ablation:
    """The resume with ``item`` left out of the checkpoint, against the straight run."""

    item: str
    losses: list                 # the resumed updates' losses (updates resume_at+1 .. updates)
    lrs: list
    scales: list
    skipped: list
    batches: list
    first_loss_diff: object      # the first update (1-based) whose loss differs from the straight run's; None
    first_param_diff: object     # the first update after which the weights differ; None: never
    max_param_diff: float        # max |delta| over every parameter at the end
    seconds: float


@dataclass
class ResumeResult:
    """Straight against resumed, bit for bit, and the ablation (see ``resume_demo``)."""

    model: str
    micro_batch: int
    updates: int
    resume_at: int
    precision: str               # what ran: fp16 (with a GradScaler), bf16 or fp32
    precision_why: str           # _precision's key: asked, gpu (fp16 + GradScaler) or cpu (the same, emulated)
    workers: int
    dropout: float
    samples: int                 # samples per epoch (the sampler's n); batches_per_epoch of micro_batch each
    batches_per_epoch: int
    device: str
    straight: Leg
    first_half: Leg
    resumed: Leg
    losses_equal: bool           # every resumed loss == the straight run's (float equality)
    params_equal: bool           # torch.equal on every tensor of the final state_dict
    tensors: int
    tensors_equal: int
    max_param_diff: float
    saved_position: dict         # the loader's state at the save, and how many indices the sampler had handed out
    checkpoint_bytes: int
    save_s: float
    ablation: dict = field(default_factory=dict)  # {item: Ablation}, in ITEMS order
    seconds: dict = field(default_factory=dict)   # {"total": ..., leg name: ...}
    load: dict = field(default_factory=dict)      # LoadMeter's reading over the whole demo
    straight_params: dict = field(default_factory=dict, repr=False)
    resumed_params: dict = field(default_factory=dict, repr=False)


def _check(model, micro_batch, updates, workers, precision, dropout, lr, growth_interval, seed, ablate, timeout_s):
    _choice("model", model, tuple(PRESETS))
    _int("micro_batch", micro_batch, 1, 64)
    _int("updates", updates, 4, MAX_UPDATES)
    if updates % 2:
        raise ConfigError("updates", updates, "an even number (the resume comes after updates / 2)")
    _int("workers", workers, 0, 4)
    _choice("precision", precision, PRECISIONS)
    _num("dropout", dropout, 0.0, 0.9, lo_open=True)
    _num("lr", lr, 0.0, 1.0, lo_open=True)
    if growth_interval is not None:
        _int("growth_interval", growth_interval, 1)
    _int("seed", seed, 0)
    if not isinstance(ablate, (bool, tuple, list)) or (not isinstance(ablate, bool)
                                                      and any(a not in ABLATED for a in ablate)):
        raise ConfigError("ablate", ablate, "True, False, or a tuple of items from " + ", ".join(ABLATED))
    _num("timeout_s", timeout_s, 0.0, 3600.0, lo_open=True)


def _precision(precision: str):
    """(what runs, why): fp16 with a GradScaler wherever fp16 autocast runs (CPU and CUDA in this torch); ``why``
    'asked' (the precision given), 'gpu' (fp16 autocast with a GradScaler on the GPU) or 'cpu' (fp16 autocast
    with ``torch.amp.GradScaler('cpu')``: slower than fp32 on a CPU without fp16 matrix units, kept because it
    makes the scaler an item the checkpoint must hold)."""
    if precision != "auto":
        return precision, "asked"
    return "fp16", "gpu" if torch.cuda.is_available() else "cpu"


def _run_leg(plan, name, timeout_s) -> tuple:
    t0 = time.perf_counter()
    with spawn_ranks(_leg, 1, (plan,), kind="cuda" if torch.cuda.is_available() else "cpu",
                     prefix="labkit-ch11-rank-") as ranks:
        out = ranks.collect(timeout_s, f"chapter 11's {name} run")[0]
    out["params"] = torch.load(io.BytesIO(out["params"]), map_location="cpu", weights_only=True)
    return out, time.perf_counter() - t0


def _as_leg(name, out, seconds) -> Leg:
    return Leg(name, out["start"], out["losses"], out["lrs"], out["scales"], out["skipped"], out["batches"],
               out["digests"], seconds, out["train_s"])


def _first_diff(a: list, b: list, offset: int):
    """The first 1-based update (``offset`` + i + 1) where the lists differ; None when they never do."""
    return next((offset + i + 1 for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def _max_diff(p: dict, q: dict) -> float:
    return max(float((p[k].double() - q[k].double()).abs().max()) for k in p)


def resume_demo(model: str = "tiny", micro_batch: int = 4, updates: int = 8, *, workers: int = 1,
                precision: str = "auto", dropout: float = 0.1, lr: float = 3e-3, growth_interval=None,
                seed: int = 0, ablate=True, timeout_s: float = 120.0) -> ResumeResult:
    """N = ``updates`` straight in one fresh process; N/2 + save in another; load + N/2 in a third, which never
    saw the first half. ``ablate``: also resume once per item of ``ABLATED`` (True), for some (a tuple), or
    not (False), each from the checkpoint with that item not stored. Every file lives in a temporary folder
    removed at the end; every process is gone when this returns."""
    _check(model, micro_batch, updates, workers, precision, dropout, lr, growth_interval, seed, ablate, timeout_s)
    items = ABLATED if ablate is True else tuple(ablate or ())
    # short on purpose: the scale grows a few times before the resume, so a fresh scaler's differs from the saved
    growth_interval = growth_interval or max(1, updates // 4)
    ran, why = _precision(precision)
    if ran != "fp16":  # no GradScaler, so the scaler is not an item here
        items = tuple(i for i in items if i != "scaler")
    half = updates // 2
    per_epoch = half + max(1, updates // 4)  # the epoch ends after the resume: the position crosses it
    samples = micro_batch * per_epoch + 1  # + 1: drop_last leaves one sample out of every epoch
    # builds the corpus cache (once) before any process starts, and checks it holds enough windows
    st.check_n(samples, len(st.dataset(PRESETS[model].seq_len)))
    meter, t0 = LoadMeter(), time.perf_counter()
    seconds = {}
    with tempfile.TemporaryDirectory(prefix="labkit-ch11-") as tmp:
        ckpt = os.path.join(tmp, "latest.pt")
        base = dict(model=model, micro_batch=micro_batch, updates=updates, workers=workers, precision=ran,
                    dropout=dropout, lr=lr, warmup=max(1, updates // 4), init_scale=2.0 ** 16,
                    growth_interval=growth_interval, seed=seed, samples=samples, load=None, save=None, drops=(),
                    stop=updates)
        straight, seconds["straight"] = _run_leg(base, "straight", timeout_s)
        first, seconds["first_half"] = _run_leg({**base, "stop": half, "save": ckpt, "drops": items},
                                                "first-half", timeout_s)
        resumed, seconds["resumed"] = _run_leg({**base, "load": ckpt}, "resumed", timeout_s)
        rows = {}
        for item in items:
            out, s = _run_leg({**base, "load": _dropped_path(ckpt, item)}, f"resumed-without-{item}", timeout_s)
            seconds[f"without_{item}"] = s
            tail = straight["losses"][half:]
            rows[item] = Ablation(item, out["losses"], out["lrs"], out["scales"], out["skipped"], out["batches"],
                                  _first_diff(tail, out["losses"], half),
                                  _first_diff(straight["digests"][half:], out["digests"], half),
                                  _max_diff(straight["params"], out["params"]), s)
    seconds["total"] = time.perf_counter() - t0
    sp, rp = straight["params"], resumed["params"]
    equal = [torch.equal(sp[k], rp[k]) for k in sp]
    return ResumeResult(
        model=model, micro_batch=micro_batch, updates=updates, resume_at=half, precision=ran, precision_why=why,
        workers=workers, dropout=dropout, samples=samples, batches_per_epoch=per_epoch, device=straight["device"],
        straight=_as_leg("straight", straight, seconds["straight"]),
        first_half=_as_leg("first half", first, seconds["first_half"]),
        resumed=_as_leg("resumed", resumed, seconds["resumed"]),
        losses_equal=straight["losses"][half:] == resumed["losses"] and straight["losses"][:half] == first["losses"],
        params_equal=all(equal) and sp.keys() == rp.keys(), tensors=len(equal), tensors_equal=sum(equal),
        max_param_diff=_max_diff(sp, rp), saved_position=first["position"],
        checkpoint_bytes=first["checkpoint_bytes"], save_s=first["save_s"],
        ablation=rows, seconds=seconds, load=meter.read(), straight_params=sp, resumed_params=rp)


# ---- what the chapter draws from a result: rows, figures, a chart (the words are the chapter's) -------------

WINDOW = 12  # the loss table shows every update up to this many, else the ones around the resume


def needed_items(r: ResumeResult) -> set:
    """The items this run's checkpoint needed: the model, and every item whose absence changed the run."""
    return {"model"} | {item for item, a in r.ablation.items() if a.first_param_diff is not None}


def resume_rows(r: ResumeResult) -> list:
    """Loss per update, straight against saved-then-resumed (every update up to ``WINDOW``, else the ones
    around the resume and the last): ``leg`` is "first half" or "resumed", ``first`` marks the first update
    after the resume, ``equal`` compares the two losses as floats."""
    h = r.resume_at
    shown = (range(1, r.updates + 1) if r.updates <= WINDOW else
             sorted(set(range(max(1, h - 2), min(r.updates, h + 4) + 1)) | {r.updates}))
    rows = []
    for u in shown:
        a = r.straight.losses[u - 1]
        b = r.first_half.losses[u - 1] if u <= h else r.resumed.losses[u - h - 1]
        rows.append(dict(update=u, straight=a, resumed=b, leg="first half" if u <= h else "resumed",
                         first=u == h + 1, equal=a == b))
    return rows


def leg_rows(r: ResumeResult) -> list:
    """Each process of the exact resume: the updates it ran, their seconds, the whole process's seconds."""
    h = r.resume_at
    return [dict(leg="straight", updates=(1, r.updates), train_s=r.straight.train_s, process_s=r.straight.seconds),
            dict(leg="first half + save", updates=(1, h), train_s=r.first_half.train_s,
                 process_s=r.first_half.seconds),
            dict(leg="load + resumed", updates=(h + 1, r.updates), train_s=r.resumed.train_s,
                 process_s=r.resumed.seconds)]


def position(r: ResumeResult) -> dict:
    """The loader's position at the save: samples the loop consumed, indices the sampler had handed out
    (None without workers), and how many samples and batches the workers had prefetched beyond the loop."""
    pos = r.saved_position
    yielded = pos.get("yielded") if r.workers else None
    ahead = (yielded - pos["consumed"]) if yielded is not None else 0
    return dict(consumed=pos["consumed"], epoch=pos["epoch"], yielded=yielded, ahead=ahead,
                ahead_batches=ahead // r.micro_batch, workers=r.workers, batches_per_epoch=r.batches_per_epoch,
                samples=r.samples, checkpoint_kib=r.checkpoint_bytes / 1024, save_ms=r.save_s * 1000)


def ablation_rows(r: ResumeResult) -> list:
    """One row per item left out of the checkpoint, then the whole checkpoint (``item`` None): the straight
    update whose batch the first resumed update trained on, the first update whose lr differs, the loss scale
    the first resumed update used, the updates its GradScaler skipped, where the weights and the loss first
    differ (None: never) and the largest parameter difference at the end."""
    h, s = r.resume_at, r.straight

    def row(item, leg_batches, lrs, scales, skipped, weights, loss, diff):
        replay = s.batches.index(leg_batches[0]) + 1 if leg_batches and leg_batches[0] in s.batches else None
        lr_at = next((h + 1 + i for i, (x, y) in enumerate(zip(s.lrs[h:], lrs)) if x != y), None)
        skips = [h + 1 + i for i, v in enumerate(skipped) if v]
        return dict(item=item, batch_of=replay, lr_differs=lr_at, scale=scales[0] if scales else None,
                    skipped=", ".join(map(str, skips)) or None, weights=weights, loss=loss, max_diff=diff)

    rows = [row(i, a.batches, a.lrs, a.scales, a.skipped, a.first_param_diff, a.first_loss_diff, a.max_param_diff)
            for i, a in r.ablation.items()]
    full = r.resumed
    rows.append(row(None, full.batches, full.lrs, full.scales, full.skipped,
                    None if r.params_equal else h + 1, None if r.losses_equal else h + 1, r.max_param_diff))
    return rows


def ablation_chart(r: ResumeResult, ax=None):
    """|loss(resumed without the item) - loss(straight)| per update after the resume, one line per item."""
    import matplotlib.pyplot as plt  # deferred: a chart only, and matplotlib is slow to import

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 2.8))
    h = r.resume_at
    xs = list(range(h + 1, r.updates + 1))
    tail = r.straight.losses[h:]
    floor = 1e-8  # a log axis has no 0: an equal loss is drawn on this line
    for item, a in r.ablation.items():
        d = [abs(x - y) for x, y in zip(a.losses, tail)]
        ax.plot(xs, [v if v > 0 else floor for v in d], marker="o", label=f"without {item}")
    full = [abs(x - y) for x, y in zip(r.resumed.losses, tail)]
    ax.plot(xs, [v if v > 0 else floor for v in full], "k--", marker="x", label="whole checkpoint")
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, None)
    ax.axhline(floor, color="0.7", lw=0.8)
    ax.text(xs[0], floor * 1.3, "equal (0)", fontsize=7, color="0.4")
    ax.set_xticks(xs)
    ax.set_xlabel(f"update (resumed after update {h})")
    ax.set_ylabel("|loss difference|")
    ax.set_title("Resumed with one item missing: where the run leaves the straight one")
    ax.legend(frameon=False, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ax
