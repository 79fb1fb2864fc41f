"""The instructor's tools, apart from what a learner loads: ``import labkit``, ``lk.course``,
``lk.check``, the chapters, the panel, the drills and the quiz never import this package
(tests/test_instructor_apart.py).

    python -m labkit assignments --tool nbgrader|otter   # the graded builds: assignments
    python -m labkit grade SUBMISSIONS OUT               # a class graded without a tool: classgrade, gradebox
    python -m labkit.instructor.cheatsheet --write       # notebooks/cheatsheet.md
    python -m labkit.instructor.schedule --write         # notebooks/README.md's grade table and schedules
    python -m labkit.instructor.hosting --write          # the set-up cells, badges and course maps

``grading`` holds what every grading path reads: the points per checker, the reference answers, the
exercise cells every build fills in; and it writes Gradescope's results file. The words of the
generated files are in labkit/content/templates/ (read by ``labkit.content.pages``, which the quiz
shares).
"""
