"""Checks that need a CUDA GPU (``pytest -m gpu``; skipped without one).

They check behaviour, never speed: out-of-memory recovery under a memory budget, autocast's
dtypes, that CUDA work is asynchronous and CUDA events time it, and that a run's peak memory starts
from its own reset. No fixture from conftest.py is used: the GPU machine may run this file with
``--noconftest`` (its Python has no psutil).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import labkit as lk

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GiB = 2**30


def _cfg(**kw):
    base = dict(model="small", device="cuda", steps=2, warmup=1, micro_batch=8)
    base.update(kw)
    return lk.Config(**base)


def _fast_16bit():
    """bf16 only where it is real (compute capability >= 8.0), as labkit itself decides."""
    from labkit.engine.device import capabilities

    return ["fp16"] + (["bf16"] if capabilities("cuda").bf16 else [])


def test_oom_under_a_memory_budget_is_caught_and_memory_comes_back():
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    # 4096 x 128 tokens of the small model need many GiB of activations: far beyond 1 GiB
    with pytest.raises(lk.OutOfMemory) as err:
        lk.run(_cfg(micro_batch=4096, memory_budget_gb=1.0, steps=1, warmup=0))
    msg = str(err.value)
    assert "out of device memory" in msg
    assert torch.cuda.memory_allocated() <= before + 2**20, "the failed run left tensors allocated"
    # the budget was lifted: more than 1 GiB can be allocated again in this process
    x = torch.empty(int(1.5 * GiB), dtype=torch.uint8, device="cuda")
    del x
    torch.cuda.empty_cache()
    # and the next run goes
    res = lk.run(_cfg())
    assert res.summary["status"] == "completed"


def test_oom_is_a_runerror_subclass_with_the_numbers():
    with pytest.raises(lk.RunError) as err:
        lk.run(_cfg(micro_batch=4096, memory_budget_gb=1.0, steps=1, warmup=0))
    assert isinstance(err.value, lk.OutOfMemory)
    assert "micro_batch=4096" in str(err.value)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_autocast_dtypes_on_cuda(precision):
    if precision not in _fast_16bit():
        pytest.skip(f"{precision} is emulated on this GPU; labkit refuses it")
    from labkit.engine.precision import autocast

    want = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64).cuda()
    ln = torch.nn.LayerNorm(64).cuda()
    x = torch.randn(8, 64, device="cuda")
    target = torch.randint(0, 64, (8,), device="cuda")
    with autocast("cuda", precision):
        y = lin(x)
        q = y.view(1, 1, 8, 64)
        att = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        normed = ln(y)
        soft = torch.softmax(y, dim=-1)
        loss = F.cross_entropy(y, target)
    assert y.dtype == want and att.dtype == want  # matmuls and attention run in 16 bits
    # CUDA autocast keeps these in fp32 (on a CPU layer_norm and softmax keep their input dtype)
    assert normed.dtype == torch.float32
    assert soft.dtype == torch.float32
    assert loss.dtype == torch.float32
    loss.backward()
    assert lin.weight.grad.dtype == torch.float32  # master weights and their grads stay fp32


def test_fp32_has_no_autocast_and_tf32_switch_is_restored():
    from labkit.engine.precision import autocast, matmul_precision

    lin = torch.nn.Linear(16, 16).cuda()
    with autocast("cuda", "fp32"):
        assert lin(torch.randn(2, 16, device="cuda")).dtype == torch.float32
    matmul = torch.backends.cuda.matmul
    if not hasattr(matmul, "fp32_precision"):
        pytest.skip("this torch has no fp32_precision API")
    before = matmul.fp32_precision
    with matmul_precision("cuda", "tf32"):
        assert matmul.fp32_precision == "tf32"
    with matmul_precision("cuda", "fp32"):
        assert matmul.fp32_precision == "ieee"
    assert matmul.fp32_precision == before


def test_gradscaler_only_for_fp16():
    for precision in _fast_16bit():
        s = lk.run(_cfg(precision=precision)).summary
        if precision == "fp16":
            assert s["grad_scale"] is not None and s["grad_scale"] > 0
        else:
            assert s["grad_scale"] is None


def test_cuda_work_is_asynchronous_and_events_time_it():
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(int(2e8))  # ~0.1 s of GPU clock cycles; returns to Python at once
    end.record()
    done_right_after_queuing = end.query()
    torch.cuda.synchronize()
    assert not done_right_after_queuing, "the host did not wait: the GPU was still busy"
    assert end.query()
    ms = start.elapsed_time(end)
    assert math.isfinite(ms) and ms > 0


def test_run_records_time_the_optimizer_with_cuda_events():
    res = lk.run(_cfg(steps=3))
    for r in res.records:
        assert math.isfinite(r["optimizer_s"]) and r["optimizer_s"] > 0
        assert math.isfinite(r["step_time_s"]) and r["step_time_s"] > 0


def test_peak_memory_is_reset_at_the_start_of_a_run():
    big = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    del big
    assert torch.cuda.max_memory_allocated() >= 2 * GiB
    res = lk.run(_cfg())
    peak = res.summary["peak_mem_bytes"]
    assert peak is not None and 0 < peak < GiB, "the run reported a peak from before it started"
    assert all(r["peak_mem_bytes"] <= peak for r in res.records)


def test_nccl_world_size_one_counts_allreduce_per_update():
    ns = lk.run(_cfg(accum=2)).summary
    em = lk.run(_cfg(accum=2, ddp_sync="every_micro")).summary
    assert ns["allreduce_calls_per_update"] == ns["n_buckets"]
    assert em["allreduce_calls_per_update"] == 2 * em["n_buckets"]
