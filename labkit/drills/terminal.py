"""``python -m labkit drill``: the drills as text. The evidence is printed, the causes and fixes numbered,
the answer typed as "CAUSE,FIX" (numbers) -- or given up front with ``--answer`` (once per drill), which is
how tests and scripts run it -- then the score and the reveal. ``--out`` writes the score card as JSON.
"""
from __future__ import annotations

import sys
from typing import Callable, Optional

from ..base.errors import ConfigError
from .attempt import Attempt, device_words, evidence_rows, save_card
from .cases import CASES, PAGE
from .evidence import case_by_id
from .scoring import all_fixes, card, card_words, draw, gauntlet_draw, row_words

GAUNTLET_N = 10
say = PAGE.say


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
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError("seed", seed, "an integer >= 0")
    if isinstance(timer, bool) or not isinstance(timer, (int, float)) or not 0 <= timer <= 86_400:
        raise ConfigError("timer", timer, "seconds from 0 (no time limit) to 86400")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 100:
        raise ConfigError("n", n, "an integer from 1 to 100 (drills in the gauntlet)")
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
    out("Reveal: " + attempt.reveal(progress=True)["sentence"])  # a speed reveal takes 20-45 s: a progress line
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
