"""Interview drills: a run's telemetry, a hidden mistake (or none), and the cause to name.

    import labkit as lk
    lk.drills.Drill(seed=0)            # one drill in a notebook: Start, answer against the clock, Reveal
    lk.drills.Gauntlet(seed=0, n=10)   # ten in a row and a score card (save(path), export())
    python -m labkit drill --seed 0    # the same in a terminal (--gauntlet, --answer C,F, --out card.json)

``CASES`` is the catalogue and ``bank`` the page it is read with (and each case's fix key and chapter section),
``CAUSES`` its distinct causes (the multiple choice), ``evidence`` what a drill shows of a run and the reveal (the
learner's fix against the right one), ``mistakes`` the code-level mistakes' plain-torch loops, ``attempt`` the rules
(draw, options, Timer, score, card) and ``Attempt``, one drill as plain code (the widget and the command line are thin
layers over it). What a learner reads is ``notebooks/interview_drills.md`` (``python -m labkit.drills`` checks it).
"""
from .bank import CASES, HEALTHY, NO_FIX, Case, all_fixes, fix_key, where_taught
from .evidence import case_by_id, config_for, evidence, evidence_rows, reveal, run_case
from .attempt import Attempt, Timer, card, draw, gauntlet_draw, options, record, save_card, score

CAUSES = tuple(dict.fromkeys(c.cause for c in CASES))


def __getattr__(name):
    if name in ("Drill", "Gauntlet"):
        from . import widget  # deferred: ipywidgets is optional; the CLI runs without it

        return getattr(widget, name)
    raise AttributeError(f"module 'labkit.drills' has no attribute {name!r}")


__all__ = ["CASES", "CAUSES", "HEALTHY", "Case", "evidence", "run_case", "case_by_id", "config_for", "Drill",
           "Gauntlet", "Attempt", "score", "Timer", "draw", "options", "fix_key", "all_fixes", "card", "reveal",
           "evidence_rows", "record", "save_card", "NO_FIX", "gauntlet_draw", "where_taught"]
