"""A cost model for data-parallel training's communication -- a *model*, not a measurement.

Ring AllReduce of ``B`` bytes over ``N`` GPUs: a reduce-scatter then an all-gather, each ``N - 1`` steps in
which every GPU sends (and receives) ``B / N`` bytes to its ring neighbour. Per GPU that is
``2·(N-1)/N · B`` bytes each way, so with per-direction link bandwidth ``β`` and per-step latency ``α``:

    t_ring = 2·(N-1)/N · B / β  +  2·(N-1) · α

The bandwidth term hardly grows with N (it tends to 2·B/β); the latency term grows linearly. Real
libraries (NCCL) also use trees and hierarchical rings across nodes, so at large N they do better than
this flat ring: treat the numbers as an order-of-magnitude guide.

The functions up to ``torchrun_command`` are pure arithmetic; ``micro_batch_compute`` and ``model_rows``
put a micro-batch's compute time and the chapter's table to them. ``bucket_timeline`` at the end measures
something real (when DDP's buckets became ready during backward on this machine).
"""
from __future__ import annotations

import gc
import math
import shlex
import time
import traceback
from dataclasses import dataclass

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from ..engine import ddp as ddp_mod
from ..base import runtime
from ..engine.config import Config, _choice, _int, _num, cli_args
from ..base.errors import ConfigError
from ..engine.model import GPT
from ..tools import reference

__all__ = ["Link", "LINKS", "ring_allreduce_s", "ring_bytes_sent", "allreduce_calls", "update_time",
           "crossover", "sweep", "torchrun_command", "bucket_timeline", "plot_data_parallel", "plot_model",
           "plot_bucket_timeline", "flops_compute_s", "micro_batch_compute", "model_rows"]


@dataclass(frozen=True)
class Link:
    """One kind of interconnect: per-direction bandwidth per GPU (bytes/s) and per-step latency (s)."""

    name: str
    bandwidth: float   # bytes per second, one direction, per GPU
    latency: float     # seconds per ring step -- an ASSUMPTION, see LINKS
    note: str = ""


# Bandwidths (per direction, per GPU):
#  - NVLink 4 on H100/H200 SXM: 18 links x 25 GB/s = 450 GB/s each way (900 GB/s total), NVIDIA H100
#    datasheet / Hopper architecture whitepaper. Inside one 8-GPU node (NVSwitch) only.
#  - InfiniBand NDR: 400 Gb/s per port = 50 GB/s per direction (NVIDIA ConnectX-7 / Quantum-2 datasheets),
#    one port per GPU as in DGX H100.
#  - 25 Gb/s Ethernet: 25e9 / 8 = 3.125 GB/s per direction, before protocol overhead.
# Latencies are ASSUMPTIONS for illustration (order of magnitude of one hop incl. software): a few
# microseconds for NVLink, about 5 us for InfiniBand with RDMA, tens of microseconds for TCP over Ethernet.
LINKS = {
    "nvlink": Link("NVLink 4 (H100/H200 SXM)", 450e9, 3e-6, "inside one node of 8 GPUs only"),
    "infiniband": Link("InfiniBand NDR 400 Gb/s", 50e9, 5e-6, "one 400 Gb/s port per GPU"),
    "ethernet": Link("Ethernet 25 Gb/s", 25e9 / 8, 30e-6, "TCP, no RDMA"),
}


MAX_GPUS = 1 << 30  # far beyond any cluster: a bound that catches a typo, not a claim


def _count(name, n, lo=1):
    _int(name, n, lo, MAX_GPUS)


def _amount(name, v, *, positive=False):
    _num(name, v, 0.0, 1e30, lo_open=positive)  # finite and not negative (a NaN or -4 GPUs is a typo)


def ring_bytes_sent(nbytes: float, n: int) -> float:
    """Bytes each GPU sends (and receives) in a ring AllReduce of ``nbytes`` over ``n`` GPUs."""
    _amount("nbytes", nbytes)
    _count("n", n)
    if n == 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes


