"""Correctness of the single-process engine: accumulation, checkpointing, precision, FLOPs, data."""
import inspect
import json
import math
import multiprocessing as mp
import subprocess
import sys
import textwrap

import pytest
import torch

import labkit as lk
from labkit.engine import measure, step, train
from labkit.engine.data import ByteWindows, StreamSampler, corpus_path, make_loader
from labkit.engine.model import GPT, n_params

CPU = torch.device("cpu")


def tiny_model(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(lk.Config(model="tiny").spec, **kw)


def batches(n, B, T=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n * B, T), generator=g)
    y = torch.randint(0, 256, (n * B, T), generator=g)
    return x, y


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


# ---- model ----------------------------------------------------------------------------------

def test_initial_loss_is_close_to_ln256():
    for preset in ("tiny", "small"):
        torch.manual_seed(0)
        model = GPT(lk.Config(model=preset).spec)
        x, y = batches(1, 8, lk.PRESETS[preset].seq_len)
        loss = model(x, y).item()
        assert abs(loss - math.log(256)) < 0.15, loss  # PyTorch's default init gives ~85 here


def test_preset_sizes():
    with torch.device("meta"):
        base = GPT(lk.Config(model="base").spec)
        small = GPT(lk.Config(model="small").spec)
    assert 84e6 < n_params(base) < 88e6  # GPT-2 small's shape with a byte vocabulary
    assert 1e6 < n_params(small) < 5e6


# ---- gradient accumulation --------------------------------------------------------------------

def accumulation_matches_big_batch(micro_steps_fn, K=4, B=2):
    """Gradients of K micro-batches of B through ``micro_steps_fn`` vs one batch of K*B; then one
    SGD step from each must land on the same weights. Returns True when both agree."""
    x, y = batches(K, B)
    big = tiny_model()
    big(x, y).backward()
    ref = grads(big)

    acc = tiny_model()
    chunks = iter(zip(x.split(B), y.split(B)))
    micro_steps_fn(acc, acc, chunks, K, None, "cpu", "fp32", CPU)
    if any(p.grad is None for p in acc.parameters()):
        return False
    same_grads = all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(grads(acc), ref))

    for m in (big, acc):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        train.optimizer_step(m, opt, None, grad_clip=None)
    same_params = all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(acc.parameters(), big.parameters()))
    return same_grads and same_params


def test_accumulation_equals_one_big_batch():
    assert accumulation_matches_big_batch(train.micro_steps)


def mutant(replace_old, replace_new):
    """labkit's own micro_steps with one line changed: the bug a learner would write."""
    src = textwrap.dedent(inspect.getsource(step.micro_steps))
    assert replace_old in src, "the mutation no longer applies: update the test with the loop"
    ns = dict(vars(step))  # the module micro_steps lives in (train re-exports it)
    exec(compile(src.replace(replace_old, replace_new, 1), "<mutant>", "exec"), ns)
    return ns["micro_steps"]


def test_mutation_missing_division_by_k_is_caught():
    broken = mutant("scaled = loss / K", "scaled = loss")
    assert not accumulation_matches_big_batch(broken)


def test_mutation_zero_grad_inside_micro_loop_is_caught():
    broken = mutant("        if should_stop():",
                    "        for p in net.parameters():\n            p.grad = None\n        if should_stop():")
    assert not accumulation_matches_big_batch(broken)


def test_sample_order_depends_on_seed_alone():
    n = 1000
    a = list(StreamSampler(n, seed=3, micro_batch=2, accum=4, world_size=1, rank=0, updates=3))
    b = list(StreamSampler(n, seed=3, micro_batch=8, accum=1, world_size=1, rank=0, updates=3))
    assert len(a) == 12 and len(b) == 3
    for u in range(3):  # update by update, the same samples
        assert sum(a[4 * u:4 * u + 4], []) == b[u]
    c = list(StreamSampler(n, seed=4, micro_batch=8, accum=1, world_size=1, rank=0, updates=3))
    assert c != b
    # two ranks split an update's samples between them, nothing lost or repeated
    r0 = list(StreamSampler(n, seed=3, micro_batch=4, accum=1, world_size=2, rank=0, updates=3))
    r1 = list(StreamSampler(n, seed=3, micro_batch=4, accum=1, world_size=2, rank=1, updates=3))
    for u in range(3):
        assert r0[u] + r1[u] == b[u]


def test_accumulated_run_matches_big_batch_run_end_to_end():
    common = dict(model="tiny", steps=3, optimizer="sgd", lr=0.05, grad_clip=None)
    a = lk.run(lk.Config(micro_batch=2, accum=4, **common))
    b = lk.run(lk.Config(micro_batch=8, accum=1, **common))
    for ra, rb in zip(a.records, b.records):
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-5)
    assert a.summary["param_fingerprint"] == pytest.approx(b.summary["param_fingerprint"], rel=1e-6)


