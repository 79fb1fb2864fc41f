"""Chapter 05's room, the data loader: the loops the chapter times (interleaved loop comparisons, worker
start-up, worker memory, pinned copies), and what they come to as data -- the rows its tables draw
(``lk.course.table``) and the outcome names its sentences are chosen by (``lk.course.explain``). No words:
the sentences are in the chapter. Worker processes import their dataset from a module; that is why
everything a worker runs lives here (or in ``labkit.engine.data``), never in a notebook.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import statistics
import time

import torch

from ..tools import ranks, timing
from ..tools.timing import fewest_workers, ideal_step_s, wait_figures  # noqa: F401 -- shared with 09
from ..tools.timing import in_turn
from ..tools.compare import WORDS as VERDICT_WORDS, _rel_iqr, settles, verdict
from ..engine.config import Config, _bool, _choice, _int, _num  # the Config's own checks: one wording for every refusal
from ..base.runtime import ConfigError
from ..base import phrases
from ..engine.data import make_loader
from ..engine.device import capabilities, intra_op_threads, synchronize, torch_device
from ..engine.measure import LoadMeter, machine_load, median
from ..engine.model import GPT
from ..engine.step import make_optimizer, micro_steps, optimizer_step
from .course import UNDER_LOAD, outcome, reference_points

# the persistent-workers verdict names what it measured: notebooks/lab_messages.md, "## Chapter 05: loaders"
WORDS = phrases.load_section("lab_messages.md", "Chapter 05: loaders", {"first-batch": ()})


def loader_for(config, *, workers=None, persistent_workers=False, prefetch_factor=None, context=None,
               updates=None, timeout=0):
    """A DataLoader exactly like the engine's (same dataset, sampler and data cost), with the knobs the
    Config does not expose: ``persistent_workers``, ``multiprocessing_context`` and ``timeout``."""
    loader, _ = make_loader(config, workers=workers, updates=updates, persistent_workers=persistent_workers,
                            prefetch_factor=prefetch_factor, context=context, timeout=timeout)
    return loader


def _shutdown(it):
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()


def time_loop(config, threads: int, updates: int | None = None, warmup: int = 1) -> dict:
    """Train ``config`` (world size 1, no DDP) with exactly ``threads`` intra-op threads in this process.

    Returns medians over the updates after ``warmup``: step_time_s, data_wait_s, data_wait_frac, and the
    per-update lists. The engine's own runs always limit threads to cores - workers; this loop lets a
    chapter show what happens without that limit. Thread count is restored afterwards."""
    _config(config)
    _int("threads", threads, 1, 1024)
    if updates is not None:
        _int("updates", updates, 1, 100_000)
    _int("warmup", warmup, 0, 100_000)
    kind = capabilities(config.device).kind
    dev = torch_device(kind)
    n = updates or config.steps
    with intra_op_threads(threads):
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
    timed_s, timed_w = steps[warmup:] or steps, waits[warmup:] or waits
    return {"threads": threads, "workers": config.workers,
            "step_time_s": median(timed_s), "data_wait_s": median(timed_w),
            "data_wait_frac": sum(timed_w) / sum(timed_s), "step_times_s": steps, "data_waits_s": waits}


def worker_memory(config, workers: int | None = None, batches: int = 3, context: str | None = None) -> dict:
    """Memory (rss, uss, pss: the chapter says what each counts; pss is None off Linux) of the main process
    and of each live loader worker, read with psutil while the loader runs. ``context``: the start method
    (None: the platform's default). Returns {"main": {...}, "workers": [{...}, ...], "start_method": ...}."""
    _config(config)
    if workers is not None:
        _int("workers", workers, 0, 64)
    _int("batches", batches, 1, 1000)
    if context is not None:
        _choice("context", context, tuple(mp.get_all_start_methods()))
    import psutil  # deferred: psutil is optional (course extras)

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
        ctx = loader.multiprocessing_context
        return {"main": {"pid": me.pid, "rss": mi.rss, "uss": mi.uss, "pss": getattr(mi, "pss", None)},
                "workers": rows,
                "start_method": ctx.get_start_method() if ctx is not None else mp.get_start_method()}
    finally:
        _shutdown(it)


def startup(config, workers: int, persistent: bool, epochs: int = 2) -> list:
    """Seconds from ``iter(loader)`` to the first batch, for each of ``epochs`` passes over a short epoch.
    Without persistent workers every epoch starts its worker processes again."""
    _config(config)
    _int("workers", workers, 0, 64)
    _bool("persistent", persistent)
    _int("epochs", epochs, 1, 1000)
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


def try_spawn(dataset, timeout_s: float = 60.0) -> dict:
    """Fetch one batch of ``dataset`` from one worker started with ``spawn`` (a fresh Python that must
    import the dataset's class by module and name). Returns ok, seconds and the error in words."""
    if not isinstance(dataset, torch.utils.data.Dataset):
        raise ConfigError("dataset", type(dataset).__name__, "a torch.utils.data.Dataset")
    _num("timeout_s", timeout_s, 0.0, 3600.0, lo_open=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=1, num_workers=1, multiprocessing_context="spawn",
                                         timeout=timeout_s)
    cls = f"{type(dataset).__module__}.{type(dataset).__qualname__}"
    t0 = time.perf_counter()
    it = None
    try:
        it = iter(loader)
        next(it)
        return {"ok": True, "seconds": time.perf_counter() - t0, "error": None, "class": cls}
    except Exception as e:  # noqa: BLE001 -- the point is to show what went wrong
        return {"ok": False, "seconds": time.perf_counter() - t0, "error": f"{type(e).__name__}: {e}".strip(),
                "class": cls}
    finally:
        _shutdown(it)


def pinned_copy(mbytes: int = 256, repeats: int = 5) -> dict | None:
    """Host-to-GPU copy bandwidth (GB/s) from ordinary (pageable) and from pinned host memory.
    None without CUDA."""
    _int("mbytes", mbytes, 1, 16384)
    _int("repeats", repeats, 1, 1000)
    if not torch.cuda.is_available():
        return None
    n = mbytes * 2**20
    out = {}
    for pinned in (False, True):
        host = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        copy = {"copy": lambda d=dev, h=host, p=pinned: d.copy_(h, non_blocking=p)}
        # timed on the GPU: synchronised before and after, so a non-blocking copy counts until it has landed
        times = timing.interleaved(copy, max_rounds=repeats, warmup_rounds=1, timed_on=dev.device)["copy"]
        out["pinned" if pinned else "pageable"] = n / min(times) / 1e9  # the best copy: the bus, not the noise
        del host, dev
    return out


def plot_sweep(rows: list, model_rows: list | None = None, width: float = 7.5, height: float = 2.6):
    """Two panels from workers-sweep rows ({"workers", "step_time_s", "data_wait_frac"}): step time
    (with an optional ideal-model line) and the data-wait fraction with the 5% line."""
    if not isinstance(rows, (list, tuple)) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ConfigError("rows", rows if not isinstance(rows, (list, tuple)) else f"{len(rows)} rows",
                          "a non-empty list of row dicts")
    _num("width", width, 0.0, 100.0, lo_open=True)
    _num("height", height, 0.0, 100.0, lo_open=True)
    from ..tools.plots import COLORS, new_figure  # deferred: matplotlib is optional; loaded only to draw

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


# ---- verdicts: prose that concludes from a comparison is chosen by its verdict, never typed beside a ratio


def interleaved(fns: dict, *, budget_s: float, min_repeats: int = 5, max_repeats: int = 30, warmup_rounds: int = 1,
                progress: bool = True) -> dict:
    """Call every ``fns[name]()`` in turn, round after round, until ``budget_s`` is spent, through labkit's one
    loop (``labkit.tools.timing.interleaved``; ``min_repeats`` is only checked against ``max_repeats``).
    Returns {name: [what the calls returned, one per round kept after ``warmup_rounds``]}."""
    _loop_args(budget_s, min_repeats, max_repeats)
    _int("warmup_rounds", warmup_rounds, 0, 1000)
    return timing.interleaved(fns, max_rounds=max_repeats, warmup_rounds=warmup_rounds, budget_s=budget_s,
                              min_rounds=2, progress=progress)


class LoopComparison:
    """Interleaved repeats of several cases of one timing loop (``compare_loops``). ``compare(a, b)`` gives
    the same statistics as ``lk.compare_configs`` (``labkit.tools.compare.verdict``) for any two of the cases."""

    def __init__(self, runs: dict, metric: str, busy: bool, load: dict, threshold: float, min_repeats: int):
        self.runs, self.metric, self.busy, self.load = runs, metric, busy, load
        self.threshold, self.min_repeats = threshold, min_repeats
        self.samples = {name: [r[metric] for r in rs] for name, rs in runs.items()}

    def compare(self, a: str, b: str):
        return verdict(self.samples[a], self.samples[b], self.metric, threshold=self.threshold,
                       min_repeats=self.min_repeats, busy=self.busy, label_a=a, label_b=b, load=self.load)

    def median(self, name: str, key: str):
        return median([r.get(key) for r in self.runs[name]])


def compare_loops(config, cases: dict, *, updates: int, budget_s: float, min_repeats: int = 5,
                  threshold: float = 0.05, max_repeats: int = 30, loop_fn=None, progress: bool = True,
                  pairs=None):
    """Time ``time_loop`` for every case {name: (workers, threads)}, one loop at a time and in turn (A B C,
    B C A, C A B, ...: a drift in the load hits every case alike, and a stop mid-round favours none); returns
    a ``LoopComparison`` whose ``compare(a, b)`` is a verdict on the step time (wall clock, waiting included).

    The budget holds between loops (``tools.timing.in_turn``); each loop drops its own first update. It stops
    early once every pair in ``pairs`` (default: each case against the next) settles its verdict, and a case
    whose every pair is settled leaves the turn. Too few loops give no verdict (``compare(a, b).decided`` is
    False) -- never a longer wait. ``loop_fn`` replaces ``time_loop`` (tests feed a fake)."""
    _config(config)
    if not isinstance(cases, dict) or len(cases) < 2 or not all(
            isinstance(v, tuple) and len(v) == 2 for v in cases.values()):
        raise ConfigError("cases", cases, "a dict {name: (workers, threads)} with at least two cases")
    for w, t in cases.values():
        _int("workers", w, 0, 64)
        _int("threads", t, 1, 1024)
    _int("updates", updates, 1, 100_000)
    _loop_args(budget_s, min_repeats, max_repeats, verdict_needs_min=True)
    _num("threshold", threshold, 0.0, 1.0, lo_open=True)
    names = list(cases)
    pairs = list(zip(names, names[1:])) if pairs is None else pairs
    if not isinstance(pairs, (list, tuple)) or not all(
            isinstance(p, tuple) and len(p) == 2 and set(p) <= set(names) for p in pairs):
        raise ConfigError("pairs", pairs, "a list of (case, case) tuples naming cases")
    loop_fn = loop_fn or time_loop
    before = machine_load()
    meter = LoadMeter()
    fns = {name: (lambda w=w, t=t: loop_fn(config.replace(workers=w), threads=t, updates=updates))
           for name, (w, t) in cases.items()}

    def open_pairs(runs):
        samples = {k: [r["step_time_s"] for r in rs] for k, rs in runs.items()}
        return [(a, b) for a, b in pairs if (x := ranks.ratio_interval(samples[a], samples[b])) is None
                or not settles(x[0], x[1], threshold)]

    def finished(runs):  # cases no open pair needs: their loops would only spend the budget
        still = {name for pair in open_pairs(runs) for name in pair}
        return [name for name in names if name not in still]

    runs = in_turn(fns, budget_s=budget_s, max_repeats=max_repeats, settled=lambda runs: not open_pairs(runs),
                   finished=finished, progress=progress)
    load = meter.read()
    load["before"] = before
    # the same test lk.compare_configs applies: a quartile range over a quarter of the median means a busy machine
    scattered = any(_rel_iqr(xs) > 0.25 for xs in ([r["step_time_s"] for r in rs] for rs in runs.values())
                    if len(xs) >= 4)
    load["repeats_scattered"] = scattered
    busy = bool(before["busy"] or load["busy"] or scattered)
    return LoopComparison(runs, "step_time_s", busy, load, threshold, min_repeats)


def startup_comparison(config, workers: int, *, budget_s: float, min_repeats: int = 5, threshold: float = 0.05,
                       startup_fn=None, progress: bool = True):
    """Time to the first batch of a *later* epoch without and with ``persistent_workers``, in turn
    (``startup`` with two epochs each call, the second one timed; the budget held between calls, and a
    stop once the verdict is settled, as in ``compare_loops``), as a verdict: a Comparison whose arm a is
    ``persistent_workers=False``. Its sentence speaks of start-up time, not of updates."""
    _config(config)
    _int("workers", workers, 1, 64)  # persistent workers need at least one worker to keep
    _loop_args(budget_s, min_repeats, 30, verdict_needs_min=True)
    _num("threshold", threshold, 0.0, 1.0, lo_open=True)
    startup_fn = startup_fn or startup
    before = machine_load()
    meter = LoadMeter()
    fns = {p: (lambda p=p: startup_fn(config, workers=workers, persistent=p, epochs=2)) for p in (False, True)}

    def settled(runs):  # the verdict is settled: stop before the budget (see compare_loops)
        x = ranks.ratio_interval(*([times[-1] for times in runs[p]] for p in (False, True)))
        return x is not None and settles(x[0], x[1], threshold) is not None

    runs = in_turn(fns, budget_s=budget_s, max_repeats=30, settled=settled, progress=progress)
    samples = {p: [times[-1] for times in rs] for p, rs in runs.items()}
    load = meter.read()
    load["before"] = before
    busy = bool(before["busy"] or load["busy"])
    cmp = verdict(samples[False], samples[True], "step_time_s", threshold=threshold, min_repeats=min_repeats,
                  busy=busy, label_a="persistent_workers=False", label_b="persistent_workers=True", load=load)
    cmp.sentence = cmp.sentence.replace(VERDICT_WORDS.say("metric-step_time_s"), WORDS.say("first-batch"))
    cmp.first_epochs = {p: [times[0] for times in rs] for p, rs in runs.items()}
    return cmp


# ---- argument checks: a chapter's call is refused before any work, in the Config's words --------------------

def _config(config):
    if not isinstance(config, Config):
        raise ConfigError("config", type(config).__name__, "an lk.Config")


def _loop_args(budget_s, min_repeats, max_repeats, *, verdict_needs_min=False):
    _num("budget_s", budget_s, 0.0, 86_400.0, lo_open=True)
    _int("min_repeats", min_repeats, 2, 1000)  # fewer than two repeats have no spread to judge
    # a comparison capped below the repeats its verdict needs could never decide
    _int("max_repeats", max_repeats, min_repeats if verdict_needs_min else 1, 10_000)


def sample_cost(compute_ms: float, micro_batch: int, load_ratio: float, lo: float, hi: float) -> dict:
    """The per-sample cost (ms) that makes loading one batch take ``load_ratio`` × its compute, to two significant
    digits, kept within [``lo``, ``hi``] so that heavy load cannot make the chapter crawl: cost_ms, wanted_ms,
    load_ms, ratio (load_ms ÷ compute_ms) and clamp -- 'capped' (to ``hi``), 'raised' (to ``lo``), 'as_asked'."""
    _num("compute_ms", compute_ms, 0.0, 1e9, lo_open=True)
    _int("micro_batch", micro_batch, 1)
    _num("load_ratio", load_ratio, 0.0, 1e3, lo_open=True)
    _num("lo", lo, 0.0, 1e6, lo_open=True)
    _num("hi", hi, lo, 1e6)
    wanted = load_ratio * compute_ms / micro_batch
    clamp = "capped" if wanted > hi else "raised" if wanted < lo else "as_asked"
    cost = min(hi, max(lo, wanted))
    cost = round(cost, 1 - math.floor(math.log10(cost)))
    return {"cost_ms": cost, "wanted_ms": wanted, "load_ms": cost * micro_batch, "compute_ms": compute_ms,
            "ratio": cost * micro_batch / compute_ms, "load_ratio": load_ratio, "clamp": clamp, "lo": lo, "hi": hi}


def arm_rows(cmp) -> list:
    """Both arms of a comparison as rows (medians of each arm's runs): label, step_time_ms, data_wait_ms,
    compute_ms, data_wait_frac, mfu, runs -- the figures the starving and workers cells show."""
    if not all(hasattr(cmp, k) for k in ("decided", "better", "resolved", "ratio")):
        raise ConfigError("cmp", type(cmp).__name__,
                          "a comparison (what lk.compare_configs or compare_loops returns)")
    rows = []
    for label, rs in ((cmp.label_a, cmp.results_a), (cmp.label_b, cmp.results_b)):
        f = wait_figures(rs)
        mfu = [r.summary.get("mfu") for r in rs if r.summary.get("mfu") is not None]
        rows.append({"arm": label, "step_time_ms": _ms(f["step_time_s"]), "data_wait_ms": _ms(f["data_wait_s"]),
                     "compute_ms": _ms(f["compute_s"]), "data_wait_frac": f["data_wait_frac"],
                     "mfu": statistics.median(mfu) if mfu else None, "runs": f["runs"],
                     "threads": f["intra_op_threads"]})
    return rows


def _ms(seconds):
    return None if seconds is None else 1e3 * seconds


def mfu_basis(summary: dict) -> str:
    """What a run's MFU is a share of, as a verdict name: 'datasheet' (a GPU's published peak), 'probe' (this
    machine's own short matmul probe: the best it reached, not a published figure), 'under_load' (a probe taken
    while other programs used the cores: it reads low, so MFU reads high -- not to be shown) or 'none' (no peak)."""
    if not isinstance(summary, dict):
        raise ConfigError("summary", type(summary).__name__, "a run's summary dict (result.summary)")
    source = str(summary.get("peak_flops_source") or "")
    if not summary.get("peak_flops") or summary.get("mfu") is None:
        return "none"
    if not source.startswith("measured"):
        return "datasheet"
    return "under_load" if UNDER_LOAD in source else "probe"


def sweep_rows(by_workers: dict) -> list:
    """Medians per worker count ({workers: [run summaries]}): workers, step_time_s, data_wait_s, data_wait_frac,
    threads and runs -- what the sweep's table and ``plot_sweep`` show."""
    if not isinstance(by_workers, dict) or not by_workers or not all(by_workers.values()):
        raise ConfigError("by_workers", by_workers, "a dict {workers: [run summaries]}, each list non-empty")

    def med(ss, k):
        return statistics.median(s[k] for s in ss)
    return [dict(workers=w, step_time_s=med(ss, "step_time_s"), data_wait_s=med(ss, "data_wait_s"),
                 data_wait_frac=med(ss, "data_wait_frac"), threads=ss[0]["intra_op_threads"], runs=len(ss))
            for w, ss in by_workers.items()]


def loop_rows(loops, cases: dict) -> list:
    """Medians of ``compare_loops``'s interleaved runs, one row per case {name: (workers, threads)}."""
    return [{"case": name, "workers": w, "threads": t, "step_time_ms": _ms(loops.median(name, "step_time_s")),
             "data_wait_frac": loops.median(name, "data_wait_frac"), "runs": len(loops.samples[name])}
            for name, (w, t) in cases.items()]


def startup_rows(cmp) -> list:
    """``startup_comparison``'s medians: time to the first batch of the first and of a later epoch, without and
    with persistent workers."""
    later = {False: cmp.samples_a, True: cmp.samples_b}
    return [{"persistent_workers": p, "first_epoch_ms": _ms(statistics.median(cmp.first_epochs[p])),
             "later_epoch_ms": _ms(statistics.median(later[p])), "tries": len(cmp.first_epochs[p])}
            for p in (False, True)]


def prefetch_rows(cmp, workers: int, depths: tuple, batch_bytes: int) -> list:
    """Both arms of a comparison of two prefetch factors (``depths``, arm a's first): time per update, waiting,
    and the batches in flight (workers × prefetch_factor) with their KiB."""
    rows = arm_rows(cmp)
    for row, depth in zip(rows, depths):
        row.update(in_flight=workers * depth, in_flight_kib=workers * depth * batch_bytes / 2**10)
    return rows


def memory_rows(mem: dict) -> list:
    """``worker_memory`` per start method ({context: result}) as rows of MiB: the training process, then each
    worker with its start method (USS: its own pages, what one more worker costs)."""
    mib = 2**20
    main = next(iter(mem.values()))["main"]
    rows = [{"process": "training process", "rss": main["rss"] / mib, "uss": None, "pss": None}]
    for m in mem.values():
        rows += [{"process": f"worker ({m['start_method']})", "start_method": m["start_method"], "rss": w["rss"] / mib,
                  "uss": w["uss"] / mib, "pss": None if w["pss"] is None else w["pss"] / mib} for w in m["workers"]]
    return rows


def reference_rows(ids: tuple = ()) -> list:
    """The shipped GPU reference runs of the loader (only ``ids`` when given): label, ms per update, waiting,
    MFU -- an empty list where none are shipped (the chapter's opening cell has said so once)."""
    pts = [p for p in reference_points("loader") if p.get("status") == "ok" and (not ids or p["id"] in ids)]
    return [{"run": p.get("label"), "step_time_ms": _ms(p["summary"]["step_time_s"]),
             "data_wait_frac": p["summary"]["data_wait_frac"], "mfu": p["summary"].get("mfu")} for p in pts]


def workers_outcome(cmp) -> str:
    """The verdict name of a 0-workers (a) against workers (b) comparison, for ``lk.course.explain``: 'faster' /
    'slower' / 'same' / 'few' as ``lk.course.outcome`` reads it, and 'odd' where the workers arm won but less
    waiting does not account for it (``waiting_explains``) -- something other than the loader changed."""
    key = outcome(cmp)
    return "odd" if key == "faster" and not waiting_explains(cmp) else key


def prefetch_outcome(cmp) -> str:
    """The same for a shallow (a) against a deep (b) prefetch queue: 'odd' where the deeper queue won but its
    arm did not wait less by at least half the time it saved -- a queue can only save waiting."""
    return workers_outcome(cmp)


def waiting_explains(cmp, share: float = 0.5) -> bool:
    """Whether arm b's shorter update is mostly waiting it no longer does: the drop in median wait is at least
    ``share`` of the drop in median update time (what a loader change can save; more workers or a deeper queue
    do not make the model compute faster). False where either median is missing."""
    a, b = wait_figures(cmp.results_a), wait_figures(cmp.results_b)
    if None in (a["data_wait_s"], b["data_wait_s"], a["step_time_s"], b["step_time_s"]):
        return False
    saved = a["step_time_s"] - b["step_time_s"]
    return saved <= 0 or a["data_wait_s"] - b["data_wait_s"] >= share * saved
