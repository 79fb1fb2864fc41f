"""Chapter 06's room: DDP measured on this machine's processes, and the cost model of its communication on
many GPUs -- a *model*, not a measurement.

DDP broadcasts module *buffers* (BatchNorm's running statistics) from rank 0 before a forward whose previous
forward synchronised gradients, so ``no_sync`` changes how often it happens; the switch is
``forward_sync_buffers`` from torch 2.13 on, ``broadcast_buffers`` before (``sync_flag`` asks the torch in
use). ``buffer_sync_counts`` counts the broadcasts on two gloo processes two independent ways: a wrapper
around ``torch.distributed._broadcast_coalesced`` (what DDP calls), and a marker buffer each rank writes
before every forward -- when rank 1 sees rank 0's number, a broadcast happened. The ranks meet through a
FileStore in a private folder on the loopback interface (``engine.launch``); nothing outlives the call.
Rows and verdict names only: the chapter words them.
"""
from __future__ import annotations

import contextlib
import gc
import inspect
import math
import shlex
import time
import traceback

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from ..base import runtime
from ..base.runtime import ConfigError
from ..engine import ddp as ddp_mod
from ..engine import launch
from ..engine.config import PRESETS, Config, _choice, _int, _num, cli_args
from ..engine.model import GPT
from ..tools import reference
from ..whatif.roofline import LINKS, amount, count, crossover, flops_compute_s, sweep
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
    """Count DDP's buffer broadcasts per update under each of ``MODES`` on ``world_size`` gloo processes.
    Per mode: ``broadcasts`` (calls counted in rank 0; None if this torch has none to count), ``seen``
    (forwards in which rank 1 saw rank 0's marker), ``per_update``, ``synced_micro_steps`` ([update,
    micro-step] pairs) and ``at_wrap`` (DDP's one-off broadcast when it wraps the model, not counted)."""
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

def _summary(name: str, value, keys) -> dict:
    if not isinstance(value, dict) or not set(keys) <= set(value):
        raise ConfigError(name, type(value).__name__, f"a run's summary with {', '.join(sorted(keys))}")
    return value


def _sweep_ks(sweep: dict) -> list:
    if not isinstance(sweep, dict) or not sweep or not all(isinstance(k, tuple) and len(k) == 2 for k in sweep):
        raise ConfigError("sweep", type(sweep).__name__, "a dict {(ddp_sync, K): run summary}")
    return sorted({k for _, k in sweep})


