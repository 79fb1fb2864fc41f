"""Chapter 06 (DDP): labkit.chapters.ch06_ddp and the network model under it (labkit.whatif.roofline):
torchrun_command gives a command that parses back to the same Config and quotes what it must; the network
model and the DDP lab refuse impossible numbers before any work."""
from __future__ import annotations

import shlex

import pytest

import labkit as lk
from labkit import __main__ as cli
from labkit.chapters import ch06_ddp as nm
from labkit.whatif import roofline as rl


# ---- torchrun_command ---------------------------------------------------------------------------------


def _parse_back(cmd: str, monkeypatch) -> "lk.Config":
    words = shlex.split(cmd)
    assert words[0] == "torchrun" and words[words.index("-m") + 1:words.index("-m") + 3] == ["labkit", "run"]
    ns = cli.parser().parse_args(words[words.index("-m") + 2:])
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")  # what torchrun sets in every rank
    monkeypatch.setenv("WORLD_SIZE", str(int(words[1].split("=")[1]) if "--nnodes" not in cmd else 16))
    return cli.config_from_args(ns)


@pytest.mark.parametrize("cfg", [
    lk.Config(),
    lk.Config(model="base", precision="bf16", accum=4, micro_batch=16),
    lk.Config(model="tiny", n_layer=3, d_model=96, n_head=4, lr=1.234567e-4, seed=7, optimizer="sgd",
              attention="math", loss_scaling="off", compile=True, corpus="/data/my text; rm -rf x",
              grad_clip=None, pin_memory=True, init_scale=1024.0, checkpointing="full", checkpoint_every=2,
              dropout=0.1, on_nonfinite="skip", threads=3, memory_budget_gb=12.5, workers=2, data_cost_ms=0.3),
])
def test_torchrun_command_parses_back_to_the_same_config(cfg, monkeypatch):
    cmd = nm.torchrun_command(cfg, nproc_per_node=8)
    assert _parse_back(cmd, monkeypatch) == cfg.replace(world_size=8)


def test_torchrun_command_quotes_an_endpoint(monkeypatch):
    cmd = nm.torchrun_command(lk.Config(model="tiny"), nproc_per_node=8, nnodes=2, endpoint="h;touch /tmp/pwn")
    assert "'--rdzv-endpoint=h;touch /tmp/pwn'" in cmd
    assert "--rdzv-endpoint=h;touch /tmp/pwn" in shlex.split(cmd)  # one argument, not a second command
    assert _parse_back(cmd, monkeypatch) == lk.Config(model="tiny", world_size=16)
    for bad in (dict(nproc_per_node=0), dict(nnodes=-1), dict(endpoint=""), dict(nproc_per_node=True)):
        with pytest.raises(lk.ConfigError):
            nm.torchrun_command(lk.Config(), **bad)


@pytest.mark.parametrize("call, field", [
    (lambda: rl.ring_allreduce_s(1e9, -4, 50e9), "n"), (lambda: rl.ring_allreduce_s(1e9, 0, 50e9), "n"),
    (lambda: rl.ring_allreduce_s(1e9, 2.5, 50e9), "n"), (lambda: rl.ring_allreduce_s(-1, 8, 50e9), "nbytes"),
    (lambda: rl.ring_allreduce_s(float("nan"), 8, 50e9), "nbytes"),
    (lambda: rl.ring_allreduce_s(1e9, 8, 50e9, -1e-6), "latency"), (lambda: rl.ring_bytes_sent(1e9, -2), "n"),
    (lambda: rl.allreduce_calls(0, 1), "n_buckets"), (lambda: rl.allreduce_calls(1, -1), "accum"),
    (lambda: rl.update_time(-0.1, 1e9, 8, rl.LINKS["nvlink"]), "compute_micro_s"),
    (lambda: rl.update_time(0.1, 1e9, 8, "nvlink"), "link"),
    (lambda: rl.update_time(0.1, 1e9, 8, rl.LINKS["nvlink"], overlap=float("nan")), "overlap"),
    (lambda: rl.crossover(0.1, 1e9, rl.LINKS["nvlink"], max_n=0), "max_n"),
    (lambda: rl.crossover(0.1, -1e9, rl.LINKS["nvlink"]), "nbytes"),
    (lambda: rl.sweep(0.1, 1e9, ns=()), "ns"),
    (lambda: rl.flops_compute_s(1e12, 1e15, float("nan")), "mfu"),
    (lambda: nm.plot_data_parallel(n=0), "n"), (lambda: nm.plot_model([]), "rows"),
    (lambda: nm.bucket_timeline(lk.Config(model="tiny"), updates=0), "updates"),
])
def test_netmodel_refuses_impossible_numbers(call, field):
    with pytest.raises(lk.ConfigError) as e:
        call()
    assert e.value.field == field and "\n" not in str(e.value)


@pytest.mark.parametrize("call, field", [
    (lambda d: d.buffer_sync_counts(accum=True), "accum"), (lambda d: d.buffer_sync_counts(world_size=9), "world_size"),
    (lambda d: d.buffer_sync_counts(timeout_s=float("nan")), "timeout_s"),
    (lambda d: d.buffer_sync_counts(seed=-1), "seed"),
    (lambda d: d.gpt_buffers("huge"), "model"), (lambda d: d.pattern({}, "no_sync"), "result"),
    (lambda d: d.pattern({"modes": {}, "accum": 1, "updates": 1}, "sometimes"), "mode"),
])
def test_ddplab_refuses_impossible_arguments(call, field, no_leftover_processes):
    from labkit.chapters import ch06_ddp as ddplab

    with pytest.raises(lk.ConfigError) as e:
        call(ddplab)
    assert e.value.field == field
