"""Chapter 05's instruments for the data loader: things ``labkit.run`` does not measure by itself.

* ``time_loop``      -- the training loop with a chosen number of PyTorch intra-op threads (the engine always
                        picks cores - workers; this shows what happens when nobody does)
* ``worker_memory``  -- CPU memory of each live DataLoader worker, read with psutil from the main process
* ``startup``        -- time to the first batch of each epoch, with and without ``persistent_workers``
* ``try_spawn``      -- start one worker under ``spawn`` for any dataset, and report what happened
* ``pinned_copy``    -- host-to-GPU copy speed from pageable and from pinned memory (CUDA only)

Worker processes import their dataset from a module; that is why everything a worker runs lives here (or
in ``labkit.data``), never in a notebook.
"""
from __future__ import annotations

import statistics
import time

import torch

__all__ = ["time_loop", "worker_memory", "startup", "try_spawn", "pinned_copy", "loader_for", "plot_sweep",
           "ideal_step_s", "fewest_workers", "NotebookStyleDataset"]


def loader_for(config, *, workers=None, persistent_workers=False, prefetch_factor=None, context=None,
               updates=None, timeout=0):
    """A DataLoader exactly like the engine's (same dataset, sampler and data cost), with the knobs the
    Config does not expose: ``persistent_workers``, ``multiprocessing_context`` and ``timeout``."""
    from .data import ByteWindows, StreamSampler, corpus_path, work_iters_for

    path = corpus_path(config.corpus)
    ds = ByteWindows(path, config.context, work_iters_for(config.data_cost_ms))
    sampler = StreamSampler(len(ds), config.seed, config.micro_batch, config.accum, config.world_size, 0,
                            updates or config.steps)
    w = config.workers if workers is None else workers
    kw = {}
    if w > 0:
        kw = dict(prefetch_factor=prefetch_factor or config.prefetch_factor, persistent_workers=persistent_workers,
                  multiprocessing_context=context, timeout=timeout)
    return torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=w, pin_memory=config.pin_memory, **kw)


def _shutdown(it):
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()


def time_loop(config, threads: int, updates: int | None = None, warmup: int = 1) -> dict:
    """Train ``config`` (world size 1, no DDP) with exactly ``threads`` intra-op threads in this process.

    Returns medians over the updates after ``warmup``: step_time_s, data_wait_s, data_wait_frac, and the
    per-update lists. The engine's own runs always limit threads to cores - workers; this loop lets a
    chapter show what happens without that limit. Thread count is restored afterwards."""
    from .device import capabilities, synchronize
    from .model import GPT
    from .train import make_optimizer, micro_steps, optimizer_step

    kind = capabilities(config.device).kind
    dev = torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)
    n = updates or config.steps
    old = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    it = None
    try:
        with torch.random.fork_rng(devices=[]):  # the engine's initial weights; the caller's RNG untouched
            torch.manual_seed(config.seed)
            model = GPT(config.spec, config.dropout, config.checkpointing, config.checkpoint_every)
        model = model.to(dev)
        opt = make_optimizer(config, model.parameters())
        it = iter(loader_for(config, updates=n))
        steps, waits = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            _, data_s = micro_steps(model, model, it, config.accum, None, kind, config.precision, dev)
            optimizer_step(model, opt, None, config.grad_clip)
            synchronize(dev)
            steps.append(time.perf_counter() - t0)
            waits.append(data_s)
    finally:
        _shutdown(it)
        torch.set_num_threads(old)
    timed_s, timed_w = steps[warmup:] or steps, waits[warmup:] or waits
    return {"threads": max(1, int(threads)), "workers": config.workers,
            "step_time_s": statistics.median(timed_s), "data_wait_s": statistics.median(timed_w),
            "data_wait_frac": sum(timed_w) / sum(timed_s), "step_times_s": steps, "data_waits_s": waits}


def worker_memory(config, workers: int | None = None, batches: int = 3, context: str | None = None) -> dict:
    """Memory of the main process and of each live loader worker, read with psutil while the loader runs.

    rss: resident pages (shared copy-on-write pages counted in every process that maps them);
    uss: pages only this process has (what it would give back if it ended) -- the honest per-worker cost;
    pss: shared pages split evenly between the processes sharing them (Linux only, else None).
    ``context``: the start method ("fork", "spawn", "forkserver"; None = the platform's default).
    Returns {"main": {...}, "workers": [{"pid", "rss", "uss"}...], "start_method": ...}."""
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    loader = loader_for(config, workers=workers, updates=max(batches + 2, 4), context=context)
    it = iter(loader)
    try:
        for _ in range(batches):
            next(it)  # the workers are alive and have done real work
        rows = []
        pids = {w.pid for w in getattr(it, "_workers", [])}  # the loader's own worker processes
        for p in me.children(recursive=True):
            try:
                if p.pid in before or (pids and p.pid not in pids) or "resource_tracker" in " ".join(p.cmdline()):
                    continue  # not a worker: e.g. multiprocessing's resource tracker
                info = p.memory_full_info()
                rows.append({"pid": p.pid, "rss": info.rss, "uss": info.uss, "pss": getattr(info, "pss", None)})
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        mi = me.memory_full_info()
        import multiprocessing as mp

        ctx = loader.multiprocessing_context
        return {"main": {"pid": me.pid, "rss": mi.rss, "uss": mi.uss, "pss": getattr(mi, "pss", None)},
                "workers": rows,
                "start_method": ctx.get_start_method() if ctx is not None else mp.get_start_method()}
    finally:
        _shutdown(it)


