"""Chapter 11's opening sentence (taught in chapter 11): where its processes run and what they write. Each
part's own sentences live beside its part (``notes_exact``, ``notes_dcp``, ``notes_failure``).

    display(lr.notes.chapter_note(env, size))
"""
from __future__ import annotations

from ..course import Note, mode_words
from ..parallel.notes import backend, why_gloo


def chapter_note(env: dict, size: dict) -> Note:
    """Where the chapter's processes run, where its checkpoints go, and the mode."""
    ws = size["world_size"]
    if backend(ws) == "nccl":
        where = f"{ws} processes, one per GPU, over NCCL"
    else:
        where = f"{ws} CPU processes over gloo on the loopback interface ({why_gloo(ws)})"
    return Note(f"Model `{size['model']}`, micro-batch {size['micro_batch']}; the distributed demos start {where}. "
                "Every checkpoint is written to a temporary folder that the demo removes when it ends; a resumed "
                f"leg always runs in a new process, which never saw the first half of the run. {mode_words()}.")
