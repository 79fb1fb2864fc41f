"""Where this release of labkit is published: written once, here. Everything that points at it is built
from these lines -- the set-up cell that opens every chapter, the "Open in Colab" / "Open in Kaggle"
badges of the course maps, the install line of the README (``python -m labkit.content.hosting --write``
fills them in; ``tests/test_hosting.py`` fails when one is out of step) -- and ``setup.py`` reads the
course files' list from here to put the chapters in the wheel. Plain constants, no imports: setup.py
reads this file before labkit (or torch) can be imported.
"""

VERSION = "0.1.0"                                     # pyproject.toml reads it (version = attr)
REPOSITORY = "https://github.com/labkit-course/labkit"  # the public repository the badges open
TAG = "v" + VERSION                                   # the release tag the set-up cell installs
SOURCE = "git+" + REPOSITORY + "@" + TAG              # what `pip install` gets in Colab and Kaggle

# The course a learner copies out of the package with `labkit course [DIR]`, as paths of the repository
# (the wheel holds them under labkit/coursefiles/): the chapters and their markdown, and the GPU reference
# measurements. The instructors' solutions (notebooks/solutions/) stay out.
COURSE_FILES = ("notebooks/*.ipynb", "notebooks/*.md", "data/README.md", "data/reference/*.json")