def startup(config, workers: int, persistent: bool, epochs: int = 2) -> list:
    """Seconds from ``iter(loader)`` to the first batch, for each of ``epochs`` passes over a short epoch.
    Without persistent workers every epoch starts its worker processes again."""
    loader = loader_for(config, workers=workers, persistent_workers=persistent and workers > 0, updates=2)
    out = []
    it = None
    try:
        for _ in range(epochs):
            t0 = time.perf_counter()
            it = iter(loader)
            next(it)
            out.append(time.perf_counter() - t0)
            for _ in it:  # finish the epoch
                pass
    finally:
        _shutdown(it)
        if persistent and getattr(loader, "_iterator", None) is not None:
            _shutdown(loader._iterator)
            loader._iterator = None
    return out


class NotebookStyleDataset(torch.utils.data.Dataset):
    """A stand-in used by tests: an importable dataset, the case that works under spawn."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor([i])


def try_spawn(dataset, timeout_s: float = 60.0) -> dict:
    """Fetch one batch of ``dataset`` from one worker started with ``spawn`` (a fresh Python that must
    import the dataset's class by module and name). Returns ok, seconds and the error in words."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=1, num_workers=1, multiprocessing_context="spawn",
                                         timeout=timeout_s)
    t0 = time.perf_counter()
    it = None
    try:
        it = iter(loader)
        next(it)
        return {"ok": True, "seconds": time.perf_counter() - t0, "error": None,
                "class": f"{type(dataset).__module__}.{type(dataset).__qualname__}"}
    except Exception as e:  # noqa: BLE001 -- the point is to show what went wrong
        return {"ok": False, "seconds": time.perf_counter() - t0, "error": f"{type(e).__name__}: {e}".strip(),
                "class": f"{type(dataset).__module__}.{type(dataset).__qualname__}"}
    finally:
        _shutdown(it)


def pinned_copy(mbytes: int = 256, repeats: int = 5) -> dict | None:
    """Host-to-GPU copy bandwidth (GB/s) from ordinary (pageable) and from pinned host memory.
    None without CUDA."""
    if not torch.cuda.is_available():
        return None
    n = mbytes * 2**20
    out = {}
    for pinned in (False, True):
        host = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        best = float("inf")
        for i in range(repeats + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dev.copy_(host, non_blocking=pinned)
            torch.cuda.synchronize()
            if i:
                best = min(best, time.perf_counter() - t0)
        out["pinned" if pinned else "pageable"] = n / best / 1e9
        del host, dev
    return out


# ---- the ideal-overlap model (the chapter's exercise has the learner write it) -------------------

def ideal_step_s(data_s: float, compute_s: float, workers: int) -> float:
    """Step time if ``workers`` processes prepare batches in parallel with the model and nothing else
    competes for cores: no workers -> data and compute add up; w workers -> the slower of the two."""
    if workers <= 0:
        return data_s + compute_s
    return max(compute_s, data_s / workers)


def fewest_workers(cost_ms_per_sample: float, micro_batch: int, compute_ms_per_batch: float, limit: float = 0.05,
                   max_workers: int = 1024):
    """The fewest workers that keep data wait under ``limit`` of the step under ``ideal_step_s``."""
    data = cost_ms_per_sample * micro_batch
    for w in range(0, max_workers + 1):
        step = ideal_step_s(data, compute_ms_per_batch, w)
        wait = data if w == 0 else max(0.0, data / w - compute_ms_per_batch)
        if step == 0 or wait / step < limit:
            return w
    return None


def plot_sweep(rows: list, model_rows: list | None = None, width: float = 7.5, height: float = 2.6):
    """Two panels from workers-sweep rows ({"workers", "step_time_s", "data_wait_frac"}): step time
    (with an optional ideal-model line) and the data-wait fraction with the 5% line."""
    from .plots import COLORS, new_figure

    fig = new_figure(width, height)
    a1, a2 = fig.subplots(1, 2)
    ws = [r["workers"] for r in rows]
    a1.plot(ws, [1000 * r["step_time_s"] for r in rows], "o-", color=COLORS["compute_s"], label="measured")
    if model_rows:
        a1.plot([r["workers"] for r in model_rows], [1000 * r["step_time_s"] for r in model_rows], "s--",
                color="#999999", label="ideal model")
    a1.set_xlabel("loader workers", fontsize=8)
    a1.set_ylabel("step time (ms)", fontsize=8)
    a1.set_ylim(bottom=0)
    a1.legend(fontsize=7)
    a2.bar(ws, [100 * r["data_wait_frac"] for r in rows], color=COLORS["data_wait_s"])
    a2.axhline(5, color="#222222", lw=1, ls="--")
    a2.text(max(ws), 5, " 5%", fontsize=7, va="bottom", ha="right")
    a2.set_xlabel("loader workers", fontsize=8)
    a2.set_ylabel("time waiting for data (%)", fontsize=8)
    for a in (a1, a2):
        a.set_xticks(ws)
        a.tick_params(labelsize=7)
    return fig
