"""What every section of chapter 07 uses (taught in chapter 07): where files go, the thread count of its
micro-benchmarks, argument checks in Config's ConfigError style, the interleaved timer (labkit's one loop,
``labkit.tools.timing``, each call timed with the device synchronised), the GPU reference lines, plain numbers."""
from __future__ import annotations

from pathlib import Path

from .. import course
from ...base import paths
from ...base.errors import ConfigError
from ...base.numfmt import number
from ...engine.config import Config, _int, _num  # Config's own ConfigError checks, for this chapter's arguments
from ...engine.device import capabilities, cores, torch_device
from ...engine.measure import machine_load
from ...tools import timing

__all__ = ["out_dir", "bench_threads", "interleaved", "reference_summaries", "plain", "reference_rows",
           "reference_table"]


def out_dir() -> Path:
    """Where chapters write files a learner opens elsewhere (traces, snapshots): ``paths.out_dir()`` --
    Colab's /content/labkit-out or Kaggle's /kaggle/working/labkit-out there, else out/ of the course the
    notebook was opened in, else this user's private temp folder."""
    return paths.out_dir()


def bench_threads(kind: str | None = None) -> int | None:
    """Intra-op threads for this chapter's runs and micro-benchmarks: one on a busy CPU (waiting threads spin,
    so two threads on two cores that other programs also use can make a step many times slower -- on one
    2-core test machine, 15x) and in CI mode (shared runners), every core on a quiet one; None off the CPU."""
    kind = kind or capabilities("auto").kind
    if kind != "cpu":
        return None
    return 1 if course.smoke() or machine_load(0.5)["busy"] else cores()


# ---- arguments: refused before any work, in Config's ConfigError style ------------------------------------


def _need_config(name: str, value) -> None:
    if not isinstance(value, Config):
        raise ConfigError(name, value, "a labkit Config, e.g. lk.Config(model='tiny')")


def _need_threads(n_threads) -> None:
    if n_threads is not None:
        _int("n_threads", n_threads, 1, 4096)


def _need_budget(budget_s, allow_none: bool = False, allow_zero: bool = False) -> None:
    if budget_s is None and allow_none:
        return
    _num("budget_s", budget_s, 0.0, 24 * 3600.0, lo_open=not allow_zero)  # NaN and inf are refused too


