"""One drill, start to end, as plain code the widget and the command line share: draw a case, run it (and,
hidden, its healthy twin), show the evidence as rows of text, take an answer against the timer, score it,
reveal. ``Attempt`` holds the state; ``evidence_rows`` is what the learner sees of a run.

    a = Attempt(seed=3, timer=180)
    a.run()                       # the case and its twin; the timer starts when the evidence is ready
    a.answer(a.causes[0], a.fixes[2])   # the score card's row (timed out when the time was up)
    a.reveal()                    # the learner's fix against the right one, measured
"""
from __future__ import annotations

import json
import math
import sys
import time
from typing import Callable, Optional

from ..base.runtime import ConfigError
from ..base.numfmt import is_number, number
from ..base.paths import write_atomic
from ..check import _core
from ..engine.device import capabilities
from ..engine.measure import mfu_impossible
from .bank import CASES, PAGE
from .evidence import case_by_id, reveal, run_case
from .scoring import (DEFAULT_LIMIT_S, Timer, _check_n, _check_seed, all_fixes, card, card_words, check_row, draw,
                      gauntlet_draw, options, row_words, runnable, score)


def _ms(v) -> str:
    return say("unit-ms", value=number(1000 * v)) if isinstance(v, (int, float)) else "–"


def _mib(v) -> str:
    return say("unit-mib", value=f"{v / 2**20:,.2f}") if isinstance(v, (int, float)) else "–"


def _pct(v) -> str:
    return f"{100 * v:.3g} %" if isinstance(v, (int, float)) else "–"


# What evidence_rows reads, by kind: a number (or None), a list, a string. NaN is allowed: a run's loss may be.
_EV_NUMBERS = ("step_time_s", "data_wait_s", "compute_s", "optimizer_s", "data_wait_frac", "tokens_per_s",
               "samples_per_s", "mfu", "hfu", "allreduce_calls_per_update", "allreduce_bytes_per_update",
               "param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes", "peak_mem_bytes", "oom_at_update",
               "first_loss", "final_loss", "loss_drop", "grad_norm", "clip_frac", "grad_scale", "skipped_steps",
               "grad_zero_frac", "max_expert_share", "tp_allreduce_calls")
_EV_LISTS = ("losses", "peak_mem_by_update", "eval_losses", "collectives_per_rank", "expert_shares")
_EV_LOSS_KEYS = ("first_loss", "final_loss", "loss_drop", "grad_norm")  # shown with the loss curve
say = PAGE.say
# Each case's signal (``Case.signal``) and the evidence row that shows it (its name, the page's "name-..."
# sentence): a case's tell must be on screen.
SIGNAL_ROWS = {k: say(v) for k, v in {
    "allreduce_calls_per_update": "name-allreduce", "data_wait_frac": "name-data-wait",
    "tokens_per_s": "name-throughput", "mfu": "name-mfu", "grad_zero_frac": "name-zero-grads",
    "grad_scale": "name-loss-scale", "recompute_ratio": "name-mfu", "oom_at_update": "name-oom",
    "lr_vs_sqrt_rule": "name-optimizer", "grad_norm": "name-grad-norm", "eval_loss_spread": "name-evaluation",
    "timed_out": "name-hang", "final_loss": "name-loss", "loss_drop": "name-loss",
    "max_expert_share": "name-experts", "tp_allreduce_calls": "name-tp"}.items()}


def _check_evidence(ev) -> None:
    """Every key evidence_rows reads, of the kind it reads; else a ConfigError naming it (before any row)."""
    if not isinstance(ev, dict):
        raise ConfigError("ev", type(ev).__name__, "a drill's evidence: a dict from lk.drills.evidence(result)")
    for k in _EV_NUMBERS:
        if ev.get(k) is not None and not is_number(ev[k]):
            raise ConfigError(f"ev[{k!r}]", ev[k], "a number or None (lk.drills.evidence makes it)")
    for k in _EV_LISTS:
        v = ev.get(k)
        if v is not None and (not isinstance(v, (list, tuple)) or not all(x is None or is_number(x) for x in v)):
            raise ConfigError(f"ev[{k!r}]", v, "a list of numbers or None (lk.drills.evidence makes it)")
    for k in ("matmul_dtype", "hang_error"):
        if ev.get(k) is not None and not isinstance(ev[k], str):
            raise ConfigError(f"ev[{k!r}]", ev[k], "a string or None")
    if ev.get("losses"):
        for k in _EV_LOSS_KEYS:
            if not is_number(ev.get(k)):
                raise ConfigError(f"ev[{k!r}]", ev.get(k), "a number: evidence with losses carries it too")


