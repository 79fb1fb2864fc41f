"""Chapter 05's measured results as they display: each function takes what a cell measured and returns an
``lk.course.Note`` (markdown that renders as a cell's value or through ``display``), so the chapter's cells
read like the loader they teach, not like string formatting. Every figure comes from the runs passed in;
no sentence here states a direction -- those are chosen by a comparison's verdict (``loaderlab.conclude``).
"""
from __future__ import annotations

import math
import statistics

from .course import Note, md_escape, reference_note, reference_points
from .loaderlab import WAITING_WORDS, wait_figures

__all__ = ["sample_cost_ms", "baseline_note", "starving_note", "reading_note", "sweep_rows", "sweep_table",
           "loader_references", "loops_table", "fewest_note", "bandwidth_note", "startup_table", "prefetch_table",
           "memory_table", "memory_note", "spawn_note"]

MIB = 2**20


def _ms(seconds) -> str:
    return f"{1e3 * seconds:.0f} ms"


def _table(header: tuple, rows: list) -> Note:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(v) for v in r) + " |" for r in rows]
    return Note("\n".join(lines))


def sample_cost_ms(compute_ms: float, micro_batch: int, load_ratio: float, lo: float, hi: float) -> float:
    """The per-sample cost that makes loading one batch take ``load_ratio`` × its compute, clamped to
    [``lo``, ``hi``] ms (a moment of heavy load must not make the chapter crawl), to two significant digits."""
    cost = min(hi, max(lo, load_ratio * compute_ms / micro_batch))
    return round(cost, 1 - math.floor(math.log10(cost)))


def baseline_note(compute_ms: float, threads, cost_ms: float, micro_batch: int) -> Note:
    return Note(f"Free data: **{compute_ms:.0f} ms** per update (the fastest), with {threads} intra-op thread(s). "
                f"From here on each sample costs **{cost_ms:g} ms** of CPU work: a batch of {micro_batch} needs "
                f"about {cost_ms * micro_batch:.0f} ms to load.")


def starving_note(cmp) -> Note:
    """What waiting measures, and its share in both arms of a free-data against costly-data comparison."""
    free, starving = wait_figures(cmp.results_a), wait_figures(cmp.results_b)
    mfu = [statistics.median(r.summary["mfu"] for r in rs) for rs in (cmp.results_a, cmp.results_b)]
    return Note(f"{WAITING_WORDS} In these runs (medians), with costly data and 0 workers: waiting "
                f"**{starving['data_wait_frac']:.0%}** ({_ms(starving['data_wait_s'])} of a "
                f"{_ms(starving['step_time_s'])} update); with free data {free['data_wait_frac']:.0%}. "
                f"MFU {100 * mfu[1]:.2f}% with costly data, {100 * mfu[0]:.2f}% with free data.")


def reading_note(reading: dict) -> Note:
    """labkit's reading of runs with 0 workers (``profiling.loader_reading``), in words."""
    lo, hi = reading["load_range_ms"]
    return Note(f"labkit's reading of the same {reading['updates']} updates (medians): **{reading['load_ms']:.0f} ms** "
                f"to load a batch (per update {lo:.0f}–{hi:.0f} ms) and **{reading['compute_ms']:.0f} ms** of compute: "
                f"⌈load / compute⌉ = **{reading['workers']} worker(s)**; the ideal model's 5% knee: {reading['knee']}. "
                "The sweep below measures what that many workers do on this machine.")


def sweep_rows(by_workers: dict) -> list:
    """Medians per worker count ({workers: [run summaries]}): what ``sweep_table`` and ``plot_sweep`` show."""
    def med(ss, k):
        return statistics.median(s[k] for s in ss)
    return [dict(workers=w, step_time_s=med(ss, "step_time_s"), data_wait_s=med(ss, "data_wait_s"),
                 data_wait_frac=med(ss, "data_wait_frac"), threads=ss[0]["intra_op_threads"], runs=len(ss))
            for w, ss in by_workers.items()]


def sweep_table(rows: list) -> Note:
    return _table(("workers", "intra-op threads", "per update", "waiting for data", "runs (median of)"),
                  [(r["workers"], r["threads"], _ms(r["step_time_s"]),
                    f"{r['data_wait_frac']:.1%} ({_ms(r['data_wait_s'])})", r["runs"]) for r in rows])