def sweep_rows(sweep: dict) -> list:
    """One row per K of a ``{(ddp_sync, K): summary}`` sweep: each loop's AllReduce calls, MiB and bytes over
    the gradient bytes per update."""
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
    per update); None where none are shipped, so a cell that ends with it shows nothing."""
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
    """A comparison's exact counts, one row per arm: AllReduce calls and MiB per update, and its first run's
    final loss."""
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
    """``buffer_sync_counts``' result, one row per mode: its ``pattern``, the broadcasts rank 1 saw (all, per
    update) and the calls counted in rank 0."""
    _buffer_result(bs)
    return [{"mode": mode, "pattern": pattern(bs, mode), "seen": m["seen"], "per_update": m["per_update"],
             "broadcasts": m["broadcasts"]} for mode, m in bs["modes"].items()]


def buffer_rhythm(bs: dict) -> str:
    """'counts_disagree' when DDP's broadcast calls and what rank 1 saw differ (trust the marker),
    'gradient_rhythm' when ``no_sync`` broadcast once per update and ``every_micro`` K times, else
    'other_rhythm'."""
    _buffer_result(bs)
    modes, k = bs["modes"], bs["accum"]
    if any(m["broadcasts"] is not None and m["broadcasts"] != m["seen"] for m in modes.values()):
        return "counts_disagree"
    if modes["no_sync"]["per_update"] == 1 and modes["every_micro"]["per_update"] == k:
        return "gradient_rhythm"
    return "other_rhythm"


def torchrun_command(config, nproc_per_node: int = 8, nnodes: int = 1, endpoint: str = "HOST:29400") -> str:
    """The exact command that runs ``config`` on real GPUs with torchrun (same code, NCCL instead of gloo):
    every field that differs from its default, as the CLI's own flags, each token shell-quoted (an
    endpoint such as ``h;touch x`` stays one argument). World size comes from torchrun (nnodes ×
    nproc_per_node), so ``--world-size`` is left out."""
    if not isinstance(config, Config):
        raise ConfigError("config", config, "a labkit.Config")
    config.validate()
    count("nproc_per_node", nproc_per_node)
    count("nnodes", nnodes)
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise ConfigError("endpoint", endpoint, "HOST:PORT of the rendezvous node, e.g. node0:29400")
    nodes = [f"--nnodes={nnodes}"] if nnodes > 1 else []
    rdzv = ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}"] if nnodes > 1 else []
    words = (["torchrun", *nodes, f"--nproc_per_node={nproc_per_node}", *rdzv, "-m", "labkit", "run"]
             + cli_args(config, leave_out=("world_size",)))
    return " ".join(shlex.quote(w) for w in words)


def micro_batch_compute(flops_micro: float, sequences: int = 8) -> tuple:
    """(seconds, basis) of one micro-batch of ``sequences`` sequences: the shipped GPU reference (bf16, scaled)
    when there is one (``verdict`` 'reference', its ``label``), else an ASSUMED H100/H200 bf16 peak at 40 % MFU
    ('assumed', ``peak_tflops``, ``mfu_pct``)."""
    amount("flops_micro", flops_micro, positive=True)
    count("sequences", sequences)
    ref = [p for p in reference.points(section="precision")
           if p.get("id") == "precision/bf16" and p.get("status") == "ok"]
    if ref:
        rs = ref[0]["summary"]
        return (rs["step_time_s"] / rs["accum"] * sequences / rs["micro_batch"],
                {"verdict": "reference", "label": reference.label(ref[0]), "sequences": sequences})
    peak, mfu = 989e12, 0.4
    return (flops_compute_s(flops_micro, peak_flops=peak, mfu=mfu),
            {"verdict": "assumed", "peak_tflops": round(peak / 1e12), "mfu_pct": round(100 * mfu),
             "sequences": sequences})


def model_rows(compute_micro_s: float, grad_bytes: float, n_buckets: int, ns=(8, 64, 512), accums=(1, 4, 16)) -> tuple:
    """(table, sweep rows): per link and K, the share of an update in exposed AllReduce at each GPU count (key
    n) and ``crossover`` (None: not up to a million); the sweep rows are for ``plot_model``."""
    rows = sweep(compute_micro_s, grad_bytes, ns=ns, accums=accums, n_buckets=n_buckets)
    table = []
    for link in LINKS.values():
        for k in accums:
            row = {"link": link.name, "K": k}
            row.update({r["n"]: r["comm_frac"] for r in rows if r["link"] == link.name and r["accum"] == k})
            row["crossover"] = crossover(compute_micro_s, grad_bytes, link, accum=k, n_buckets=n_buckets)
            table.append(row)
    return table, rows


# ---- measured on this machine (imports torch) ----------------------------------------------------

def bucket_timeline(config, updates: int = 2) -> dict:
    """When each DDP gradient bucket became ready during backward: ``updates`` micro-batches of ``config``'s
    model under DDP in a gloo group of one, a hook noting when each bucket is handed to AllReduce. Returns the
    last update's buckets [{"index", "bytes", "t_s"}], ``backward_s``, the first update's bucket count, and
    ``first_ready``/``last_ready`` as shares of backward (what fires early can overlap on many GPUs)."""
    if not isinstance(config, Config):
        raise ConfigError("config", config, "a labkit.Config")
    config.validate()
    _int("updates", updates, 1, 1000)
    created = False
    net = model = None
    with runtime.one_run("another run is going in this kernel: wait for it first"):
        try:
            created = ddp_mod.init_group("cpu", 0, 1)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config.seed)
                model = GPT(config.spec)
            net = DDP(model, bucket_cap_mb=config.bucket_cap_mb)
            return _time_buckets(net, model, config, updates)
        except BaseException as e:
            traceback.clear_frames(e.__traceback__)  # their ``net`` too goes before the group (train_worker: why)
            raise
        finally:
            with runtime.cleaning_up():
                net = model = None  # DDP's reducer holds the group: free it before the group goes
                gc.collect()
                if created:
                    ddp_mod.destroy_group()


def _time_buckets(net, model, config, updates: int) -> dict:
    """Train ``updates`` micro-batches through ``net``, noting when each bucket reaches its AllReduce."""
    state = {"events": [], "t0": 0.0}

    def hook(st, bucket):
        buf = bucket.buffer()
        st["events"].append({"index": bucket.index(), "bytes": buf.numel() * buf.element_size(),
                             "t_s": time.perf_counter() - st["t0"]})
        return default_hooks.allreduce_hook(None, bucket)

    net.register_comm_hook(state, hook)
    g = torch.Generator().manual_seed(config.seed)
    rounds, backward = [], []
    for _ in range(updates):
        idx = torch.randint(0, 256, (config.micro_batch, config.context), generator=g)
        loss = net(idx, idx)
        state["events"] = []
        state["t0"] = time.perf_counter()
        loss.backward()
        backward.append(time.perf_counter() - state["t0"])
        rounds.append(list(state["events"]))
        model.zero_grad(set_to_none=True)
    last, bw = rounds[-1], backward[-1]
    return {"buckets": last, "backward_s": bw, "first_update_buckets": len(rounds[0]),
            "bucket_cap_mb": config.bucket_cap_mb, "n_buckets": len(last),
            "first_ready": last[0]["t_s"] / bw if last and bw else None,
            "last_ready": last[-1]["t_s"] / bw if last and bw else None}


# ---- pictures ----------------------------------------------------------------------------------

def _figure_size(width, height) -> None:
    _num("width", width, 1.0, 40.0)
    _num("height", height, 0.5, 40.0)


def plot_data_parallel(n: int = 3, width: float = 8.0, height: float = 2.8):
    """Data parallelism in one picture: N replicas, N slices of the batch, one AllReduce, the same update."""
    _int("n", n, 1, 8)  # boxes for more replicas would not fit the figure
    _figure_size(width, height)
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # deferred: matplotlib is optional

    from ..tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xlim(-0.2, 10.1)
    ax.set_ylim(-0.4, n + 0.2)
    ax.axis("off")

    def box(x, y, w, text, color):
        ax.add_patch(FancyBboxPatch((x, y), w, 0.6, boxstyle="round,pad=0.02", fc=color, ec="#333333", lw=0.8))
        ax.text(x + w / 2, y + 0.3, text, ha="center", va="center", fontsize=7)

    def arrow(x0, y0, x1, y1):
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="->", mutation_scale=8, lw=0.8,
                                     color="#333333"))

    for i in range(n):
        y = n - 1 - i
        box(0.0, y, 1.6, f"batch slice {i}", "#f3e1c1")
        box(2.0, y, 2.3, f"GPU {i}: same weights\nforward + backward", "#c9d6ea")
        box(4.7, y, 1.4, f"gradients {i}", "#f2c9c9")
        box(7.9, y, 2.0, "optimizer step\n(identical update)", "#cfe5d3")
        arrow(1.6, y + 0.3, 2.0, y + 0.3)
        arrow(4.3, y + 0.3, 4.7, y + 0.3)
        arrow(6.1, y + 0.3, 6.5, (n - 1) / 2 + 0.3)
        arrow(7.5, (n - 1) / 2 + 0.3, 7.9, y + 0.3)
    ax.add_patch(FancyBboxPatch((6.5, (n - 1) / 2 - 0.1), 1.0, 0.8, boxstyle="round,pad=0.02", fc="#e6d5f0",
                                ec="#333333", lw=0.8))
    ax.text(7.0, (n - 1) / 2 + 0.3, "AllReduce\n(average)", ha="center", va="center", fontsize=7)
    ax.text(5.0, -0.3, "every GPU holds the whole model; only the gradients travel", ha="center", fontsize=7,
            color="#555555")
    return fig


def plot_model(rows: list, width: float = 8.0, height: float = 2.8):
    """Exposed communication share of an update against GPU count, one line per link and accumulation."""
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and {"n", "link", "accum", "comm_frac"}
                                                         <= set(r) for r in rows):
        raise ConfigError("rows", rows if not isinstance(rows, list) else f"{len(rows)} rows",
                          "the rows of sweep (or update_time): dicts with n, link, accum, comm_frac")
    _figure_size(width, height)
    from ..tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height)
    ax = fig.add_subplot(1, 1, 1)
    styles = {LINKS["nvlink"].name: "#4c72b0", LINKS["infiniband"].name: "#55a868", LINKS["ethernet"].name: "#c44e52"}
    seen = {}
    for r in rows:
        seen.setdefault((r["link"], r["accum"]), []).append(r)
    dashes = ["-", "--", ":", "-."]
    accums = sorted({k for _, k in seen})
    for (link, k), rs in seen.items():
        rs = sorted(rs, key=lambda r: r["n"])
        ax.plot([r["n"] for r in rs], [100 * r["comm_frac"] for r in rs], dashes[accums.index(k) % 4], marker="o",
                ms=3, color=styles.get(link, "#333333"), label=f"{link}, K={k}")
    ns = sorted({r["n"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off()
    # named in the legend: a label on the plot overlapped whichever line passed near 50 % (#46 pass)
    ax.axhline(50, color="#999999", lw=0.8, label="communication = compute")
    ax.set_xlabel("GPUs (log scale)", fontsize=8)
    ax.set_ylabel("update time spent in AllReduce (%)", fontsize=8)
    ax.set_ylim(0, 100)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("MODEL (not measured): ring AllReduce, no overlap", fontsize=9)
    return fig


def plot_bucket_timeline(tl: dict, width: float = 7.0, height: float = 2.0):
    """Each bucket as a tick on the backward pass's time axis, sized by its bytes."""
    if not isinstance(tl, dict) or not tl.get("buckets") or "backward_s" not in tl:
        raise ConfigError("tl", type(tl).__name__, "the dict bucket_timeline returns (with its buckets)")
    _figure_size(width, height)
    from ..tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height)
    ax = fig.add_subplot(1, 1, 1)
    bw = 1000 * tl["backward_s"]
    ax.barh([0], [bw], color="#c9d6ea", height=0.5, label="backward pass")
    for b in tl["buckets"]:
        ax.plot([1000 * b["t_s"]], [0], "v", color="#c44e52", ms=4 + 8 * math.sqrt(b["bytes"] / max(
            x["bytes"] for x in tl["buckets"])))
    ax.set_yticks([])
    ax.set_xlabel("ms since backward started (▼ = a bucket handed to AllReduce, size ∝ bytes)", fontsize=8)
    ax.set_xlim(0, bw * 1.1)
    ax.tick_params(labelsize=7)
    return fig
