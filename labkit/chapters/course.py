"""Small helpers the chapter notebooks share: sizes per device, smoke mode, generated prose, predictions,
and GPU reference numbers beside the learner's own. Nothing here trains (that is ``labkit.run``'s)."""
from __future__ import annotations

import html
import inspect
import math
import numbers
import os
import re
from pathlib import Path

import torch

from ..tools import reference
from ..engine.config import _choice, _int, _num  # the Config's own checks: one wording for every refusal
from ..engine.device import (FORMATS, LoadMeter, capabilities, contended, cores, measured_peak,
                             slowdown)
from ..engine.measure import machine_load
from ..engine.gpus import current_plan
from ..whatif.devices import DEFAULTS as _WHATIF_DEFAULTS
from ..base.runtime import ConfigError
from ..base.numfmt import counted, is_number, number  # course.number: the one number format, as the chapters call it
from ..base.page import Chosen, explain, md_escape, outcome, say, table  # noqa: F401 -- lk.course.*
from ..base import phrases
from .measured import grading_tool

# the sentences lk.course says itself (a chapter's own words stay in its cells): notebooks/lab_messages.md
WORDS = phrases.load_section("lab_messages.md", "Course helpers", {
    "on-device": ("why", "note"), "faster": ("ratio",), "slower": ("ratio",), "nudge": (),
    "source-measured": (), "source-predicted": (), "source-computed": (),
    "you-guessed": (), "you-predicted": (),
    "shown": ("what", "source", "measured"),
    "close": ("what", "guess", "prediction", "source", "measured"),
    "far": ("what", "guess", "prediction", "source", "measured", "tolerance"),
    "exact": ("what", "guess", "prediction", "source", "measured"),
    "not-exact": ("what", "guess", "prediction", "source", "measured"),
    "choice-right": ("what", "guess", "prediction", "source", "measured"),
    "choice-wrong": ("what", "guess", "prediction", "source", "measured"),
    "set-exact": ("what", "guess", "source", "shown"),
    "set-differs": ("what", "guess", "prediction", "source", "shown", "left_out", "extra"),
    "none": (), "yes": (), "no": ()})


def yes_no(value) -> str:
    """A table cell's yes or no, in the learner's language."""
    return WORDS.say("yes" if value else "no")


UNDER_LOAD = "other programs were using the cores"  # how engine.device's peak source marks a probe under load
USABLE_MEMORY_FRACTION = _WHATIF_DEFAULTS["usable_memory_fraction"]  # one figure for the what-if model and the sizes


def language(lang: str | None = None) -> str:
    """The language labkit speaks to you: ``lk.course.language("ru")`` picks Russian from now on (labkit's
    messages, here and in the processes it starts; ``LABKIT_LANG=ru`` picks it before labkit is imported, as the
    Russian chapters' set-up does); ``lk.course.language()`` says which is in use. English is the default."""
    return phrases.language() if lang is None else phrases.choose_language(lang)


def smoke() -> bool:
    """True in the short mode: chapters shrink step counts and budgets, never skip content. ``LABKIT_MODE``
    (short or full) decides; without it, a CI machine or a grader running the notebook (``grading_tool``: the
    measured exercises are graded from the learner's saved file) is short."""
    mode = os.environ.get("LABKIT_MODE", "").strip().lower()
    if mode in ("short", "full"):
        return mode == "short"
    return on_ci() or grading_tool() is not None


