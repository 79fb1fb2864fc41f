"""benchmarks/lost_sentences.py on tiny git repos made here: a sentence moved from labkit's Python into a
notebook's markdown is kept, a reworded one is reworded, a deleted one is gone (with where it was)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

SPEC = importlib.util.spec_from_file_location(
    "lost_sentences", Path(__file__).resolve().parent.parent / "benchmarks" / "lost_sentences.py")
lost = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(lost)

MOVED = "The loader waits on the disk far more than the model waits on it."
REWORDED = "Checkpointing trades one more forward pass for the memory of the activations."
NOW = "Checkpointing trades one extra forward pass for the memory of the activations."
DELETED = "A bigger batch hides the launch overhead behind more arithmetic per kernel."
SHORT = "Too short to count."


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _commit(repo, files: dict, msg: str) -> None:
    for name, text in files.items():
        p = repo / name
        if text is None:
            p.unlink()
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", msg)


def _notebook(*cells) -> str:
    return json.dumps({"cells": [{"id": cid, "cell_type": kind, "metadata": {}, "source": [src]}
                                 for cid, kind, src in cells], "metadata": {}, "nbformat": 4,
                       "nbformat_minor": 5})


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "course"
    repo.mkdir()
    _git(repo, "init", "-q")
    _commit(repo, {
        "labkit/notes.py": f'"""A docstring is not read by a learner, five words at least."""\n'
                           f'def note(ms):\n    return f"{MOVED} It took {{ms}} ms."\n',
        "labkit/templates/page.md": f"# A page\n\n{REWORDED}\n",
        "notebooks/01_x.ipynb": _notebook(("c1", "markdown", f"{DELETED} {SHORT}"),
                                          ("c2", "code", '%time\nprint("one two three four five six")')),
    }, "base")
    _commit(repo, {
        "labkit/notes.py": None,
        "labkit/templates/page.md": f"# A page\n\n{NOW}\n",
        "notebooks/01_x.ipynb": _notebook(("c1", "markdown", f"{MOVED}\n\n{SHORT}"),
                                          ("c2", "code", 'print(f"It took {ms} ms. one two three four five six")')),
    }, "head")
    return repo


def test_moved_reworded_and_deleted_sentences(tmp_path):
    repo = _repo(tmp_path)
    result = lost.compare(repo, "HEAD~1", "HEAD")
    gone = {g["sentence"]: g["where"] for g in result["gone"]}
    reworded = {r["sentence"]: r["now"] for r in result["reworded"]}
    assert gone == {lost.normalise(DELETED): ["notebooks/01_x.ipynb cell c1"]}
    assert reworded == {lost.normalise(REWORDED): lost.normalise(NOW)}
    # base: MOVED, "It took {} ms.", REWORDED, DELETED, "one two ... six" of >= 5 words (the docstring not)
    assert result["summary"] == {"at_base": 4, "at_head": 3, "kept": 2, "reworded": 1, "gone": 1}


def test_working_tree_is_the_default_head(tmp_path):
    repo = _repo(tmp_path)
    (repo / "notebooks" / "02_y.md").write_text(DELETED.replace("bigger", "*bigger*") + "\n", encoding="utf-8")
    result = lost.compare(repo, "HEAD~1")
    assert result["head"] == "working tree"
    assert result["summary"]["gone"] == 0 and result["summary"]["kept"] == 3


def test_normalise_holes_and_markdown():
    assert lost.normalise("The **step** took `{ms}` ms.") == lost.normalise("the step took {t} ms.")
    assert lost.normalise("[A link](http://x) to _here_") == "a link to here"
    strings = [s for s, _ in lost.python_strings('x = f"took {a:.1f} ms in all"\n')]
    assert strings == ["took {} ms in all"]


def test_a_gone_sentence_says_where_its_words_went(tmp_path):
    repo = tmp_path / "course"
    repo.mkdir()
    _git(repo, "init", "-q")
    _commit(repo, {"notebooks/a.md": "Pinned memory lets the copy engine overlap transfers with compute kernels.\n"},
            "base")
    _commit(repo, {"notebooks/a.md": "# Copies\n\nCompute kernels overlap transfers, with memory pinned.\n"
                                     "The copy engine needs it.\n"}, "head")
    gone = lost.compare(repo, "HEAD~1", "HEAD")["gone"]
    assert len(gone) == 1 and gone[0]["words_at"] == "notebooks/a.md"
    assert gone[0]["words_found"] == 0.89  # all but "lets" (8 of 9 content words)


def test_html_comments_are_not_read():
    assert lost.texts("notebooks/a.md", "Seen by a learner here.\n<!-- a note for the teacher, never shown -->\n") \
        == [("Seen by a learner here.\n\n", "")]
