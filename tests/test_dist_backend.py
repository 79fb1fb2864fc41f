"""LABKIT_DIST_BACKEND (engine.ddp.backend_for) and the pre-flight AllReduce before a run on NCCL GPUs
(engine.ddp.preflight): the decisions on the CPU; the NCCL hang simulated (a wait that times out), the real
AllReduce on a one-rank gloo group. A real 2 x GPU run waits for a machine with two GPUs."""
from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from labkit.base.runtime import ConfigError, RunError
from labkit.engine import ddp
from labkit.engine.launch import live_children, spawn_ranks


def test_unset_picks_nccl_on_cuda_where_torch_has_it_and_gloo_elsewhere(monkeypatch):
    monkeypatch.delenv("LABKIT_DIST_BACKEND", raising=False)
    assert ddp.backend_for("cpu") == "gloo"
    assert ddp.backend_for("cuda") == ("nccl" if dist.is_nccl_available() else "gloo")


@pytest.mark.parametrize("value,kind,want", [("gloo", "cuda", "gloo"), ("gloo", "cpu", "gloo"),
                                             (" GLOO ", "cuda", "gloo"), ("", "cpu", "gloo")])
def test_the_override_is_obeyed(monkeypatch, value, kind, want):
    monkeypatch.setenv("LABKIT_DIST_BACKEND", value)
    assert ddp.backend_for(kind) == want


def test_nccl_override_on_cuda_needs_a_torch_with_nccl(monkeypatch):
    monkeypatch.setenv("LABKIT_DIST_BACKEND", "nccl")
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert ddp.backend_for("cuda") == "nccl"
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    with pytest.raises(ConfigError, match="built without NCCL") as e:
        ddp.backend_for("cuda")
    assert (e.value.field, e.value.value) == ("LABKIT_DIST_BACKEND", "nccl")


@pytest.mark.parametrize("value,kind,allowed", [("mpi", "cuda", "gloo or nccl"), ("ncc", "cpu", "gloo or nccl"),
                                                ("nccl", "cpu", "gloo on cpu")])
def test_a_bad_value_names_the_variable_the_value_and_what_is_allowed(monkeypatch, value, kind, allowed):
    monkeypatch.setenv("LABKIT_DIST_BACKEND", value)
    with pytest.raises(ConfigError) as e:
        ddp.backend_for(kind)
    assert (e.value.field, e.value.value) == ("LABKIT_DIST_BACKEND", value)
    assert allowed in e.value.allowed and "LABKIT_DIST_BACKEND" in str(e.value)


def test_a_bad_value_is_refused_before_any_rank_starts(monkeypatch):
    monkeypatch.setenv("LABKIT_DIST_BACKEND", "mpi")
    with pytest.raises(ConfigError, match="LABKIT_DIST_BACKEND='mpi'"):
        with spawn_ranks(print, 2):
            pytest.fail("ranks were started")
    assert live_children() == []


def test_only_a_group_of_gpus_on_nccl_gets_the_preflight():
    assert ddp.needs_preflight("nccl", 2) and ddp.needs_preflight("nccl", 8)
    assert not ddp.needs_preflight("nccl", 1) and not ddp.needs_preflight("gloo", 2)


def test_the_preflight_allreduce_runs_on_a_gloo_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp.preflight(torch.device("cpu"), timeout_s=5.0)  # sums 1 over one rank: no error
    finally:
        dist.destroy_process_group()


class _HungWork:
    """What a hung NCCL pair gives: a wait that times out (the backends raise a RuntimeError subclass)."""

    waited = None

    def wait(self, timeout=None):
        _HungWork.waited = timeout
        raise RuntimeError("[Rank 0] Work ran for 20000 milliseconds before timing out.\n(the rest of NCCL's log)")


def test_a_hung_nccl_pair_ends_in_one_line_naming_nccl_p2p_disable(monkeypatch):
    monkeypatch.setattr(dist, "all_reduce", lambda t, async_op=False: _HungWork())
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "get_backend", lambda: "nccl")
    with pytest.raises(RunError) as e:
        ddp.preflight(torch.device("cpu"))
    text = str(e.value)
    assert "\n" not in text and "NCCL_P2P_DISABLE=1" in text and "LABKIT_DIST_BACKEND=gloo" in text
    assert f"did not finish in {ddp.PREFLIGHT_S:g} s" in text and "timing out" in text
    assert _HungWork.waited == datetime.timedelta(seconds=ddp.PREFLIGHT_S)  # its own timeout, not the run's
    assert ddp.PREFLIGHT_S < ddp.TIMEOUT.total_seconds() / 2


def test_init_group_runs_the_preflight_for_nccl_and_destroys_the_group_when_it_fails(monkeypatch):
    """The order on a GPU pair: group created, pre-flight, and on its failure no group left behind."""
    calls = []
    monkeypatch.setattr(ddp, "backend_for", lambda kind: "nccl")
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append(("init", backend)))
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(calls) and calls[-1][0] != "destroy")
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: calls.append(("destroy",)))
    monkeypatch.setattr(ddp, "_nccl_device", lambda rank: torch.device("cpu"))

    def hung(device, timeout_s=ddp.PREFLIGHT_S):
        calls.append(("preflight", str(device)))
        raise RunError("the pre-flight AllReduce ... NCCL_P2P_DISABLE=1")

    monkeypatch.setattr(ddp, "preflight", hung)
    with pytest.raises(RunError, match="NCCL_P2P_DISABLE=1"):
        ddp.init_group("cuda", 0, 2, dist.HashStore())
    assert calls == [("init", "nccl"), ("preflight", "cpu"), ("destroy",)]
