"""Learners per hour that ``labkit grade`` grades one chapter at, with ``--jobs 1`` and ``--jobs N`` (issue 49).

    python benchmarks/grade_throughput.py                         # chapter 03, 4 learners, --jobs 1 then 2
    python benchmarks/grade_throughput.py --chapter 06 --learners 6 --jobs 1,2,4

Each learner hands in the course's own chapter with the reference answers put in after each exercise's
placeholder (``labkit.instructor.grading.solution_code``: what the graded builds' solution cells hold). The
class is graded once per ``--jobs`` value by the real command (``python -m labkit grade``, in its short mode, as
grading always runs), timed from outside. One line per run:

    grade_jobs=<N> learners=<L> wall_s=<seconds> learners_per_hour=<L * 3600 / wall_s> points=<got>/<max>

The machine (cores this process may use, CPU model) and its load average are printed first and after each run:
read the figures against them -- on a machine other work shares, the figures are that machine's, that day.
"""
from __future__ import annotations

import argparse
import ast
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from labkit.base import runtime as cpus  # noqa: E402 -- after the checkout is on the path
from labkit.content import pages  # noqa: E402
from labkit.instructor.grading import ANSWERS, exercise_tag, placeholder_end, solution_code  # noqa: E402


def answered(chapter: str) -> dict:
    """The course's chapter ``chapter`` ("03") as a notebook's JSON, every exercise answered with the reference."""
    path = next((ROOT / "notebooks").glob(f"{chapter}_*.ipynb"))
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        tag = exercise_tag(cell) if cell["cell_type"] == "code" else None
        if tag:
            lines = pages.source(cell).splitlines()
            end = placeholder_end(ast.parse("\n".join(lines)), ANSWERS[tag])
            cell["source"] = "\n".join(lines[:end] + [solution_code(tag)] + lines[end:])
    return nb, path.name


def machine() -> str:
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor())
    n, where = cpus.usable()
    return f"{n} cores ({where}), {model}"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chapter", default="03")
    ap.add_argument("--learners", type=int, default=4)
    ap.add_argument("--jobs", default="1,2", help="comma-separated --jobs values, each a run of the whole class")
    ns = ap.parse_args(argv)
    nb, name = answered(ns.chapter)
    print(f"machine: {machine()}; load average {load()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="labkit-throughput-") as tmp:
        subs = Path(tmp) / "subs"
        for i in range(ns.learners):
            (subs / f"learner{i:02d}").mkdir(parents=True)
            (subs / f"learner{i:02d}" / name).write_text(json.dumps(nb, indent=1))
        for jobs in [int(j) for j in ns.jobs.split(",")]:
            out = Path(tmp) / f"out-{jobs}"
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "labkit", "grade", str(subs), str(out),
                                   "--chapters", ns.chapter, "--jobs", str(jobs)],
                                  cwd=ROOT, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            rows = list(csv.DictReader((out / "grades.csv").open())) if (out / "grades.csv").exists() else []
            got, top = sum(float(r["score"]) for r in rows), sum(float(r["max_score"]) for r in rows)
            if done.returncode:
                print(done.stderr[-2000:], file=sys.stderr)
            print(f"grade_jobs={jobs} learners={ns.learners} wall_s={wall:.0f} "
                  f"learners_per_hour={ns.learners * 3600 / wall:.0f} points={got:g}/{top:g} "
                  f"rc={done.returncode}; load average after: {load()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