def on_ci() -> bool:
    """Whether this machine says it is CI: ``CI`` set, and not to an empty or false value (what .ci/run sets;
    tests/conftest.py's ``grading_scope`` reads it too)."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def steps(n: int, minimum: int = 2) -> int:
    """``n`` optimizer updates normally, about a third of them (at least ``minimum``) in smoke mode."""
    _int("n", n, 1)
    _int("minimum", minimum, 1)
    return max(minimum, n // 3) if smoke() else n


def budget(seconds: float) -> float:
    """A comparison's time budget: ``seconds`` normally, a quarter (at least 6 s) in CI mode. Chapters
    write their budgets as ``lk.course.budget(N)`` so a test can add them up per chapter."""
    _num("seconds", seconds, 0.0, 86_400.0, lo_open=True)  # NaN or inf would make a comparison run forever
    return max(6.0, seconds / 4) if smoke() else float(seconds)


# A 16-bit format's own units in a CPU's flags: what makes it fast there (AVX512-FP16 alone measured fp16
# slower than fp32: chapter 00). ch01_measure's format_paths reads the same flags.
_UNITS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("amx_fp16",)}


def emulated(precision: str) -> float | None:
    """How many times slower than fp32 ``precision`` runs here when it is emulated in software (at least
    2x slower, e.g. bf16 on a CPU without bf16 units); None when it is not. A probe that shared its cores with
    other programs can read thousands of times too slow: it is probed once more, and if that probe shared them
    too, a CPU whose flags name units for the format is not called emulated (the flags decide; on a quiet
    machine the measurement does, as AMX can be switched off)."""
    _choice("precision", precision, tuple(FORMATS))
    caps = capabilities("auto")
    s = slowdown(caps, precision)
    if s is not None and s >= 2:
        loaded = remeasure_peak(precision)[1]  # once more (the higher is kept)
        s = slowdown(caps, precision)
        if loaded and set(caps.cpu_flags or ()) & set(_UNITS.get(precision, ())):
            return None
    return s if s is not None and s >= 2 else None


def remeasure_peak(precision: str) -> tuple:
    """Probe ``precision``'s matmul peak again (the course's probe, cached when the machine was quiet):
    (FLOP/s, whether other programs took the cores meanwhile)."""
    meter = LoadMeter()
    flops, entry = measured_peak(capabilities("auto"), precision, remeasure=True)
    return flops, contended(meter.read(), torch.get_num_threads()) or bool(entry.get("under_load"))


def low_precision_fit(precision: str, knobs: dict, smaller: dict) -> dict:
    """Where ``precision`` is emulated here, ``smaller`` shrinks the run so the chapter's time holds:
    ``knobs`` (the run's), ``slowdown`` (how many times slower than fp32, None when not emulated),
    ``verdict`` ('emulated' or 'native') -- the chapter words why the model changed."""
    _dict("knobs", knobs)
    _dict("smaller", smaller)
    s = emulated(precision)
    if s is None:
        return dict(knobs=dict(knobs), slowdown=None, verdict="native", smaller=dict(smaller))
    return dict(knobs={**knobs, **smaller}, slowdown=s, verdict="emulated", smaller=dict(smaller))


def device_kind() -> str:
    return capabilities("auto").kind


def sizes(cpu: dict, gpu: dict) -> dict:
    """Pick the chapter's knobs for this device: learners with a GPU get GPU-sized runs automatically. A GPU
    without bf16 units (a T4, a V100, a P100) gets fp16 wherever the GPU sizes ask for bf16: bf16 is refused
    there (see ``gpu_low_precision``)."""
    _dict("cpu", cpu)
    _dict("gpu", gpu)
    if device_kind() != "cuda":
        return dict(cpu)
    low = gpu_low_precision()
    out = {k: (low if k == "precision" and v == "bf16" else v) for k, v in gpu.items()}
    out.update({k: FORMATS[low].dtype for k, v in gpu.items() if v is torch.bfloat16})
    if "budget_bytes" in out:  # a memory budget never above what this card can use (a T4: 13.7 GiB, not 16)
        out["budget_bytes"] = min(out["budget_bytes"], gpu_usable_bytes())
    return out


def gpu_usable_bytes() -> int:
    """Bytes of this GPU a run can use: the what-if model's usable fraction (0.92: CUDA's context, allocator
    fragmentation, workspaces) of its memory -- the plan's (the catalogue's, or less where torch reports
    less), else what torch reports."""
    plan = current_plan()
    total = plan.memory_gb * 1e9 if plan is not None else (capabilities("auto").memory_bytes or 0)
    return int(USABLE_MEMORY_FRACTION * total)


def gpu_low_precision() -> str:
    """The 16-bit format this GPU's low-precision runs use: the plan's (bf16 where the catalogue has bf16
    units, else fp16 with a GradScaler), else bf16 where compute capability says it has them."""
    plan = current_plan()
    if plan is not None:
        return plan.low_precision
    return "bf16" if capabilities("auto").bf16 else "fp16"


def on_this_device() -> None:
    """On a GPU: say which 16-bit format this chapter's low-precision runs use here, and why (the GPU plan's
    words, plus its fp16 note where there is one). On a CPU or a GPU the catalogue does not know: nothing."""
    plan = current_plan() if device_kind() == "cuda" else None
    if plan is not None:
        say(WORDS.say("on-device", why=plan.low_precision_why, note=f" {plan.fp16_note}" if plan.fp16_note else ""))


def predicted_speedup(base, new) -> str:
    """How a *predicted* time ``new`` compares with a predicted ``base``: "3.2× faster" / "1.4× slower".
    Only for predictions, whose direction follows from their numbers; a measured comparison's direction
    comes from its verdict (``lk.compare_configs``), never from two numbers."""
    for name, v in (("base", base), ("new", new)):
        if not is_number(v) or not math.isfinite(v) or v <= 0:
            raise ConfigError(name, v, "a predicted time > 0")
    if base >= new:
        return WORDS.say("faster", ratio=number(base / new, 2))
    return WORDS.say("slower", ratio=number(new / base, 2))


NUDGE = " " + WORDS.sentences["nudge"]  # the English advice (tests look for it); _nudge says it in the learner's
_nudged = False  # said once per kernel session: a chapter asks for a dozen predictions, the advice needs saying once


def _nudge() -> str:
    """The advice to predict first, the first time a prediction is left empty in this kernel; then nothing."""
    global _nudged
    if _nudged:
        return ""
    _nudged = True
    return " " + WORDS.say("nudge")


def _bold(text) -> str:
    return f"**{text}**"


def _what(what: str) -> str:
    return f"**{what}:**"


def _source(source: str) -> str:
    return WORDS.say(f"source-{source}")


def compare_prediction(prediction, measured, what: str, unit: str = "", tolerance: float = 0.25,
                       source: str = "measured"):
    """Say how a learner's prediction compares with the measurement (within ``tolerance``, relative;
    ``tolerance=0``: right only when exact, for a count or a size a formula gives exactly).
    ``source``: what the number is -- "measured" (a run), or "predicted" (the what-if model) or "computed"
    (arithmetic) where nothing ran; the sentence says which. Whole numbers are shown in full (131,072)."""
    if source not in ("measured", "predicted", "computed"):
        raise ConfigError("source", source, "measured, predicted or computed")
    if isinstance(measured, (set, frozenset)):
        return _compare_sets(prediction, measured, what, source)
    if isinstance(measured, str):  # a choice (e.g. "skip" or "rollback"): right or not
        return _compare_choice(prediction, measured, what, source)
    if not is_number(measured) or not math.isfinite(measured):
        raise ConfigError("measured", measured, "a finite number (the chapter's measurement)")
    if not isinstance(what, str) or not isinstance(unit, str):
        raise ConfigError("what" if not isinstance(what, str) else "unit", what if not isinstance(what, str) else unit,
                          "a string")
    _num("tolerance", tolerance, 0.0, 100.0)
    shown = _whole_or_number  # an exact count keeps every digit: 131,072 is not "131,000"
    if prediction is None or prediction is Ellipsis:
        say(WORDS.say("shown", what=_what(what), source=_source(source),
                      measured=_bold(f"{shown(measured)}{unit}")) + _nudge())
        return None
    if not is_number(prediction) or not math.isfinite(prediction):
        # the learner's own guess: say what to write instead of failing inside the arithmetic
        raise ConfigError("your prediction", prediction, f"a number for {what}, e.g. {number(measured * 2)}")
    if tolerance == 0:  # exact: 8 AllGathers for 10 is a miscount, not a near miss
        key = "exact" if prediction == measured else "not-exact"
    else:
        key = "close" if measured != 0 and abs(prediction - measured) / abs(measured) <= tolerance else "far"
    guess = _guess(source)
    say(WORDS.say(key, what=_what(what), guess=guess, prediction=_bold(f"{shown(prediction)}{unit}"),
                  source=_source(source), measured=_bold(f"{shown(measured)}{unit}"),
                  tolerance=f"{tolerance:.0%}"))
    return None  # said, not returned: a cell ending with this call shows no stray True/False


def _guess(source: str) -> str:
    """"you guessed" beside a number the tool predicted (the model's is the prediction), else "you predicted"."""
    return WORDS.say("you-guessed" if source == "predicted" else "you-predicted")


def _whole_or_number(v) -> str:
    """An int (numpy's too) in full with thousands separators; any other number in the course's format."""
    return f"{int(v):,}" if isinstance(v, numbers.Integral) and not isinstance(v, bool) else number(v)


def _compare_choice(prediction, measured: str, what: str, source: str):
    if prediction is None or prediction is Ellipsis:
        say(WORDS.say("shown", what=_what(what), source=_source(source), measured=_bold(measured)) + _nudge())
        return None
    if not isinstance(prediction, str):
        raise ConfigError("your prediction", prediction, f"a word for {what}, e.g. {measured!r}")
    same = prediction.strip().lower() == measured.strip().lower()
    say(WORDS.say("choice-right" if same else "choice-wrong", what=_what(what), guess=_guess(source),
                  prediction=_bold(prediction.strip()), source=_source(source), measured=_bold(measured)))
    return None


def _compare_sets(prediction, measured, what: str, source: str):
    """compare_prediction for a set of names (e.g. the items a checkpoint needed): what the learner left out
    and what they named that the measurement did not need."""
    shown = ", ".join(sorted(map(str, measured))) or WORDS.say("none")
    if prediction is None or prediction is Ellipsis:
        say(WORDS.say("shown", what=_what(what), source=_source(source), measured=_bold(shown)) + _nudge())
        return None
    if isinstance(prediction, str) or not isinstance(prediction, (set, frozenset, list, tuple)):
        raise ConfigError("your prediction", prediction, f"a set of names for {what}, e.g. {{{shown!r}}}")
    guess = set(prediction)
    if guess == set(measured):
        say(WORDS.say("set-exact", what=_what(what), guess=_guess(source), source=_source(source),
                      shown=_bold(shown)))
        return None
    left_out = ", ".join(sorted(map(str, set(measured) - guess))) or WORDS.say("none")
    extra = ", ".join(sorted(map(str, guess - set(measured)))) or WORDS.say("none")
    named = _bold(", ".join(sorted(map(str, guess))) or WORDS.say("none"))
    say(WORDS.say("set-differs", what=_what(what), guess=_guess(source), prediction=named,
                  source=_source(source), shown=_bold(shown), left_out=left_out, extra=extra))
    return None


def reference_points(section: str | None = None) -> list:
    """GPU reference measurements (possibly none) for one section of the suite."""
    if section is not None and not isinstance(section, str):
        raise ConfigError("section", section, "a section name of the reference suite (a string), or None")
    return reference.points(section=section)


def reference_summaries(*ids) -> dict:
    """{point id: summary} of the GPU reference points with these ids that completed; {} when the course
    ships no reference file (the chapters then show the learner's numbers only)."""
    return {p["id"]: p["summary"] for p in reference_points() if p.get("id") in ids and p.get("status") == "ok"
            and isinstance(p.get("summary"), dict)}


def bench_threads(kind: str | None = None) -> int | None:
    """Intra-op threads for a chapter's runs and micro-benchmarks: one on a busy CPU (waiting threads spin,
    so two threads on two cores that other programs also use can make a step many times slower -- on one
    2-core test machine, 15x) and in the short mode, every core on a quiet one; None off the CPU."""
    kind = kind or capabilities("auto").kind
    if kind != "cpu":
        return None
    return 1 if smoke() or machine_load(0.5)["busy"] else cores()


def _dict(name, value):
    if not isinstance(value, dict):
        raise ConfigError(name, value, "a dict of Config fields, e.g. dict(model='tiny', micro_batch=4)")


# ---- chapter 00: the device report ------------------------------------------------------------------------

def peak_reading(env: dict) -> dict:
    """Which case holds for this device's 16-bit matmul peaks (chapter 00 words each case): ``rows`` (one per
    format: TFLOP/s, the ratio to fp32's, its source), ``why`` (how the 16-bit formats run here: on a GPU from
    the datasheet, with ``sheet`` and ``missing``; on a CPU from the probe and its flags, with ``tiles``),
    ``fp16`` (why fp16 measured slower, ``_fp16_case``) and ``bf16_fast``."""
    _env(env)
    peaks = {p: v for p, v in env["peak_flops"].items() if v.get("flops")}
    fp32 = peaks.get("fp32", {}).get("flops")
    rows = [dict(format=p, tflops=v["flops"] / 1e12 if v.get("flops") else None,
                 vs_fp32=v["flops"] / fp32 if v.get("flops") and fp32 else None, source=v.get("source"))
            for p, v in env["peak_flops"].items()]
    out = dict(name=env["name"], rows=rows, sheet="", missing="", tiles="", bf16_fast="bf16" in env["fast_formats"],
               fp16=_fp16_case(env, peaks, fp32))
    if fp32 is None or not ({"bf16", "fp16"} & set(peaks)):
        return {**out, "why": "none"}
    if env["kind"] == "cuda":  # a format is on tensor cores only where the datasheet row gives it a peak
        sheet = [p for p in ("bf16", "fp16")
                 if p in peaks and not str(peaks[p].get("source", "")).startswith("measured")]
        missing = [p for p in ("bf16", "fp16") if p not in sheet]
        why = "unknown_gpu" if not sheet else "tensor_cores_some" if missing else "tensor_cores"
        return {**out, "why": why, "sheet": " and ".join(sheet), "missing": " or ".join(missing)}
    flags = set(env.get("cpu_flags") or [])
    if out["bf16_fast"]:  # measured faster: units the flags name, or a probe that says so without them
        why = "bf16_units" if {"amx_bf16", "avx512_bf16"} & flags else "bf16_unlisted"
    elif "bf16" in peaks:
        why = "bf16_par" if peaks["bf16"]["flops"] >= fp32 else "bf16_emulated"
    else:
        why = "no_bf16"
    tiles = [f.split("_", 1)[1] for f in sorted(flags) if f in ("amx_bf16", "amx_int8")]
    return {**out, "why": why, "tiles": " and ".join(tiles)}


def _fp16_case(env: dict, peaks: dict, fp32) -> str:
    """Why fp16 measured slower than fp32, where it did: on a CPU from its flags, only what they show."""
    if "fp16" not in peaks or fp32 is None:
        return "no_peak"
    if peaks["fp16"]["flops"] >= fp32:
        return "not_slower"
    if env["kind"] != "cpu":
        return "slower"
    flags = set(env.get("cpu_flags") or [])
    if "amx_fp16" in flags:
        return "amx_fp16"
    if "avx512_fp16" in flags:
        return "avx512_amx" if {"amx_bf16", "amx_int8"} & flags else "avx512_no_amx"
    return "software"


def _env(env):
    if not isinstance(env, dict) or not {"name", "kind", "peak_flops", "fast_formats"} <= set(env):
        raise ConfigError("env", type(env).__name__, "the report lk.env() returns")


# ---- the code on the page ------------------------------------------------------------------------------

class Source:
    """A function's current source as a highlighted code block: a chapter's "the code" cell shows the very
    function every run executed (``show``), so the page cannot drift from what was measured."""

    def __init__(self, objs):
        self.parts = [(_where(o), inspect.getsource(o).rstrip()) for o in objs]

    def _repr_markdown_(self) -> str:
        return "\n\n".join(f"`{where}`\n```python\n{code}\n```" for where, code in self.parts)

    def _repr_html_(self) -> str:
        """The same, for JupyterLab: lines never wrap (its output style breaks long lines inside words),
        a line wider than the page scrolls sideways."""
        return "".join(f"<p><code>{html.escape(where)}</code></p>{_highlighted(code)}" for where, code in self.parts)

    def __str__(self) -> str:
        return "\n\n".join(f"# {where}\n{code}" for where, code in self.parts)

    __repr__ = __str__


def _highlighted(code: str) -> str:
    style = "white-space:pre; overflow-x:auto; word-break:normal; padding:0.5em; font-size:0.85em"
    try:
        from pygments import formatters, highlight, lexers  # deferred: optional (IPython brings it); plain text without it
    except ImportError:
        return f'<pre style="{style}">{html.escape(code)}</pre>'
    return highlight(code, lexers.PythonLexer(), formatters.HtmlFormatter(noclasses=True, prestyles=style))


def _where(obj) -> str:
    """'labkit/engine/step.py: micro_steps' -- where a shown function lives, relative to the package."""
    path = Path(inspect.getsourcefile(obj)).resolve()
    root = Path(__file__).resolve().parents[2]
    shown = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
    return f"{shown}: {obj.__qualname__}"


def show(*objs) -> Source:
    """The current source of labkit functions (or classes), to be a cell's last value: the code a learner
    writes at work, and the same code the chapter's measurements ran."""
    if not objs:
        raise ConfigError("show()", "nothing", "one or more functions, e.g. lk.course.show(lk.engine.step.micro_steps)")
    for o in objs:
        if not (inspect.isfunction(o) or inspect.isclass(o) or inspect.ismethod(o)):
            raise ConfigError("show()", type(o).__name__, "a function or class whose source can be read, "
                              "e.g. lk.engine.step.micro_steps")
    return Source(objs)