def evidence_rows(ev: dict) -> list:
    """[(what, value as text)] for every instrument the run's evidence holds, as the chapters show them (the
    values' words are the page's "row-..." sentences)."""
    _check_evidence(ev)
    rows = []
    if ev.get("status") not in (None, "completed"):
        status = say("status-oom") if ev["status"] == "out of memory" else str(ev["status"])
        rows.append((say("name-run"), status))
    if ev.get("step_time_s") is not None:
        rows.append((say("name-step-time"), say("row-step-time", step=_ms(ev["step_time_s"]),
                                                data=_ms(ev.get("data_wait_s")),
                                                compute=_ms(ev.get("compute_s")),
                                                optimizer=_ms(ev.get("optimizer_s")))))
        rows.append((say("name-data-wait"), say("row-data-wait", share=_pct(ev.get("data_wait_frac")))))
        rows.append((say("name-throughput"), say("row-throughput", tokens=number(ev.get("tokens_per_s") or 0),
                                                 samples=number(ev.get("samples_per_s") or 0))))
    if mfu_impossible(ev.get("mfu")):  # above 1 is not a measurement: never shown as one
        rows.append((say("name-mfu"), say("row-mfu-wrong", mfu=say("mfu-above-peak"))))
    elif ev.get("mfu") is not None:
        rows.append((say("name-mfu"), say("row-mfu", mfu=_pct(ev["mfu"]), hfu=_pct(ev.get("hfu")))))
    if ev.get("allreduce_calls_per_update") is not None:
        rows.append((say("name-allreduce"), say("row-allreduce", calls=number(ev["allreduce_calls_per_update"]),
                                                bytes=_mib(ev.get("allreduce_bytes_per_update")))))
    if ev.get("param_bytes") is not None:
        rows.append((say("name-memory"), say("row-memory", params=_mib(ev["param_bytes"]),
                                             grads=_mib(ev.get("grad_bytes")),
                                             optimizer=_mib(ev.get("optimizer_bytes")),
                                             activations=_mib(ev.get("activation_bytes")),
                                             peak=_mib(ev.get("peak_mem_bytes")))))
    if ev.get("oom_at_update"):
        peaks = ", ".join(_mib(p) for p in ev.get("peak_mem_by_update") or [])
        rows.append((say("name-oom"), say("row-oom" if peaks else "row-oom-first", update=ev["oom_at_update"],
                                          peaks=peaks)))
    if ev.get("matmul_dtype"):
        rows.append((say("name-profiler"), say("row-profiler", dtype=ev["matmul_dtype"])))
    if ev.get("logged_lr") is not None:
        rows.append((say("name-optimizer"), say("row-optimizer", lr=f"{ev['logged_lr']:g}",
                                                sequences=ev.get("samples_per_update"))))
    if ev.get("losses"):
        rows.append((say("name-loss"), say("row-loss", first=f"{ev['first_loss']:.4f}",
                                           final=f"{ev['final_loss']:.4f}", updates=len(ev["losses"]),
                                           drop=f"{ev['loss_drop']:.4f}")))
        rows.append((say("name-grad-norm"), say("row-grad-norm", norm=number(ev["grad_norm"]),
                                                clipped=_pct(ev.get("clip_frac")))))
    if ev.get("grad_scale") is not None:
        rows.append((say("name-loss-scale"), say("row-loss-scale", scale=number(ev["grad_scale"]))))
    if ev.get("skipped_steps") is not None:
        rows.append((say("name-skipped"), str(ev["skipped_steps"])))
    if ev.get("grad_zero_frac") is not None:
        rows.append((say("name-zero-grads"), say("row-zero-grads", share=_pct(ev["grad_zero_frac"]))))
    if ev.get("eval_losses"):
        losses = ", ".join(f"{v:.6f}" for v in ev["eval_losses"])
        rows.append((say("name-evaluation"), say("row-evaluation", losses=losses)))
    if ev.get("collectives_per_rank"):
        counts = ", ".join(f"{say('rank', rank=r)}: {n}" for r, n in enumerate(ev["collectives_per_rank"]))
        rows.append((say("name-collectives"), say("row-collectives", counts=counts)))
    if ev.get("param_norms_per_rank"):
        where = ev.get("ranks_diverge_at_update")
        norms = "; ".join(f"{say('rank', rank=r)}: " + ", ".join(f"{v:.6f}" for v in n)
                          for r, n in enumerate(ev["param_norms_per_rank"]))
        key = "row-parameters-differ" if where else "row-parameters-same"
        rows.append((say("name-parameters"), say(key, norms=norms, update=where)))
    if ev.get("timed_out"):
        rows.append((say("name-hang"), say("row-hang", error=ev.get("hang_error", ""))))
    if ev.get("expert_shares"):
        shares = ev["expert_shares"]
        rows.append((say("name-experts"), say("row-experts", shares=", ".join(_pct(s) for s in shares),
                                              largest=_pct(ev.get("max_expert_share")),
                                              even=_pct(1 / len(shares)))))
    if ev.get("tp_collectives"):
        kinds = ev["tp_collectives"]
        rows.append((say("name-tp"), say("row-tp-collectives", gathers=kinds.get("all_gather", 0),
                                         scatters=kinds.get("reduce_scatter", 0),
                                         reduces=kinds.get("all_reduce", 0))))
    return rows