def ring_allreduce_s(nbytes: float, n: int, bandwidth: float, latency: float = 0.0) -> float:
    """Seconds for one ring AllReduce of ``nbytes``: 2·(N-1)/N · bytes / bandwidth + 2·(N-1) · latency.
    ``bandwidth`` in bytes per second per direction. One GPU: nothing to send, 0 s. ``n`` below 1 (say
    -4) is refused rather than priced at 0 s."""
    _amount("bandwidth", bandwidth, positive=True)
    _amount("latency", latency)
    sent = ring_bytes_sent(nbytes, n)
    return sent / bandwidth + 2 * (n - 1) * latency


def allreduce_calls(n_buckets: int, accum: int, ddp_sync: str = "no_sync") -> int:
    """AllReduce calls per optimizer update on each GPU: one per bucket per synchronisation. ``no_sync``
    synchronises once per update, ``every_micro`` after each of the K micro-batches. World size does
    not enter: every GPU launches the same calls."""
    _count("n_buckets", n_buckets)
    _count("accum", accum)
    _choice("ddp_sync", ddp_sync, ("no_sync", "every_micro"))
    return n_buckets * (accum if ddp_sync == "every_micro" else 1)


def update_time(compute_micro_s: float, grad_bytes: float, n: int, link: Link, *, accum: int = 1,
                n_buckets: int = 1, ddp_sync: str = "no_sync", overlap: float = 0.0) -> dict:
    """Model of one optimizer update on each of ``n`` GPUs.

    compute = K × one micro-batch's forward+backward; communication = the AllReduce calls of the update,
    each carrying ``grad_bytes / n_buckets``. ``overlap`` (0..1): the share of the synchronising
    micro-batch's backward (2/3 of its compute) that bucket AllReduces can hide behind; 0 = none hidden
    (a pessimistic bound). Returns compute_s, comm_s, exposed_comm_s, total_s, comm_frac, calls."""
    _amount("compute_micro_s", compute_micro_s)
    if not isinstance(link, Link):
        raise ConfigError("link", link, "a netmodel.Link, e.g. netmodel.LINKS['infiniband']")
    _num("overlap", overlap, 0.0, 1.0)
    calls = allreduce_calls(n_buckets, accum, ddp_sync)
    per_call = ring_allreduce_s(grad_bytes / n_buckets, n, link.bandwidth, link.latency)
    comm = calls * per_call
    compute = accum * compute_micro_s
    syncs = accum if ddp_sync == "every_micro" else 1
    hideable = overlap * (2 / 3) * compute_micro_s * syncs
    exposed = max(0.0, comm - hideable)
    total = compute + exposed
    return {"n": n, "link": link.name, "accum": accum, "calls": calls, "compute_s": compute, "comm_s": comm,
            "exposed_comm_s": exposed, "total_s": total, "comm_frac": exposed / total if total else 0.0}


def sweep(compute_micro_s: float, grad_bytes: float, ns=(8, 64, 512), links=None, accums=(1,), **kw) -> list:
    """``update_time`` for every GPU count x link x accumulation: rows for a table or a chart."""
    links = LINKS if links is None else links
    if not isinstance(links, dict) or not links:
        raise ConfigError("links", links, "a dict of name -> Link, like netmodel.LINKS")
    for name, values in (("ns", ns), ("accums", accums)):
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__") or not list(values):
            raise ConfigError(name, values, "a list of whole numbers, e.g. (8, 64, 512)")
    return [update_time(compute_micro_s, grad_bytes, n, link, accum=k, **kw)
            for key, link in links.items() for k in accums for n in ns]