def _need_ints(name: str, values, lo: int, hi: int) -> list:
    """A non-empty list of distinct integers in [lo, hi] (a repeated value would merge two points into one)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ConfigError(name, values, f"a list of integers from {lo} to {hi}")
    values = list(values)
    if not values:
        raise ConfigError(name, values, f"at least one integer from {lo} to {hi}")
    for v in values:
        _int(name, v, lo, hi)
    if len(set(values)) != len(values):
        raise ConfigError(name, values, "each value once")
    return values


def interleaved(fns: dict, repeats: int = 10, warmup: int = 2, budget_s: float | None = None, device=None) -> dict:
    """Seconds per call of each function, run A B C A B C ... so that a drift in the machine's load hits
    every arm alike, each call timed with the device synchronised before and after. ``warmup`` rounds are
    dropped (first calls allocate and pick kernels). With ``budget_s``: ends once 3 rounds are in and one
    more would overrun it. Returns {name: [seconds, ...]} (labkit's one loop, ``tools.timing.interleaved``)."""
    if not isinstance(fns, dict) or not fns or not all(callable(f) for f in fns.values()):
        raise ConfigError("fns", fns, "a non-empty dict {name: function taking no arguments}")
    _int("repeats", repeats, 1, 10**6)
    _int("warmup", warmup, 0, 10**6)
    _need_budget(budget_s, allow_none=True, allow_zero=True)  # 0: stop as soon as three rounds are in
    return timing.interleaved(fns, max_rounds=repeats, warmup_rounds=warmup, budget_s=budget_s, min_rounds=3,
                              timed_on=device or torch_device())


def reference_summaries(*ids) -> dict:
    """{point id: summary} of the GPU reference points with these ids that completed; {} when the course
    ships no reference file (the chapters then show the learner's numbers only)."""
    return {p["id"]: p["summary"] for p in course.reference_points() if p.get("id") in ids and p.get("status") == "ok"
            and isinstance(p.get("summary"), dict)}


# The reference suite's sections chapter 07 reads, and where its GPU lines appear.
REFERENCE_SECTIONS = ("kernels", "precision", "best")
REFERENCE_PLACES = ("the MFU sweep", "the profile", "`torch.compile`", "the AdamW implementations", "TF32",
                    "attention")


def plain(x: float, digits: int = 2) -> str:
    """A number with ``digits`` significant digits and no e-notation (0.00012, not 1.2e-04): how this
    chapter shows relative errors to a learner -- the course's one format (labkit.base.numfmt)."""
    return number(x, digits)



def _pct(row: dict, key: str) -> float:
    """A row's MFU figure in percent (its median where the lowest/highest run is missing)."""
    v = row.get(key)
    return 100 * (v if v is not None else (row.get("mfu") or 0.0))



# ---- the GPU reference points of each section, as a table ---------------------------------------------------

def _mfu_rows() -> list:
    ref = reference_summaries("kernels/mfu-B1", "kernels/mfu-B4", "precision/bf16", "best/bf16-Bbig")
    return [{"point": f"{r['model']} bf16", "micro_batch": r["micro_batch"], "mfu": r["mfu"],
             "tokens_per_s": r["tokens_per_s"]} for r in sorted(ref.values(), key=lambda r: r["micro_batch"])]


def _compile_rows() -> list:
    out = []
    for p in course.reference_points("precision") + course.reference_points("best"):
        if p.get("id") in ("best/bf16-Bbig", "precision/bf16-compile") and p.get("status") == "ok":  # eager, compiled
            ps, recs = p["summary"], p.get("records") or []
            out.append({"point": p["id"], "compile": ps["compile"], "tokens_per_s": ps["tokens_per_s"], "mfu": ps["mfu"],
                        "first_s": recs[0]["step_time_s"] if ps.get("compile") and recs else None})
    return out


def _optimizer_rows() -> list:
    return [{"device": r["device_name"], "params_m": r["n_params"] / 1e6, "default": r["default"], "impl": impl,
             "ms": 1e3 * s} for r in reference_summaries("kernels/optimizer").values() for impl, s in r["median_s"].items()]


def _tf32_rows() -> list:
    out = [{"point": pid, "tokens_per_s": ps["tokens_per_s"], "mfu": ps["mfu"], "final_loss": ps["final_loss"]}
           for pid, ps in reference_summaries("precision/fp32", "precision/tf32").items()]
    out += [{"point": f"matmul {name}", "tflops": ps[name]["tflops"], "rel_error": ps[name]["rel_error"]}
            for ps in reference_summaries("kernels/tf32").values() for name in ("fp32", "tf32", "bf16")]
    return out


def _attention_rows() -> list:
    return [{"device": r["device_name"], "T": row["seq_len"], "backend": row["backend"], "ms": 1e3 * row["time_s"],
             "peak_mib": row["peak_bytes"] / 2**20}
            for r in reference_summaries("kernels/attention").values() for row in r["rows"] if "error" not in row]


_PCT, _TOKENS = (lambda v: f"{100 * v:.1f} %"), "{:,.0f}"
_TOPICS = {
    "mfu": (_mfu_rows, [("point", "GPU reference", "{}"), ("micro_batch", "micro-batch", "{}"), ("mfu", "MFU", _PCT),
                        ("tokens_per_s", "tokens/s", _TOKENS)]),
    "compile": (_compile_rows, [("point", "GPU reference", "{}"), ("compile", "compile", "{}"),
                                ("tokens_per_s", "tokens/s", _TOKENS), ("mfu", "MFU", _PCT),
                                ("first_s", "first update (with its compile), s", "{:.1f}")]),
    "optimizer": (_optimizer_rows, [("device", "GPU reference", "{}"), ("params_m", "M parameters", "{:.0f}"),
                                    ("default", "torch's default", "{}"), ("impl", "AdamW", "{}"), ("ms", "ms per step", "{:.2f}")]),
    "tf32": (_tf32_rows, [("point", "GPU reference", "{}"), ("tokens_per_s", "tokens/s", _TOKENS), ("mfu", "MFU", _PCT),
                          ("final_loss", "final loss", "{:.3f}"), ("tflops", "TFLOP/s", "{:.0f}"),
                          ("rel_error", "relative error", plain)]),
    "attention": (_attention_rows, [("device", "GPU reference", "{}"), ("T", "T", "{}"), ("backend", "backend", "{}"),
                                    ("ms", "ms", "{:.2f}"), ("peak_mib", "peak MiB", "{:.1f}")]),
}


def reference_rows(topic: str) -> list:
    """The rows of one section's GPU reference points ([] when none are shipped)."""
    if topic not in _TOPICS:
        raise ConfigError("topic", topic, f"one of {', '.join(_TOPICS)}")
    return _TOPICS[topic][0]()


def reference_table(topic: str):
    """The GPU reference points of one section of chapter 07 as a table, or None when none are shipped (the
    chapter said so once, at its start), so a cell that ends with it shows nothing."""
    rows = reference_rows(topic)
    return course.table(rows, _TOPICS[topic][1]) if rows else None