def loader_references(ids: tuple = ()) -> Note:
    """The shipped GPU reference runs of the loader (only ``ids`` when given): time, waiting, MFU -- empty
    where none are shipped (the chapter's opening cell has said so once)."""
    def line(p):
        s = p["summary"]
        mfu = f", MFU {100 * s['mfu']:.1f}%" if s.get("mfu") is not None and not ids else ""
        return (f"- {md_escape(p.get('label'))}: {1e3 * s['step_time_s']:.1f} ms per update, waiting "
                f"{s['data_wait_frac']:.1%}{mfu}")
    pts = [p for p in reference_points("loader") if p.get("status") == "ok" and (not ids or p["id"] in ids)]
    return Note("\n".join([reference_note("loader"), ""] + [line(p) for p in pts]) if pts else "")


def loops_table(loops, cases: dict) -> Note:
    """Medians of ``loaderlab.compare_loops``'s interleaved runs, one row per case {name: (workers, threads)}."""
    return _table(("case", "threads", "per update", "waiting for data", "interleaved runs"),
                  [(name, t, _ms(loops.median(name, "step_time_s")), f"{loops.median(name, 'data_wait_frac'):.1%}",
                    len(loops.samples[name])) for name, (w, t) in cases.items()])


def fewest_note(workers: int, cost_ms: float, wait: float) -> Note:
    """The ideal model's fewest workers against the waiting measured with that many."""
    held = ("under 5%, as the model said." if wait < 0.05 else
            "still above 5%: the model ignores that workers compete with the training for cores (see above).")
    return Note(f"The ideal model asks for **{workers} worker(s)** at {cost_ms:g} ms/sample; measured with "
                f"{workers}: waiting **{wait:.1%}** of the time (median of the sweep's runs) — {held}")


def bandwidth_note(bw: dict) -> Note:
    """``loaderlab.pinned_copy``'s copy speeds."""
    return Note(f"Host-to-GPU copy of 256 MiB: pageable **{bw['pageable']:.1f} GB/s**, pinned "
                f"**{bw['pinned']:.1f} GB/s** (the best of the copies).")


def startup_table(cmp) -> Note:
    """Time to the first batch of the first and of a later epoch, without and with persistent workers
    (``loaderlab.startup_comparison``'s medians)."""
    later = {False: cmp.samples_a, True: cmp.samples_b}
    return _table(("persistent_workers", "first batch, first epoch", "first batch, later epoch", "tries"),
                  [(p, _ms(statistics.median(cmp.first_epochs[p])), _ms(statistics.median(later[p])),
                    len(cmp.first_epochs[p])) for p in (False, True)])


def prefetch_table(cmp, workers: int, depths: tuple, batch_bytes: int) -> Note:
    """Both arms of a comparison of two prefetch factors (``depths``, arm a's first): time per update, waiting,
    and the batches in flight (workers × prefetch_factor)."""
    rows = []
    for label, rs, depth in ((cmp.label_a, cmp.results_a, depths[0]), (cmp.label_b, cmp.results_b, depths[1])):
        f = wait_figures(rs)
        flight = f"{workers * depth} batches = {workers * depth * batch_bytes / 2**10:.0f} KiB"
        rows.append((label, _ms(f["step_time_s"]), f"{f['data_wait_frac']:.1%}", flight, f["runs"]))
    return _table((f"{workers} worker(s)", "per update", "waiting", "in flight", "runs (medians of)"), rows)


def memory_table(mem: dict) -> Note:
    """``loaderlab.worker_memory`` per start method ({context: result}): the training process and each worker."""
    main = next(iter(mem.values()))["main"]
    rows = [("training process", f"{main['rss'] / MIB:.0f} MiB", "", "")]
    for m in mem.values():
        rows += [(f"worker ({m['start_method']})", f"{w['rss'] / MIB:.0f} MiB", f"{w['uss'] / MIB:.0f} MiB",
                  "n/a" if w["pss"] is None else f"{w['pss'] / MIB:.0f} MiB") for w in m["workers"]]
    return _table(("process", "RSS", "USS", "PSS"), rows)


def memory_note(mem: dict) -> Note:
    """What one more worker costs under each start method: its own pages (USS)."""
    own = [f"**{m['workers'][0]['uss'] / MIB:.0f} MiB** under {m['start_method']}" for m in mem.values() if m["workers"]]
    return Note(f"Each extra worker costs about {' and '.join(own)} of its own. Multiply by the worker count — and by "
                "the number of training processes on the machine (one per GPU).")


def spawn_note(res: dict) -> Note:
    """``loaderlab.try_spawn``'s result: which class, whether it worked, and what the training process saw."""
    said = "works" if res["ok"] else "FAILS"
    return Note(f"`{res['class']}` under spawn: **{said}** after {res['seconds']:.1f} s.  \nThe training process "
                f"sees: `{res['error']}`")
