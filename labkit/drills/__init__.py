"""Interview drills: a run's telemetry, a hidden mistake (or none), and the cause to name.

    import labkit as lk
    case = lk.drills.CASES[0]
    lk.drills.run_case(case, "case")   # its evidence: what a real engineer's tools would show
    lk.drills.run_case(case, "twin")   # the same run with the mistake taken out

``CASES`` is the catalogue (``cases.py``), ``CAUSES`` its distinct causes (the multiple choice),
``evidence`` what a drill shows of a run, and ``mistakes`` the code-level mistakes' plain-torch loops.
"""
from .cases import CASES, HEALTHY, Case
from .evidence import case_by_id, config_for, evidence, run_case

CAUSES = tuple(dict.fromkeys(c.cause for c in CASES))

__all__ = ["CASES", "CAUSES", "HEALTHY", "Case", "evidence", "run_case", "case_by_id", "config_for"]