def read_case(case):
    """A Case, or the catalogue's case of that id (None: drawn from the seed)."""
    return None if case is None else case_by_id(case)


class Attempt:
    """One drill: ``case`` (an id or a Case; None: drawn from ``seed``), ``timer`` seconds (None: no limit),
    ``clock`` for the timer (tests inject one). ``causes`` and ``fixes`` are the choices, shuffled by the seed."""

    def __init__(self, case=None, seed: int = 0, timer: Optional[float] = DEFAULT_LIMIT_S,
                 clock: Callable[[], float] = time.monotonic):
        _check_seed(seed)  # first: the seed shuffles the choices even when the case is named
        if not callable(clock):
            raise ConfigError("clock", clock, "a function returning seconds (time.monotonic)")
        self.case = read_case(case) or draw(seed, 1)[0]
        self.seed = seed
        self.timer = Timer(timer, clock)
        self.causes, self.fixes = options(self.case, seed)
        self.evidence = self.twin = self.row = self.revealed = None
        self.run_s = None

    def cannot_show_here(self) -> str:
        """Why this machine cannot show the case's mistake (``Case.needs_gpu``: a case named by id may be one
        the draw leaves out here), "" when it can: said before the run, not discovered from its evidence."""
        return "" if self.case in runnable() else self.case.needs_gpu

    def run(self, progress: Optional[Callable[[int, int, str], None]] = None) -> dict:
        """Run the case, then (hidden) its healthy twin; start the timer. ``progress(done, total, words)``."""
        t0 = time.perf_counter()
        told = progress or (lambda done, total, words: None)
        told(0, 2, say("running-case"))
        self.evidence = run_case(self.case, "case")
        told(1, 2, say("running-twin"))
        self.twin = run_case(self.case, "twin")
        told(2, 2, say("ready"))
        self.run_s = time.perf_counter() - t0
        self.timer.start()
        return self.evidence

    def time_up(self) -> Optional[dict]:
        """When the time is up and no answer is in: lock the drill, scored as timed out. Returns the row."""
        if self.row is None and self.timer.expired():
            self.timer.stop()
            self.row = score(self.case, None, None, self.timer.elapsed(), self.timer.limit_s)
        return self.row

    def answer(self, cause: Optional[str], fix: Optional[str]) -> dict:
        """Lock in an answer (a cause of ``causes``, a fix of ``fixes``) and score it; a second answer changes
        nothing (the first row is returned)."""
        if self.evidence is None:
            raise ConfigError("answer", cause, "an answer after the drill ran: call run() first")
        if self.time_up() is not None or self.row is not None:
            return self.row
        if cause is not None and cause not in self.causes:
            raise ConfigError("cause", cause, "one of the drill's causes: " + "; ".join(self.causes))
        if fix is not None and fix not in self.fixes:
            raise ConfigError("fix", fix, "one of the drill's fixes: " + "; ".join(self.fixes))
        seconds = self.timer.stop()
        self.row = score(self.case, cause, fix, seconds, self.timer.limit_s)
        return self.row

    def reveal(self, progress=False) -> dict:
        """The learner's fix (none when timed out) against the right fix, measured (``drills.evidence.reveal``;
        ``progress``: True for a progress line, or a function told each run's progress)."""
        if self.row is None:
            raise ConfigError("reveal", None, "an answer first (answer(), or the time running out)")
        if self.revealed is None:
            self.revealed = reveal(self.case, self.row["answer_fix"], case_evidence=self.evidence, progress=progress)
            self.revealed["twin"] = self.twin
        return self.revealed


def device_words() -> str:
    """'cpu (AMD EPYC ...)': the machine a score card was measured on."""
    caps = capabilities("auto")
    return f"{caps.kind} ({caps.name})"


