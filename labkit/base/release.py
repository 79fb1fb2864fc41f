"""Where this release of labkit is published: written once, here. Everything that points at it is built
from these lines -- the set-up cell that opens every chapter, the "Open in Colab" / "Open in Kaggle"
badges of the course maps, the install line of the README (``python -m labkit.instructor.hosting --write``
fills them in; ``tests/test_hosting.py`` fails when one is out of step) -- and ``setup.py`` reads the
course files' list from here to put the chapters in the wheel. Plain constants and the standard library
only: setup.py reads this file before labkit (or torch) can be imported.

Published or not. Until the repository and the release tag exist, ``PUBLISHED`` is False: no badge and no
install line points at them; the course maps say instead how to run a chapter on Colab or Kaggle from a
wheel you built (uploaded there, then ``LABKIT_SOURCE=<its path>``). A fork that has published its own
copy sets ``LABKIT_REPOSITORY`` (``https://github.com/OWNER/NAME``) and/or ``LABKIT_TAG`` (a tag, or a
40-hex commit to pin it) before ``python -m labkit.instructor.hosting --write``: the links and installs then
point at the fork, and it counts as published.

How a release carries its pin (the set-up cell never installs a mutable tag, which could be moved under
learners who already opened a chapter):
  1. Commit the release's code (call it X) and push it.
  2. Here: ``COMMIT = "<X's 40 hex digits>"`` -- or, for a wheel attached to the release,
     ``WHEEL_URL`` and ``WHEEL_SHA256`` (pip checks the ``#sha256=`` of the URL before installing) --
     and ``UPSTREAM_PUBLISHED = True``; run ``python -m labkit.instructor.hosting --write``; commit (Y).
  3. Tag Y as ``TAG`` and push the tag. The badges open the notebooks at the tag (Y), whose set-up cells
     install X, which cannot move. ``tests/test_release.py`` checks the pin is there and, where the
     network allows, that ``git ls-remote`` finds the tag.
"""
import os
import re

VERSION = "0.1.0"                                         # pyproject.toml reads it (version = attr)

# ---- upstream: edit these lines at a release (see the steps above) ------------------------------------
UPSTREAM_REPOSITORY = "https://github.com/labkit-course/labkit"  # the public repository the badges open
UPSTREAM_TAG = "v" + VERSION                              # the release tag the badges open
UPSTREAM_PUBLISHED = False                                # True once that repository and that tag exist
COMMIT = ""                                               # the commit the set-up cell installs (40 hex)
WHEEL_URL, WHEEL_SHA256 = "", ""                          # or a wheel attached to the release, and its hash

_REPOSITORY = re.compile(r"https://github\.com/[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+")
_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")         # a tag or a commit: never an option, never a URL
_HEX40, _HEX64 = re.compile(r"[0-9a-f]{40}"), re.compile(r"[0-9a-f]{64}")


def settings(environ=None) -> dict:
    """The release as the links see it: {repository, tag, published, source, override, problem}.

    ``LABKIT_REPOSITORY`` / ``LABKIT_TAG`` in ``environ`` (a fork) replace the upstream values and count as
    published; ``source`` is what the set-up cell gives pip -- a pinned commit or a hashed wheel for the
    upstream release, the fork's ref for a fork, "" while unpublished. A malformed override is not used:
    ``problem`` says in one line which variable, its value and what is allowed (``hosting`` refuses to write
    links then); importing labkit never fails on it."""
    env = os.environ if environ is None else environ
    repo, tag = env.get("LABKIT_REPOSITORY", ""), env.get("LABKIT_TAG", "")
    problem = None
    if repo and (not _REPOSITORY.fullmatch(repo.rstrip("/")) or repo.rstrip("/").rsplit("/", 1)[1] in (".", "..")):
        problem = f"LABKIT_REPOSITORY={repo!r}: a GitHub repository address, https://github.com/OWNER/NAME"
    elif tag and not _REF.fullmatch(tag):
        problem = f"LABKIT_TAG={tag!r}: a tag or a commit of the repository (letters, digits, . _ / -; not starting with -)"
    override = bool(repo or tag) and problem is None
    repository = repo.rstrip("/") if override and repo else UPSTREAM_REPOSITORY
    tag = tag if override and tag else UPSTREAM_TAG
    published = override or UPSTREAM_PUBLISHED
    if not published:
        source = ""
    elif override:  # a fork: its ref as given (a 40-hex commit pins it)
        source = f"git+{repository}@{tag}"
    elif WHEEL_URL:
        source = f"labkit @ {WHEEL_URL}#sha256={WHEEL_SHA256}"
    else:
        source = f"git+{repository}@{COMMIT}"
    return {"repository": repository, "tag": tag, "published": published, "source": source, "override": override,
            "problem": problem}


def pin_problem() -> str | None:
    """Why the upstream release is not pinned as step 2 above says, or None (checked by tests/test_release.py)."""
    if not UPSTREAM_PUBLISHED:
        return None
    if WHEEL_URL:
        if not WHEEL_URL.startswith("https://") or not WHEEL_URL.endswith(".whl"):
            return f"WHEEL_URL={WHEEL_URL!r}: an https:// address of a .whl file"
        return None if _HEX64.fullmatch(WHEEL_SHA256) else f"WHEEL_SHA256={WHEEL_SHA256!r}: 64 lower-case hex digits"
    return None if _HEX40.fullmatch(COMMIT) else f"COMMIT={COMMIT!r}: the 40 lower-case hex digits of the release's commit"


_NOW = settings()
REPOSITORY = _NOW["repository"]   # the public repository the badges open
TAG = _NOW["tag"]                 # the tag (or commit) whose notebooks the badges open
PUBLISHED = _NOW["published"]     # False: no badge, no install line points at REPOSITORY
SOURCE = _NOW["source"]           # what `pip install` gets in Colab and Kaggle ("" while unpublished)
OVERRIDE_PROBLEM = _NOW["problem"]

# The course a learner copies out of the package with `labkit course [DIR]`, as paths of the repository
# (the wheel holds them under labkit/coursefiles/): the chapters and their markdown, the Russian edition's (ru/:
# its chapters and labkit's sentences in Russian; not its .po catalogues, a translator's checkout has them) and the
# GPU reference measurements. The instructors' solutions (notebooks/solutions/) stay out.
COURSE_FILES = ("notebooks/*.ipynb", "notebooks/*.md", "notebooks/ru/*.ipynb", "notebooks/ru/*.md", "data/README.md",
                "data/reference/*.json")
