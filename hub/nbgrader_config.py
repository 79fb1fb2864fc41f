"""nbgrader's settings for everyone on the hub (copied to <instructor environment>/etc/jupyter/, the nbgrader that
learners fetch and submit with and the instructor grades with). The course folder's own nbgrader_config.py,
written by `python -m labkit assignments --tool nbgrader`, says the same about the course and its timeouts."""
import os

c = get_config()  # noqa: F821 -- nbgrader provides get_config

c.CourseDirectory.course_id = "labkit"
# The exchange: one folder every user can write to (mode 0777); release, fetch, submit and collect go through it.
c.Exchange.root = os.environ.get("LABKIT_EXCHANGE", "/srv/nbgrader/exchange")
# A chapter's cells train small models: a learner's Validate needs the course's 600 s per cell, not nbgrader's 30 s,
c.Execute.timeout = 600
# and a cell's last output may come seconds after its reply on a busy server (nbgrader's 4 s ended Validate there).
c.Execute.iopub_timeout = 60