# ---- activation checkpointing --------------------------------------------------------------------

@pytest.mark.parametrize("mode,every", [("full", 1), ("full", 2), ("selective", 1)])
def test_checkpointing_keeps_loss_and_gradients(mode, every):
    x, y = batches(1, 4)
    ref = tiny_model()
    loss_ref = ref(x, y)
    loss_ref.backward()
    ck = tiny_model(checkpointing_mode=mode, checkpoint_every=every)
    loss = ck(x, y)
    loss.backward()
    assert loss.item() == pytest.approx(loss_ref.item(), abs=1e-6)
    for a, b in zip(grads(ck), grads(ref)):
        assert torch.allclose(a, b, atol=1e-6)


def test_activation_bytes_none_gt_selective_gt_full():
    base = lk.Config(model="small", micro_batch=2)
    got = {m: measure.activation_bytes(base.replace(checkpointing=m), CPU)[0] for m in ("none", "selective", "full")}
    assert got["none"] > got["selective"] > got["full"] > 0
    assert got["none"] / got["full"] > 4  # "several-fold" on this model


def test_activation_bytes_match_what_autograd_saves_without_checkpointing():
    # Cross-check the live-storage count against a saved-tensors hook, which is exact without checkpointing.
    cfg = lk.Config(model="tiny", micro_batch=1)
    torch.manual_seed(0)
    model = GPT(cfg.spec)
    idx = torch.randint(0, 256, (1, cfg.context))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params and st.data_ptr() != idx.untyped_storage().data_ptr():
            storages[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(idx, idx)
    hooked = sum(storages.values())
    live, _ = measure.activation_bytes(cfg, CPU)
    assert hooked <= live <= hooked * 1.05 + 4096


def test_bf16_activation_bytes_well_below_fp32():
    cfg = lk.Config(model="small", micro_batch=4)  # B*T = 512
    fp32, _ = measure.activation_bytes(cfg, CPU, batch=4)
    bf16, copies = measure.activation_bytes(cfg.replace(precision="bf16"), CPU, batch=4)
    assert bf16 < 0.75 * fp32
    assert copies > 0  # autocast's bf16 weight copies, reported on their own


# ---- FLOPs and MFU -------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_flop_count_matches_formula(preset):
    spec = lk.Config(model=preset).spec
    with torch.device("meta"):
        n = GPT(spec).matmul_params()
    counted = measure.count_flops(spec, batch=2)
    formula = measure.formula_flops_per_token(n, spec.n_layer, spec.d_model, spec.seq_len) * 2 * spec.seq_len
    assert abs(counted - formula) / formula < 0.02


def test_checkpointing_adds_recompute_flops():
    spec = lk.Config(model="tiny").spec
    model_f = measure.count_flops(spec)
    full = measure.count_flops(spec, "full")
    sel = measure.count_flops(spec, "selective")
    assert full > model_f * 1.2  # a second forward of every block (embeddings/head are not recomputed)
    assert sel == model_f  # the selective policy keeps every matmul output


def test_mfu_arithmetic():
    assert measure.mfu(6e12, 2.0, 1e13, 1) == pytest.approx(0.3)
    assert measure.mfu(6e12, 2.0, 1e13, 2) == pytest.approx(0.15)  # two devices, twice the peak
    assert measure.mfu(1.0, 0.0, 1.0) is None


def test_summary_mfu_is_model_flops_over_time_and_peak():
    r = lk.run(lk.Config(model="tiny", steps=3, checkpointing="full"))
    s = r.summary
    assert s["mfu"] == pytest.approx(s["model_flops_per_step"] / s["step_time_s"] / s["peak_flops"])
    assert s["hfu"] > s["mfu"]  # recompute counts as hardware work, not model work
    assert s["peak_flops_source"].startswith("measured")


def test_probes_leave_gradients_untouched():
    model = tiny_model()
    x, y = batches(1, 2)
    model(x, y).backward()
    before = grads(model)
    cfg = lk.Config(model="tiny")
    measure.count_flops(cfg.spec, "full")
    measure.activation_bytes(cfg, CPU)
    assert all(torch.equal(a, b) for a, b in zip(grads(model), before))


# ---- precision -------------------------------------------------------------------------------

def test_fp16_with_grad_scaler_records_scale():
    r = lk.run(lk.Config(model="tiny", steps=3, precision="fp16"))
    assert r.summary["grad_scale"] is not None and r.summary["grad_scale"] > 1
    assert all(rec["grad_scale"] is not None for rec in r.records)


def test_grad_scaler_knobs_reach_the_scaler():
    # growth_interval=1: every clean update doubles the scale, starting from init_scale
    r = lk.run(lk.Config(model="tiny", steps=3, precision="fp16", init_scale=16.0, growth_interval=1))
    scales = [rec["grad_scale"] for rec in r.records if not rec["skipped"]]
    assert scales and scales[0] == 32.0 and all(b == 2 * a for a, b in zip(scales, scales[1:]))
    # an absurd start overflows: the GradScaler skips that update and halves the scale
    r = lk.run(lk.Config(model="tiny", steps=2, precision="fp16", init_scale=2.0**60))
    assert r.records[0]["skipped"] and r.records[0]["grad_scale"] == 2.0**59
    assert r.summary["init_scale"] == 2.0**60 and r.summary["growth_interval"] == 2000
    for field, bad in (("init_scale", 0.0), ("init_scale", 1e-30), ("init_scale", float("inf")),
                       ("init_scale", True), ("growth_interval", 0), ("growth_interval", 2.0)):
        with pytest.raises(lk.ConfigError, match=field):
            lk.Config(**{field: bad})


def test_bf16_run_has_no_scaler_and_finite_loss():
    r = lk.run(lk.Config(model="tiny", steps=2, precision="bf16"))
    assert r.summary["grad_scale"] is None and math.isfinite(r.summary["final_loss"])


def test_autocast_dtypes_on_cpu():
    model = tiny_model()
    seen = {}

    def remember(name):
        def hook(module, inputs, output):
            seen.setdefault(name, output.dtype)  # returns None: the output is left as it is
        return hook

    model.blocks[0].fc.register_forward_hook(remember("fc"))
    model.ln_f.register_forward_hook(remember("ln_f"))
    x, y = batches(1, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x, y)
    assert seen["fc"] == torch.bfloat16  # matmuls run in bf16
    assert loss.dtype == torch.float32  # losses are computed in fp32
    assert model.blocks[0].fc.weight.dtype == torch.float32  # master weights stay fp32


# ---- data ------------------------------------------------------------------------------------

def test_data_cost_is_real_work_and_never_changes_the_sample():
    path = corpus_path()
    plain = ByteWindows(path, 64)
    costly = ByteWindows(path, 64, work_iters=2000)
    for i in (0, 5, 77):
        assert torch.equal(plain[i][0], costly[i][0]) and torch.equal(plain[i][1], costly[i][1])
    import time

    t0 = time.process_time()  # CPU time, not wall time: the cost is computation, not sleeping
    for i in range(5):
        costly[i]
    assert time.process_time() - t0 > 0


def _batches_of(cfg, context=None):
    loader, ds = make_loader(cfg)
    if context:
        loader = torch.utils.data.DataLoader(ds, batch_sampler=loader.batch_sampler, num_workers=cfg.workers,
                                             multiprocessing_context=context)
    return [(x.clone(), y.clone()) for x, y in loader]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_under_fork_and_spawn_give_the_same_batches(context, no_leftover_processes):
    if context not in mp.get_all_start_methods():
        pytest.skip(f"{context} is not available on this platform")
    cfg = lk.Config(model="tiny", micro_batch=2, accum=2, steps=2, data_cost_ms=0.5)
    ref = _batches_of(cfg)
    got = _batches_of(cfg.replace(workers=2), context)
    assert len(got) == len(ref) == 4
    for (a, b), (c, d) in zip(got, ref):
        assert torch.equal(a, c) and torch.equal(b, d)


def test_run_with_workers_limits_threads_and_leaves_no_process(no_leftover_processes):
    r = lk.run(lk.Config(model="tiny", steps=3, workers=1, data_cost_ms=1.0))
    from labkit.engine.device import cores

    assert r.summary["intra_op_threads"] == max(1, cores() - 1)
    assert r.summary["status"] == "completed"


def test_user_corpus(tmp_path):
    f = tmp_path / "text.txt"
    f.write_text("hello labkit " * 2000)
    r = lk.run(lk.Config(model="tiny", steps=2, corpus=str(f)))
    assert r.summary["status"] == "completed" and len(r.summary["corpus_sha"]) == 64


def test_stop_event_ends_a_run_cleanly(no_leftover_processes):
    import threading

    stop = threading.Event()
    r = lk.run(lk.Config(model="tiny", steps=50, workers=1), on_step=lambda rec: stop.set(), stop=stop)
    assert r.summary["status"] == "stopped" and len(r.records) == 1
    assert lk.run(lk.Config(model="tiny", steps=1)).summary["status"] == "completed"  # next run works


# ---- CLI ----------------------------------------------------------------------------------------

JSON_KEYS = """device device_name precision accum micro_batch seq_len checkpointing optimizer workers world_size
steps n_params n_layer d_model tokens_per_step step_time_s tokens_per_s data_wait_frac intra_op_threads
peak_mem_bytes param_bytes grad_bytes optimizer_bytes activation_bytes model_flops_per_step
hardware_flops_per_step peak_flops peak_flops_source mfu hfu final_loss grad_norm skipped_steps grad_scale
corpus_sha torch_version ddp_sync bucket_cap_mb n_buckets comm_hook allreduce_calls allreduce_bytes
allreduce_calls_per_update allreduce_bytes_per_update comm_time_s""".split()


def test_cli_json_has_every_contract_key():
    out = subprocess.run([sys.executable, "-m", "labkit", "run", "--model", "tiny", "--steps", "2", "--accum", "2",
                          "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    missing = [k for k in JSON_KEYS if k not in s]
    assert not missing
    assert s["accum"] == 2 and s["tokens_per_step"] == 8 * 64 * 2


def test_cli_table_says_what_the_cpu_means_for_bf16():
    out = subprocess.run([sys.executable, "-m", "labkit", "run", "--model", "tiny", "--steps", "1", "--precision",
                          "bf16", "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    note = [line for line in out.stdout.splitlines() if line.startswith("note")]
    assert len(note) == 1 and "bf16" in note[0] and "CPU" in note[0]


def test_cli_never_imports_widget_libraries():
    code = ("import sys, labkit.__main__ as m; m.main(['run','--model','tiny','--steps','1','--json']); "
            "bad=[x for x in ('ipywidgets','matplotlib','IPython','jupyter_client') if x in sys.modules]; "
            "print('BAD', bad) if bad else print('CLEAN')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("CLEAN"), out.stdout + out.stderr


def test_cli_env_and_sweep(tmp_path):
    env = subprocess.run([sys.executable, "-m", "labkit", "env", "--json"], capture_output=True, text=True,
                         timeout=120)
    rep = json.loads(env.stdout)
    assert rep["kind"] == "cpu" and "fp32" in rep["peak_flops"]
    out = tmp_path / "sweep.csv"
    sw = subprocess.run([sys.executable, "-m", "labkit", "sweep", "--model", "tiny", "--steps", "1",
                         "--grid", "accum=1,2", "--out", str(out)], capture_output=True, text=True, timeout=180)
    assert sw.returncode == 0, sw.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and "tokens_per_s" in lines[0]
    assert "2/2" in sw.stderr  # the progress bar reached the end


# ---- what one run remembers for the next (issue 34), and what it must not ------------------------------

def test_the_activation_probe_runs_once_per_shape(monkeypatch):
    traced = []
    real = measure.Tracer
    monkeypatch.setattr(measure, "Tracer", lambda model: traced.append(1) or real(model))
    measure._activation_bytes.cache_clear()
    cfg = lk.Config(model="tiny", steps=1, micro_batch=1, device="cpu")
    a, b = lk.run(cfg), lk.run(cfg.replace(seed=7, micro_batch=2))  # the same shape per sequence
    assert len(traced) == 1
    assert a.records[0]["activation_bytes"] * 2 == b.records[0]["activation_bytes"]
    c = lk.run(cfg.replace(checkpointing="full"))  # another shape: measured afresh, and smaller
    assert len(traced) == 2 and c.records[0]["activation_bytes"] < a.records[0]["activation_bytes"]
    measure._activation_bytes.cache_clear()
    assert measure.activation_bytes(cfg, CPU)[0] == a.records[0]["activation_bytes"]  # remembered == measured


def test_a_run_is_the_same_whether_the_probe_ran_or_was_remembered():
    """The probe draws its own random numbers and gives the stream back: with dropout, the first run of a
    shape (probe measured) and the next (probe remembered) train alike."""
    measure._activation_bytes.cache_clear()
    cfg = lk.Config(model="tiny", steps=3, dropout=0.2, device="cpu")
    first, second = lk.run(cfg), lk.run(cfg)
    assert [r["loss"] for r in first.records] == [r["loss"] for r in second.records]
    assert first.summary["param_fingerprint"] == second.summary["param_fingerprint"]


def test_the_corpus_is_hashed_again_once_it_changes(tmp_path, monkeypatch):
    from labkit.engine import data
    hashed = []
    real = data._sha
    monkeypatch.setattr(data, "_sha", lambda p: hashed.append(p) or real(p))
    out, meta = tmp_path / "c.bin", tmp_path / "c.json"
    data._write(out, meta, b"some text for a corpus\n" * 20, None)
    assert data._intact(out, meta) and data._intact(out, meta)
    assert len(hashed) == 1  # unchanged since it was checked: not read again
    blob = bytearray(out.read_bytes())
    blob[3] ^= 1  # the same size, one byte edited in place
    with open(out, "r+b") as f:
        f.write(blob)
    assert not data._intact(out, meta) and len(hashed) == 2