def crossover(compute_micro_s: float, grad_bytes: float, link: Link, *, accum: int = 1, max_n: int = 1 << 20,
              **kw):
    """Smallest GPU count at which exposed communication takes at least as long as compute (None if it never
    does up to ``max_n``). Searches powers of two, then bisects."""
    _int("max_n", max_n, 2, MAX_GPUS)
    update_time(compute_micro_s, grad_bytes, 2, link, accum=accum, **kw)  # every argument checked once, up front

    def dominated(n):
        r = update_time(compute_micro_s, grad_bytes, n, link, accum=accum, **kw)
        return r["exposed_comm_s"] >= r["compute_s"]

    n = 2
    while n <= max_n and not dominated(n):
        n *= 2
    if n > max_n:
        return None
    lo, hi = n // 2, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if dominated(mid):
            hi = mid
        else:
            lo = mid
    return hi


def flops_compute_s(flops_per_micro: float, peak_flops: float, mfu: float) -> float:
    """Seconds of one micro-batch at a given MFU: an ASSUMED utilisation turns FLOPs into time."""
    _amount("flops_per_micro", flops_per_micro)
    _amount("peak_flops", peak_flops, positive=True)
    _num("mfu", mfu, 0.0, 1.0, lo_open=True)
    return flops_per_micro / (peak_flops * mfu)


def torchrun_command(config, nproc_per_node: int = 8, nnodes: int = 1, endpoint: str = "HOST:29400") -> str:
    """The exact command that runs ``config`` on real GPUs with torchrun (same code, NCCL instead of gloo):
    every field that differs from its default, as the CLI's own flags, each token shell-quoted (an
    endpoint such as ``h;touch x`` stays one argument). World size comes from torchrun (nnodes ×
    nproc_per_node), so ``--world-size`` is left out."""

    if not isinstance(config, Config):
        raise ConfigError("config", config, "a labkit.Config")
    config.validate()
    _count("nproc_per_node", nproc_per_node)
    _count("nnodes", nnodes)
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise ConfigError("endpoint", endpoint, "HOST:PORT of the rendezvous node, e.g. node0:29400")
    head = ["torchrun", f"--nproc_per_node={nproc_per_node}"]
    if nnodes > 1:
        head = ["torchrun", f"--nnodes={nnodes}", f"--nproc_per_node={nproc_per_node}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}"]
    words = head + ["-m", "labkit", "run"] + cli_args(config, leave_out=("world_size",))
    return " ".join(shlex.quote(w) for w in words)


def micro_batch_compute(flops_micro: float, sequences: int = 8) -> tuple:
    """(seconds, basis) of one micro-batch of ``sequences`` sequences: the shipped GPU reference (bf16, scaled to
    that many sequences) when there is one, else an ASSUMED H100/H200 bf16 peak at 40 % MFU. ``basis``: its
    ``verdict`` 'reference' (measured on the GPU its ``label`` names) or 'assumed' (``peak_tflops``, ``mfu_pct``),
    and ``sequences``."""
    _amount("flops_micro", flops_micro, positive=True)
    _count("sequences", sequences)
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
    """(rows, sweep rows): one row per link and K -- the link's name, K, the share of an update spent in exposed
    AllReduce at each GPU count (key ``n`` for each n in ``ns``) and ``crossover``, the GPU count from which
    communication takes as long as compute (None: not up to a million) -- and the rows of ``sweep`` behind it,
    for ``plot_model``."""
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
    """When did each DDP gradient bucket become ready, relative to the backward pass?

    Trains ``updates`` micro-batches of ``config``'s model under DDP at world size 1 (a real gloo group of one)
    with a hook that notes the time each bucket is handed to AllReduce. Returns the last update's
    buckets [{"index", "bytes", "t_s"}], backward_s, the first update's bucket count, and when the first and the
    last bucket were ready as shares of backward (``first_ready``, ``last_ready``). Buckets that fire before
    backward ends are the ones a multi-GPU run can overlap with the rest of backward."""
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
                          "the rows of netmodel.sweep (or update_time): dicts with n, link, accum, comm_frac")
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
