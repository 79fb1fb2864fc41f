"""The wheel carries the course: the chapters, their markdown and the GPU reference measurements
(``COURSE_FILES`` in labkit/base/release.py, the one list) land in labkit/coursefiles/, where
`labkit course DIR` copies them from. The instructors' solutions stay out. Everything else is in
pyproject.toml."""
import runpy
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
COURSE_FILES = runpy.run_path(str(HERE / "labkit" / "base" / "release.py"))["COURSE_FILES"]


class build_py_with_course(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's own files
        dest = Path(self.build_lib) / "labkit" / "coursefiles"
        for pattern in COURSE_FILES:
            for f in sorted(HERE.glob(pattern)):
                target = dest / f.relative_to(HERE)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, target)


setup(cmdclass={"build_py": build_py_with_course})
