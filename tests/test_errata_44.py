"""Issue 44's errata where a test can tell: the "at work" checkpoint writers agree (both survive a host crash),
the bank quotes the process-group timeouts torch defines, and the skipped-collective answer links its drill."""
import os

import pytest
import torch

from labkit.chapters.longrun import restart, state
from labkit.content import questions as bank


def test_save_latest_syncs_the_file_and_its_folder_like_save_checkpoint(tmp_path, monkeypatch):
    """A process crash cannot leave half a file after os.replace; a host crash can lose the rename (or the
    bytes) unless the file and its folder are fsynced -- which state.save_checkpoint does, and now save_latest."""
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.path.realpath(f"/proc/self/fd/{fd}")), real(fd)))
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    path = str(tmp_path / "latest.pt")
    restart.save_latest(model, opt, 3, path)
    latest = list(synced)
    synced.clear()
    state.save_checkpoint(str(tmp_path / "full.pt"), model, opt, None, None, None, 3)
    assert latest[0].endswith("latest.pt.tmp") and latest[1] == str(tmp_path)  # the file, then its folder
    assert [os.path.dirname(p) if p.endswith(".tmp") else p for p in latest] == \
           [os.path.dirname(p) if p.endswith(".tmp") else p for p in synced]  # the same two syncs as state's
    assert restart.load_latest(model, opt, path) == 3


def _answer(qid):
    return next(q for q in bank.QUESTIONS if q.id == qid).answer


def test_bank_quotes_the_timeouts_torch_defines():
    from torch.distributed.constants import default_pg_nccl_timeout, default_pg_timeout
    if default_pg_nccl_timeout is None:
        pytest.skip("this torch build has no NCCL")
    nccl, gloo = (int(t.total_seconds() // 60) for t in (default_pg_nccl_timeout, default_pg_timeout))
    text = _answer("rank-failure")
    assert f"{nccl} minutes for NCCL" in text and f"{gloo} for gloo" in text


def test_skipped_collective_answer_is_backed_by_the_drill_cell():
    q = next(q for q in bank.QUESTIONS if q.id == "skipped-collective")
    from labkit.drills import case_by_id
    assert case_by_id("rank-skips-collective").teaches in q.tags
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" in q.answer  # what shows per-rank sequence numbers