def _not_json(v, where: str):
    """(where, value) of the first value in ``v`` that strict JSON cannot hold (NaN, inf, a non-string
    key, an object), or None."""
    if isinstance(v, float) and not math.isfinite(v):
        return where, v
    if isinstance(v, dict):
        for k, x in v.items():
            found = _not_json(k, where) if not isinstance(k, str) else _not_json(x, f"{where}[{k!r}]")
            if found:
                return found
        return None
    if isinstance(v, (list, tuple)):
        return next((f for i, x in enumerate(v) if (f := _not_json(x, f"{where}[{i}]"))), None)
    return None if v is None or isinstance(v, (str, int, float, bool)) else (where, v)


def _check_card(scorecard) -> dict:
    """A score card (``scoring.card``): a dict whose "drills" are score card rows."""
    drills = scorecard.get("drills") if isinstance(scorecard, dict) else None
    if not isinstance(drills, list):
        raise ConfigError("scorecard", type(scorecard).__name__ if not isinstance(scorecard, dict) else
                          "no 'drills' list", "a score card: a dict from lk.drills.card(rows)")
    for i, r in enumerate(drills):
        check_row(r, f"scorecard['drills'][{i}]")
    return scorecard


def save_card(path, scorecard: dict) -> str:
    """Write the score card (``scoring.card``) as strict JSON (no NaN), atomically; returns the path."""
    _check_card(scorecard)
    found = _not_json(scorecard, "scorecard")
    if found:
        raise ConfigError(found[0], found[1], "finite numbers, strings, booleans, None, lists and dicts (strict JSON)")
    return str(write_atomic(path, json.dumps(scorecard, indent=1, allow_nan=False) + "\n"))


def record(scorecard: dict) -> int:
    """Add each drill of the score card to the kernel's grade log, so ``lk.check.export_csv`` exports it
    (exercise "drill <case id>": passed when cause and fix were right). Returns the rows recorded."""
    _check_card(scorecard)  # every row before the first is recorded: no half-recorded card
    for i, r in enumerate(scorecard["drills"]):
        if not r["case"] or " " in r["case"]:
            raise ConfigError(f"scorecard['drills'][{i}]['case']", r["case"], "a drill case's id (no spaces)")
    for r in scorecard["drills"]:
        mark = {True: say("word-right"), False: say("word-wrong")}
        words = (say("log-timed-out", seconds=f"{r['seconds']:g}") if r["timed_out"] else
                 say("log-scored", cause=mark[r["cause_right"]], fix=mark[r["fix_right"]], seconds=f"{r['seconds']:g}"))
        _core.record_drill(r["case"], r["cause_right"] and r["fix_right"], not r["timed_out"], words)
    return len(scorecard["drills"])


# ``python -m labkit drill``: the drills as text. The evidence is printed, the causes and fixes numbered,
# the answer typed as "CAUSE,FIX" (numbers) -- or given up front with ``--answer`` (once per drill), which is
# how tests and scripts run it -- then the score and the reveal. ``--out`` writes the score card as JSON.
GAUNTLET_N = 10


def parse_answer(text: str, n_causes: int, n_fixes: int) -> tuple:
    """'3,5' (or '3 5') -> (3, 5), each within its list; anything else is a ConfigError naming the answer."""
    parts = text.replace(",", " ").split()
    ok = len(parts) == 2 and all(p.isdigit() for p in parts)
    c, f = (int(parts[0]), int(parts[1])) if ok else (0, 0)
    if not (ok and 1 <= c <= n_causes and 1 <= f <= n_fixes):
        raise ConfigError("answer", text, f"CAUSE,FIX: a cause number 1-{n_causes} and a fix number 1-{n_fixes}, "
                                          "e.g. 3,5")
    return c, f


def check_args(case: Optional[str], seed, timer, gauntlet: bool, n, answers: list) -> None:
    """Every flag, before any run: one line naming the field, the value and what is allowed."""
    if case is not None:
        case_by_id(case)
        if gauntlet:
            raise ConfigError("case", case, "no --case with --gauntlet (the seed draws the gauntlet's cases)")
    _check_seed(seed)
    if isinstance(timer, bool) or not isinstance(timer, (int, float)) or not 0 <= timer <= 86_400:
        raise ConfigError("timer", timer, "seconds from 0 (no time limit) to 86400")
    _check_n(n)
    n_causes, n_fixes = len(dict.fromkeys(c.cause for c in CASES)), len(all_fixes())
    for a in answers:
        parse_answer(a, n_causes, n_fixes)
    if answers and len(answers) != (n if gauntlet else 1):
        raise ConfigError("answer", ";".join(answers), f"one --answer per drill ({n if gauntlet else 1})")


