"""labkit.chapters.ddplab: DDP's buffer broadcasts counted on two real gloo processes -- the counts are what
torch does (two independent witnesses agree with the rule read from DistributedDataParallel's source),
and nothing outlives the measurement."""
import glob
import inspect
import os
import tempfile

import pytest
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit.chapters import ddplab
from labkit.engine.config import PRESETS
from labkit.engine.ddp import RunError


def torch_rule(mode: str, accum: int, updates: int) -> list:
    """[update, micro-step] pairs whose forward broadcasts buffers, by the rule in torch's DDP:
    broadcast when buffer sync is on and the previous forward ran with gradient sync on (it is on
    before the first forward); a forward inside no_sync() turns it off for the next one."""
    on, previous_synced, out = mode != "sync_off", True, []
    for u in range(updates):
        for k in range(accum):
            if on and previous_synced:
                out.append([u, k])
            previous_synced = not (mode == "no_sync" and k < accum - 1)
    return out


def _store_dirs():
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "labkit-ddplab-*")))


def test_buffer_broadcasts_are_what_torch_does(no_leftover_processes):
    before = _store_dirs()
    K, U = 4, 2
    r = ddplab.buffer_sync_counts(accum=K, updates=U)
    assert _store_dirs() == before  # the FileStore's private folder is gone
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        assert r["flag"] == "forward_sync_buffers"  # torch >= 2.13: broadcast_buffers is deprecated
    assert r["flag_default"] is True
    assert "body.1.running_mean" in r["buffers"] and "marker" in r["buffers"]
    for mode in ddplab.MODES:
        m = r["modes"][mode]
        want = torch_rule(mode, K, U)
        assert m["synced_micro_steps"] == want, mode  # the effect: rank 1 saw rank 0's marker
        assert m["broadcasts"] == m["broadcasts_rank1"] == m["seen"] == len(want), mode  # the calls
        assert m["at_wrap"] == 1  # DDP's one-off broadcast when it wraps the model, counted apart
    assert r["modes"]["no_sync"]["per_update"] == 1.0
    assert r["modes"]["every_micro"]["per_update"] == K
    assert r["modes"]["sync_off"]["per_update"] == 0
    assert ddplab.pattern(r, "no_sync") == "B... | B..."
    assert ddplab.pattern(r, "every_micro") == "BBBB | BBBB"


def test_a_measurement_that_runs_out_of_time_leaves_nothing(no_leftover_processes):
    before = _store_dirs()
    with pytest.raises(RunError, match="no result after"):
        ddplab.buffer_sync_counts(timeout_s=0.05)  # the ranks are still importing torch
    assert _store_dirs() == before


@pytest.mark.parametrize("kw", [dict(accum=0), dict(updates=0), dict(world_size=1), dict(accum=2.5)])
def test_bad_arguments_are_named(kw):
    (name, value), = kw.items()
    with pytest.raises(ValueError, match=name):
        ddplab.buffer_sync_counts(**kw)


@pytest.mark.parametrize("model", sorted(PRESETS))
def test_labkits_gpt_has_no_buffers(model):
    # so labkit's own DDP runs make none of these broadcasts: only gradients travel
    assert ddplab.gpt_buffers(model) == []


def test_the_rule_helper_matches_the_chapter_counts():
    assert len(torch_rule("no_sync", 4, 3)) == 3 and len(torch_rule("every_micro", 4, 3)) == 12
