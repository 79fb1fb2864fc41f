"""How long the real grading tools take on one submission of each chapter (issue 32), on this machine.

    python benchmarks/grading.py                       # both tools, every chapter
    python benchmarks/grading.py --tool otter --chapters 00,03

For each chapter the submission is the reference answers (the graded build's own solution notebook):
nbgrader -- ``python -m labkit assignments --tool nbgrader``, ``nbgrader generate_assignment``, then the
timed ``nbgrader autograde`` of that one submission; otter -- ``python -m labkit assignments --tool otter``,
``otter assign``, then the timed ``otter run``. The chapters run in their short mode (grading implies it). The
measured exercises (01, 05, 07, 08, 09) score 0 here: no learner saved a measurement file (that is tested in
tests/test_assignments.py with LABKIT_GRADE_ALL=1). One line per chapter and tool:

    grade_s_<tool>_<NN>=<seconds> score=<points>/<max>

then ``grade_s_<tool>_total=<seconds>``. The machine's load is printed first and last: read the figures
against it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from labkit.instructor import assignments, grading  # noqa: E402


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "LABKIT_MODE": os.environ.get("LABKIT_MODE", "short"),
            "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}


def _call(args, cwd) -> None:
    done = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[:3])} failed:\n{done.stdout[-1500:]}\n{done.stderr[-2500:]}")


def nbgrader_one(name: str, work: Path) -> tuple:
    course = work / "nbgrader"
    assignments.build_nbgrader(course, [name[:2]])
    _call(["nbgrader", "generate_assignment", name, "--force"], course)
    dest = course / "submitted" / "ref" / name
    dest.mkdir(parents=True)
    shutil.copy(course / "source" / name / f"{name}.ipynb", dest / f"{name}.ipynb")
    t0 = time.perf_counter()
    _call(["nbgrader", "autograde", name, "--force"], course)
    seconds = time.perf_counter() - t0
    from nbgrader.api import Gradebook  # deferred: only the nbgrader half needs it

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        nb = gb.find_submission_notebook(name, name, "ref")
        return seconds, nb.score, nb.max_score


def otter_one(name: str, work: Path) -> tuple:
    out = work / "otter"
    assignments.build_otter(out, [name[:2]])
    dist = out / name / "dist"
    _call(["otter", "assign", "--no-run-tests", str(out / name / f"{name}.ipynb"), str(dist)], out / name)
    zip_path = next((dist / "autograder").glob("*.zip"))
    sub = work / "otter-submission"
    sub.mkdir()
    shutil.copy(dist / "autograder" / f"{name}.ipynb", sub / f"{name}.ipynb")  # the reference answers
    t0 = time.perf_counter()
    _call(["otter", "run", "--no-logo", "-a", str(zip_path), "-o", str(sub), str(sub / f"{name}.ipynb")], sub)
    seconds = time.perf_counter() - t0
    results = json.loads((sub / "results.json").read_text())
    return seconds, sum(t["score"] for t in results["tests"]), sum(t["max_score"] for t in results["tests"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", choices=("nbgrader", "otter", "both"), default="both")
    ap.add_argument("--chapters", default=None, help="e.g. 00,03 (default: every chapter)")
    ns = ap.parse_args(argv)
    chapters = [p.stem for p in grading.chapter_paths(ns.chapters.split(",") if ns.chapters else None)]
    tools = ("nbgrader", "otter") if ns.tool == "both" else (ns.tool,)
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    for tool in tools:
        total = 0.0
        for name in chapters:
            with tempfile.TemporaryDirectory() as tmp:
                seconds, got, most = (nbgrader_one if tool == "nbgrader" else otter_one)(name, Path(tmp))
            total += seconds
            print(f"grade_s_{tool}_{name[:2]}={seconds:.1f} score={got:g}/{most:g}", flush=True)
        print(f"grade_s_{tool}_total={total:.1f}", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
