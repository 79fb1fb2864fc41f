"""The instructor's tools stay out of a learner's session: ``import labkit``, the notebooks' short names
(``lk.course``, ``lk.quiz``, ``lk.drills``, ``lk.check``, ...), every chapter module and the panel load no
``labkit.instructor`` module, while the CLI still offers the instructor's commands (it imports them lazily)."""
import subprocess
import sys

LEARNER = """
import pkgutil, importlib, sys
import labkit as lk
for name in sorted(lk.SHORT):
    getattr(lk, name)
lk.Lab
import labkit.chapters as chapters
for m in pkgutil.walk_packages(chapters.__path__, "labkit.chapters."):
    importlib.import_module(m.name)
lk.quiz.quiz("precision")
print("\\n".join(sorted(m for m in sys.modules if m.startswith("labkit"))))
"""


def _loaded(code: str) -> list:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split()


def test_a_learners_session_loads_no_instructor_module():
    loaded = _loaded(LEARNER)
    assert {"labkit.chapters.course", "labkit.content.quiz", "labkit.drills", "labkit.check", "labkit.panel.lab"} \
        <= set(loaded)  # the names were touched for real
    assert not [m for m in loaded if m.startswith("labkit.instructor")]


def test_the_cli_loads_the_instructor_only_in_its_commands():
    out = subprocess.run([sys.executable, "-m", "labkit", "--help"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "assignments" in out.stdout and "grade" in out.stdout, out.stderr
    loaded = _loaded("import sys, labkit.__main__\n"
                     "assert not [m for m in sys.modules if m.startswith('labkit.instructor')]\n"
                     "from labkit.instructor import assignments, classgrade, cheatsheet, schedule, hosting\n"
                     "print(*sys.modules)")
    assert "labkit.instructor.classgrade" in loaded and "labkit.instructor.grading" in loaded