def play(attempt: Attempt, title: str, answer: Optional[str], out: Callable[[str], None],
         read: Callable[[str], str]) -> dict:
    """One drill in text; returns its score card row."""
    limit = attempt.timer.limit_s
    out(f"\n== {title} · {say('limit-none') if limit is None else say('limit-seconds', seconds=f'{limit:g}')}")
    if attempt.cannot_show_here():
        out("   " + say("needs-gpu", why=attempt.cannot_show_here()))
    ev = attempt.run(lambda done, total, words: print(f"  [{done}/{total}] {words}", file=sys.stderr, flush=True))
    w = max(len(k) for k, _ in evidence_rows(ev))
    for k, v in evidence_rows(ev):
        out(f"  {k:<{w}}  {v}")
    out(say("what-is-wrong"))
    for i, c in enumerate(attempt.causes, 1):
        out(f"  {i:>2}. {c}")
    out(say("what-to-change"))
    for i, f in enumerate(attempt.fixes, 1):
        out(f"  {i:>2}. {f}")
    if answer is None:
        try:
            answer = read(say("answer-prompt") + " ")
        except EOFError:
            answer = ""
    try:
        c, f = parse_answer(answer, len(attempt.causes), len(attempt.fixes))
        row = attempt.answer(attempt.causes[c - 1], attempt.fixes[f - 1])
    except ConfigError:
        out("  " + say("answer-unread", answer=repr(answer)))
        attempt.timer.stop()
        row = attempt.answer(None, None)
    out(row_words(row, plain=True))
    # a speed reveal takes 20-45 s: a progress line
    out(say("reveal-line", sentence=attempt.reveal(progress=True)["sentence"]))
    return row


def missed_lines(scorecard: dict) -> list:
    """The card's missed drills as text: the learner's answer beside the right one, and the chapter section
    that teaches each (its heading, and the notebook#anchor a JupyterLab link opens)."""
    if not scorecard.get("missed"):
        return []
    lines = [say("missed-title")]
    for m in scorecard["missed"]:
        yours = say("missed-no-answer") if m["timed_out"] else f"{m['answer_cause']} / {m['answer_fix']}"
        where = f'"{m["heading"]}" ({m["href"]})' if m["heading"] else m["notebook"] or say("missed-no-notebook")
        lines += [f"  {m['index']:>2}. {m['case']}", f"      {say('missed-yours')}: {yours}",
                  f"      {say('missed-right')}: {m['right_cause']} / {m['right_fix']}",
                  f"      {say('missed-where')}: {say('missed-chapter', chapter=m['chapter'])}, {where}"]
    return lines


def main(case=None, seed: int = 0, timer: float = 180.0, gauntlet: bool = False, n: int = GAUNTLET_N,
         answers=(), out_path=None, out: Callable[[str], None] = print, read: Callable[[str], str] = input) -> dict:
    """The drill (or the gauntlet) in a terminal; returns the score card (written to ``out_path`` if given).
    Ctrl-C ends it early: the card of the drills answered so far is still returned and written, marked
    ``"stopped": true``."""
    answers = list(answers or [])
    check_args(case, seed, timer, gauntlet, n, answers)
    limit = None if timer == 0 else float(timer)
    cases = gauntlet_draw(seed, n) if gauntlet else [case_by_id(case) if case else draw(seed, 1)[0]]
    rows, stopped = [], False
    try:
        for i, c in enumerate(cases):
            title = (say("gauntlet-drill", i=i + 1, n=len(cases), seed=seed) if gauntlet else
                     say("single-drill", seed=seed))
            rows.append(play(Attempt(c, seed, limit), title, answers[i] if answers else None, out, read))
    except KeyboardInterrupt:  # Ctrl-C: the drills answered so far keep their card (the one under way is dropped)
        stopped = True
    scorecard = card(rows, seed=seed, limit_s=limit, device=device_words(), stopped=stopped)
    if stopped:
        out("\n" + say("stopped-early", answered=len(rows), drills=len(cases)))
    out(f"\n{say('card-final')}: {card_words(scorecard)}")
    for line in missed_lines(scorecard):
        out(line)
    if out_path:
        out(say("wrote", path=save_card(out_path, scorecard)))
    return scorecard


__all__ = ["Attempt", "evidence_rows", "save_card", "record", "card", "device_words", "main", "play", "missed_lines",
           "parse_answer"]
