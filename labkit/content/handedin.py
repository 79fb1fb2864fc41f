"""What a class handed in, as ``labkit grade`` finds it: one folder per learner under SUBMISSIONS, in each the
chapters' notebooks -- under their own names or as Jupyter's Duplicate, a browser's second download or a learner's
own prefix make them. Whatever is not graded is said, never skipped silently."""
from __future__ import annotations

import re
from pathlib import Path

from ..base.errors import ConfigError

NUMBERED = re.compile(r"^(\d\d)[_ -]")  # a notebook named from its chapter's number: 03_..., 03 ..., 03-...


def _learners(submissions: Path, say) -> list:
    """The learners' folders; what else SUBMISSIONS holds is said, never skipped silently."""
    if not submissions.is_dir():
        raise ConfigError("submissions", str(submissions), "a folder holding one folder per learner")
    folders = []
    for p in sorted(submissions.iterdir()):
        if p.name.startswith("."):
            say(f"not graded: {p.name}: a hidden name (rename it without the dot to grade it)")
        elif p.is_symlink():
            say(f"not graded: {p.name}: a symbolic link (hand in the folder itself)")
        elif not p.is_dir():
            say(f"not graded: {p.name}: not a folder (SUBMISSIONS holds one folder per learner)")
        else:
            folders.append(p)
    if not folders:
        raise ConfigError("submissions", str(submissions), "a folder holding one folder per learner (it has none)")
    return folders


def chapter_of(name: str, stems: dict):
    """The chapter number a submitted notebook's file name stands for, or None (none, or two). Besides the
    chapter's own name, what Jupyter's Duplicate and a browser's second download make of it
    (``03_gradient_accumulation-Copy1.ipynb``, ``03_gradient_accumulation (1).ipynb``) and a learner's own prefix
    (``alice_03_gradient_accumulation.ipynb``): the chapter's name inside it, or its number and a separator first."""
    if not name.endswith(".ipynb") or name.startswith("."):
        return None
    low = name.lower()
    found = {n for n, stem in stems.items() if stem.lower() in low}
    numbered = NUMBERED.match(name)
    if numbered and numbered.group(1) in stems:
        found.add(numbered.group(1))
    return found.pop() if len(found) == 1 else None


def _handed_in(folder: Path, stems: dict, wanted, say) -> dict:
    """{chapter number: [the learner's notebooks for it]} for the course's chapters. A notebook named after no
    chapter, or after two, is said (with the folder's own, a subfolder, and nothing at all handed in)."""
    out, other = {}, []
    for path in sorted(folder.iterdir()):
        if path.is_dir() and not path.name.startswith("."):
            other.append(f"{path.name}/ (a subfolder: put the notebook itself in {folder.name}/)")
            continue
        if not path.name.endswith(".ipynb"):
            continue
        number = chapter_of(path.name, stems)
        if number is None:
            other.append(f"{path.name} (name it as the course's chapter, NN_name.ipynb)")
        elif wanted is None or number in wanted:
            out.setdefault(number, []).append(path)
    for what in other:
        say(f"not graded: {folder.name}/{what}")
    for number, paths in out.items():
        if len(paths) == 1 and paths[0].name != f"{stems[number]}.ipynb":
            say(f"{folder.name}: {paths[0].name} graded as chapter {number} (the only notebook for it)")
    if not out:
        say(f"not graded: {folder.name}: no notebook for "
            f"{'chapter ' + ', '.join(sorted(wanted)) if wanted else 'any chapter of the course'}")
    return out
