"""labkit.chapters.ch06_ddp: DDP's buffer broadcasts counted on two real gloo processes -- the counts are what
torch does (two independent witnesses agree with the rule read from DistributedDataParallel's source),
and nothing outlives the measurement."""
import glob
import inspect
import os
import tempfile

import pytest
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit.base.runtime import ConfigError
from labkit.chapters import ch06_ddp as ddplab
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


# ---- chapter 06's measurements as rows and verdict names (issue 47: the words are in the chapter) -------------

def _summary(calls, nbytes, **kw):
    return dict(allreduce_calls_per_update=calls, allreduce_bytes_per_update=nbytes, grad_bytes=2**20, **kw)


SWEEP = {(sync, k): _summary(3 * (k if sync == "every_micro" else 1), 2**20 * (k if sync == "every_micro" else 1))
         for sync in ("no_sync", "every_micro") for k in (1, 2, 4, 8)}


def test_the_sync_sweep_rows_come_from_the_sweep():
    rows = ddplab.sweep_rows(SWEEP)
    assert [r["K"] for r in rows] == [1, 2, 4, 8]
    top = rows[-1]
    assert (top["no_sync_calls"], top["every_micro_calls"], top["calls_ratio"]) == (3, 24, 8)
    assert (top["no_sync_mib"], top["every_micro_mib"]) == (1.0, 8.0)
    assert (rows[2]["no_sync_per_grad"], rows[2]["every_micro_per_grad"]) == (1.0, 4.0)
    assert len(ddplab.plot_sync_sweep(SWEEP).axes[0].lines) == 2
    with pytest.raises(ConfigError, match="sweep"):
        ddplab.sweep_rows({"no_sync": 1})


def test_the_exact_rows_name_both_arms_and_their_ratio():
    from types import SimpleNamespace as NS

    res = [NS(summary={"final_loss": 4.0})]
    cmp = NS(label_a="no_sync", label_b="every_micro", results_a=res, results_b=res,
             exact={"allreduce_calls_per_update": (3, 12), "allreduce_bytes_per_update": (2**20, 4 * 2**20)})
    a, b = ddplab.exact_rows(cmp)
    assert (a["loop"], a["calls"], a["mib"], a["calls_ratio"]) == ("no_sync", 3, 1.0, 1.0)
    assert (b["loop"], b["calls"], b["mib"], b["calls_ratio"], b["final_loss"]) == ("every_micro", 12, 4.0, 4.0, 4.0)
    with pytest.raises(ConfigError, match="allreduce_calls_per_update"):
        ddplab.exact_rows(NS(**{**vars(cmp), "exact": {"allreduce_calls_per_update": 3}}))


def _bs(no_sync_per_update=1, broadcasts_off=0):
    modes = {"no_sync": dict(seen=3 * no_sync_per_update, per_update=no_sync_per_update,
                             broadcasts=3 * no_sync_per_update,
                             synced_micro_steps=[[u, k] for u in range(3) for k in range(no_sync_per_update)]),
             "every_micro": dict(seen=12, per_update=4, broadcasts=12,
                                 synced_micro_steps=[[u, k] for u in range(3) for k in range(4)]),
             "sync_off": dict(seen=0, per_update=0, broadcasts=broadcasts_off, synced_micro_steps=[])}
    return dict(modes=modes, accum=4, updates=3, flag="forward_sync_buffers", flag_default=True,
                buffers=["marker"], torch_version="2.x")


def test_the_buffer_rows_and_rhythm_come_from_the_counts():
    rows = ddplab.buffer_rows(_bs())
    assert [r["pattern"] for r in rows] == ["B... | B... | B...", "BBBB | BBBB | BBBB", ".... | .... | ...."]
    assert ddplab.buffer_rhythm(_bs()) == "gradient_rhythm"
    assert ddplab.buffer_rhythm(_bs(no_sync_per_update=2)) == "other_rhythm"
    assert ddplab.buffer_rhythm(_bs(broadcasts_off=5)) == "counts_disagree"  # two witnesses that differ
    assert ddplab.gpt_buffers("tiny") == []  # the chapter's "no buffers" sentence follows from this
    with pytest.raises(ConfigError, match="bs"):
        ddplab.buffer_rows({})


def test_the_reference_table_is_none_without_shipped_points_so_no_empty_output_shows(monkeypatch):
    from labkit.tools import reference

    monkeypatch.setattr(reference, "points", lambda section=None: [])
    assert ddplab.reference_table() is None  # issue 46.19: a cell ending with it shows nothing
    pts = [dict(status="ok", label="H200 K=4", summary=dict(allreduce_calls_per_update=7, step_time_s=0.05))]
    monkeypatch.setattr(reference, "points", lambda section=None: pts if section == "ddp" else [])
    table = ddplab.reference_table()
    assert table[0] == {"label": "H200 K=4", "calls": 7, "ms": 50.0} and "| H200 K=4 | 7 | 50.0 |" in \
        table._repr_markdown_()


def test_the_buffer_switchs_torch_versions_are_a_range_not_a_stale_version():
    # issue 46.8: "torch 2.13" while the course runs on 2.14.1 -- the chapter says a range, the cell asks torch
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "06_ddp_allreduce.ipynb").read_text())
    text = "\n".join("".join(c["source"]) for c in nb["cells"])
    assert "In torch 2.13" not in text and "in torch 2.13" not in text
    assert "From torch 2.13 on" in text and "bs[\"torch_version\"]" in text and "bs[\"flag\"]" in text
    assert ddplab.sync_flag() in ("forward_sync_buffers", "broadcast_buffers")
