"""Chapter 11, part "exact" (labkit.chapters.ch11_longrun.state / exact): N updates straight against
N/2 + save + a fresh process + load + N/2, bit for bit; each checkpoint item left out makes the runs part where
its mechanism says; the RNG state and the sampler's position round-trip; damaged and foreign checkpoints are
one line; bad arguments are refused before any process starts; no process outlives the demo.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import random

import numpy as np
import pytest
import torch

from labkit.base.runtime import ConfigError, RunError
from labkit.chapters import ch11_longrun as lr
from labkit.engine.config import PRESETS
from labkit.engine.launch import live_children
from labkit.engine.model import GPT

st = rs = lr.state  # the checkpoint and the loader's position: one module


@pytest.fixture(scope="module")
def demo():
    r = lr.exact.resume_demo("tiny", micro_batch=4, updates=8, workers=1)
    return r, live_children()


def test_items_are_the_contracted_vocabulary():
    assert st.ITEMS == ("model", "optimizer", "scheduler", "scaler", "rng", "loader")


def test_resumed_run_is_the_straight_run_bit_for_bit(demo):
    r, _ = demo
    assert r.precision == "fp16" and r.workers == 1 and r.resume_at == 4
    assert r.straight.losses[4:] == r.resumed.losses and r.straight.losses[:4] == r.first_half.losses
    assert r.losses_equal and r.params_equal and r.tensors == r.tensors_equal == len(r.straight_params)
    assert all(torch.equal(r.straight_params[k], r.resumed_params[k]) for k in r.straight_params)
    assert r.max_param_diff == 0.0
    assert r.straight.digests[4:] == r.resumed.digests  # equal weights after every resumed update
    assert r.checkpoint_bytes > 0 and r.save_s > 0


def test_loader_position_counts_what_the_loop_consumed_not_what_was_prefetched(demo):
    r, _ = demo
    pos = r.saved_position
    assert pos["consumed"] == 4 * r.micro_batch and pos["epoch"] == 0
    assert pos["yielded"] > pos["consumed"]  # the worker was loading batches ahead of the loop
    assert r.batches_per_epoch > r.resume_at  # the resumed sampler crossed an epoch boundary


def test_each_missing_item_makes_the_runs_part_where_its_mechanism_says(demo):
    r, _ = demo
    h = r.resume_at
    assert tuple(r.ablation) == lr.exact.ABLATED == ("optimizer", "scheduler", "scaler", "rng", "loader")
    for item, a in r.ablation.items():
        assert a.first_param_diff is not None and a.max_param_diff > 0, item
        assert a.first_loss_diff is not None, item
    ab = r.ablation
    # data and masks: the very first resumed loss differs
    assert ab["rng"].first_loss_diff == h + 1 and ab["loader"].first_loss_diff == h + 1
    assert ab["loader"].batches[0] == r.straight.batches[0]  # epoch 0 replayed from its first batch
    assert ab["rng"].batches == r.straight.batches[h:]  # same data: only the masks changed
    # Adam's zeroed moments: the first resumed update is different, its loss shows it one update later
    assert ab["optimizer"].first_param_diff == h + 1 and ab["optimizer"].first_loss_diff == h + 2
    # the optimizer's param_groups carry the current lr: the first resumed update is still right
    assert ab["scheduler"].lrs[0] == r.straight.lrs[h] and ab["scheduler"].lrs[1] != r.straight.lrs[h + 1]
    assert ab["scheduler"].first_param_diff == h + 2
    # a fresh GradScaler starts at its initial scale, not the grown one
    assert ab["scaler"].scales[0] == 2.0 ** 16 < r.straight.scales[h]
    # the rows the chapter draws carry each item's signature, read from the same measurement
    rows = {row["item"]: row for row in lr.exact.ablation_rows(r)}
    assert rows["loader"]["batch_of"] == 1 and rows["rng"]["batch_of"] == h + 1  # replayed / the right batch
    assert rows["scheduler"]["lr_differs"] == h + 2 and rows["rng"]["lr_differs"] is None
    assert rows["scaler"]["scale"] == 2.0 ** 16 and rows[None]["scale"] == r.straight.scales[h]
    assert rows["optimizer"]["weights"] == h + 1 and rows["optimizer"]["loss"] == h + 2
    assert rows[None]["weights"] is None and rows[None]["loss"] is None and rows[None]["max_diff"] == 0.0
    assert lr.exact.needed_items(r) == set(lr.exact.ABLATED) | {"model"}


def test_the_loss_table_and_the_loader_position_the_chapter_draws(demo):
    r, _ = demo
    h = r.resume_at
    rows = lr.exact.resume_rows(r)
    assert [row["update"] for row in rows] == list(range(1, r.updates + 1)) and all(row["equal"] for row in rows)
    assert [row["update"] for row in rows if row["first"]] == [h + 1]
    assert {row["leg"] for row in rows if row["update"] <= h} == {"first half"}
    pos = lr.exact.position(r)
    assert pos["ahead"] == pos["yielded"] - pos["consumed"] > 0 and pos["ahead_batches"] == pos["ahead"] // 4
    legs = lr.exact.leg_rows(r)
    assert [leg["updates"] for leg in legs] == [(1, r.updates), (1, h), (h + 1, r.updates)]


def test_no_process_outlives_the_demo(demo):
    _, left = demo
    assert left == []


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    saved = st.rng_state()
    torch.save(saved, tmp_path / "rng.pt")
    first = (random.random(), np.random.rand(3).tolist(), torch.rand(4))
    st.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    again = (random.random(), np.random.rand(3).tolist(), torch.rand(4))
    assert first[0] == again[0] and first[1] == again[1] and torch.equal(first[2], again[2])


def _run(sampler, loader, k):
    it = rs.batches(loader, sampler)
    return [next(it)[0] for _ in range(k)]


def test_sampler_resumes_at_the_next_batch_with_workers_across_an_epoch():
    ds = rs.dataset(PRESETS["tiny"].seq_len)
    n, b = 23, 4  # 5 batches per epoch (3 samples dropped): 8 batches cross into epoch 1
    a = rs.ResumableSampler(n, seed=5)
    straight = _run(a, rs.make_loader(ds, a, b, 2, seed=5), 8)
    first = rs.CountingSampler(n, seed=5)
    it = rs.batches(rs.make_loader(ds, first, b, 2, seed=5), first)
    head = [next(it)[0] for _ in range(3)]
    saved = first.state_dict()
    assert saved["consumed"] == 3 * b and first.yielded > saved["consumed"]  # prefetched beyond the loop
    del it
    second = rs.ResumableSampler(n, seed=5)
    second.load_state_dict(saved)
    tail = _run(second, rs.make_loader(ds, second, b, 2, seed=5), 5)
    assert all(torch.equal(x, y) for x, y in zip(head + tail, straight))
    assert second.epoch == 1
    with pytest.raises(ValueError):
        rs.ResumableSampler(n + 1, seed=5).load_state_dict(saved)


def _parts(spec="tiny", **over):
    torch.manual_seed(0)
    model = GPT(dataclasses.replace(PRESETS[spec], **over))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr.exact.warmup_cosine(2, 10))
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=1)
    return model, opt, sched, scaler, rs.ResumableSampler(10, seed=1)


def test_save_and_load_restore_every_item_in_place(tmp_path):
    model, opt, sched, scaler, sampler = _parts()
    x = torch.randint(0, 256, (2, 64))
    scaler.scale(model(x, x)).backward()
    scaler.step(opt)
    scaler.update()
    sched.step()
    sampler.consumed = 4
    path = str(tmp_path / "latest.pt")
    st.save_checkpoint(path, model, opt, sched, scaler, sampler, 1)
    assert os.listdir(tmp_path) == ["latest.pt"]  # the temporary file was renamed, nothing left beside it
    m2, o2, s2, sc2, sa2 = _parts()
    assert st.load_checkpoint(path, m2, o2, s2, sc2, sa2) == 1
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), m2.state_dict().values()))
    assert s2.state_dict()["last_epoch"] == 1 and sc2.get_scale() == scaler.get_scale() == 16.0
    assert sa2.state_dict() == sampler.state_dict() and o2.state_dict()["state"][0]["step"] == 1


def test_a_save_killed_part_way_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    model, opt, sched, scaler, sampler = _parts()
    path = str(tmp_path / "latest.pt")
    st.save_checkpoint(path, model, opt, sched, scaler, sampler, 7)

    def dies(obj, f):
        f.write(b"PK\x03\x04 half a file")
        raise KeyboardInterrupt  # the kill, mid-write

    monkeypatch.setattr(st.torch, "save", dies)
    with pytest.raises(KeyboardInterrupt):
        st.save_checkpoint(path, model, opt, sched, scaler, sampler, 8)
    monkeypatch.undo()
    assert st.load_checkpoint(path, *_parts()) == 7


def _one_line(path, model):
    with pytest.raises(st.CheckpointError) as e:
        st.load_checkpoint(path, model, *_parts()[1:])
    text = str(e.value)
    assert "\n" not in text and str(path) in text and len(text) < 300 and isinstance(e.value, RunError)
    return text


def test_damaged_checkpoints_are_one_line(tmp_path):
    model, opt, sched, scaler, sampler = _parts()
    good = tmp_path / "good.pt"
    st.save_checkpoint(str(good), model, opt, sched, scaler, sampler, 3)
    raw = good.read_bytes()
    cases = {"cut.pt": raw[: len(raw) // 2], "garbage.pt": bytes(range(200, 256)) * 3, "empty.pt": b""}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    assert "cut short" in _one_line(tmp_path / "cut.pt", model)
    assert "not a torch file" in _one_line(tmp_path / "garbage.pt", model)
    assert "empty" in _one_line(tmp_path / "empty.pt", model)
    assert "does not exist" in _one_line(tmp_path / "nowhere.pt", model)
    state = torch.load(good, weights_only=True)
    del state["rng"]
    torch.save(state, tmp_path / "nokey.pt")
    assert "'rng' is missing" in _one_line(tmp_path / "nokey.pt", model)
    torch.save({"x": pathlib.PurePosixPath("a")}, tmp_path / "code.pt")  # a class: refused
    assert "would run code" in _one_line(tmp_path / "code.pt", model)


def test_a_checkpoint_of_another_model_is_one_line(tmp_path):
    wide, *rest = _parts(d_model=128)
    st.save_checkpoint(str(tmp_path / "wide.pt"), wide, *rest, 1)
    text = _one_line(tmp_path / "wide.pt", _parts()[0])
    assert "from another model" in text and "wte.weight is [256, 128] there, [256, 64] here" in text
    deep, *rest = _parts(n_layer=3)
    st.save_checkpoint(str(tmp_path / "deep.pt"), deep, *rest, 1)
    assert "blocks.2." in _one_line(tmp_path / "deep.pt", _parts()[0])


@pytest.mark.parametrize("kw", [dict(updates=7), dict(updates=2), dict(model="huge"), dict(workers=-1),
                                dict(precision="fp8"), dict(dropout=0.0), dict(micro_batch=0),
                                dict(ablate=("model",)), dict(ablate="rng"), dict(timeout_s=0)])
def test_bad_arguments_are_refused_before_any_process(kw):
    with pytest.raises(ConfigError):
        lr.exact.resume_demo(**kw)
    assert live_children() == []


def test_dropping_the_model_is_refused(tmp_path):
    with pytest.raises(ConfigError):
        st.drop_item(str(tmp_path / "a.pt"), "model", str(tmp_path / "b.pt"))
