"""Checkers of chapters 00-03 (labkit.check.basics for 00-01 and 03, .precision for 02): each accepts the
reference solution, rejects the mistake learners really make (with a hint that names it), says 'not attempted' for
placeholders and never raises."""
import contextlib
import types

import pytest
import torch

import labkit as lk
from conftest import assert_family_registered, load_solutions
from labkit.check import basics, precision

FAMILIES = (basics, precision)  # chapters 00-01 and 03, 02
NAMES = [name for family in FAMILIES for name in family.__all__]


@pytest.fixture(scope="module")
def sol():
    """The three families' reference answers in one namespace (their names do not overlap)."""
    mods = [load_solutions(name) for name in ("basics", "precision", "accumulation")]
    return types.SimpleNamespace(**{n: getattr(m, n) for m in mods for n in vars(m) if not n.startswith("_")})


def test_every_checker_is_listed_and_found_by_name():
    for family in FAMILIES:
        assert_family_registered(family)


def check(name, answer):
    res = getattr(lk.check, name)(answer)
    assert isinstance(res, lk.check.CheckResult)
    return res


def passes(name, answer):
    res = check(name, answer)
    assert res.passed, res.message
    return res


def fails(name, answer, *words):
    res = check(name, answer)
    assert not res.passed and res.attempted, res.message
    for w in words:
        assert w.lower() in res.message.lower(), f"hint should mention {w!r}: {res.message}"
    return res


# ---- wrong answers: the mistakes learners make ------------------------------------------------

def state_bytes_one_moment(n, optimizer):  # Adam with one moment, gradients forgotten for SGD
    return n * (4 + 4 + 4)


def linear_forward_only(tokens, d_in, d_out):
    return 2 * tokens * d_in * d_out


def linear_one_backward_matmul(tokens, d_in, d_out):
    return 4 * tokens * d_in * d_out


def bottleneck_smallest(b):
    return min(("data", b["data_wait_s"]), ("compute", b["compute_s"]), ("optimizer", b["optimizer_s"]),
               key=lambda t: t[1])[0]


def flush_below_smallest_normal(g):
    return ((g != 0) & (g.abs() < torch.finfo(torch.float16).tiny)).float().mean().item()


def flush_counting_zeros(g):
    return (g.half() == 0).float().mean().item()


class ScalerNoReset:
    """Forgets to restart the count of good steps after an overflow."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.scale, self.g, self.b, self.n, self.good = init_scale, growth_factor, backoff_factor, growth_interval, 0

    def update(self, found_inf):
        if found_inf:
            self.scale *= self.b
            return False
        self.good += 1
        if self.good % self.n == 0:
            self.scale *= self.g
        return True


class ScalerNeverSkips(ScalerNoReset):
    def update(self, found_inf):
        super().update(found_inf)
        self.good = 0 if found_inf else self.good
        return True


def buggy_update(ddp_model, optimizer, micro_batches):
    """The chapter's loop with both mistakes: a GradScaler for bf16, no no_sync()."""
    scaler = torch.amp.GradScaler("cpu")
    K = len(micro_batches)
    for x, y in micro_batches:
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            loss = ddp_model(x, y) / K
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def update_scaler_fixed_only(ddp_model, optimizer, micro_batches):
    """Fixed the scaler, still syncs every micro-batch."""
    K = len(micro_batches)
    for x, y in micro_batches:
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            loss = ddp_model(x, y) / K
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def update_no_sync_everywhere(ddp_model, optimizer, micro_batches):
    K = len(micro_batches)
    with ddp_model.no_sync():
        for x, y in micro_batches:
            with torch.autocast(x.device.type, dtype=torch.bfloat16):
                (ddp_model(x, y) / K).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def update_missing_div(ddp_model, optimizer, micro_batches):
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        with ddp_model.no_sync() if k < K - 1 else contextlib.nullcontext():
            with torch.autocast(x.device.type, dtype=torch.bfloat16):
                loss = ddp_model(x, y)
            loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def update_one_big_forward(ddp_model, optimizer, micro_batches):
    """No accumulation at all: one forward/backward over the concatenated micro-batches. Same gradients
    and one AllReduce, but the whole batch's activations at once."""
    x = torch.cat([b[0] for b in micro_batches])
    y = torch.cat([b[1] for b in micro_batches])
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        loss = ddp_model(x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def update_backward_only_in_no_sync(ddp_model, optimizer, micro_batches):
    """What the old hint said: only the backward inside no_sync(). The forward already armed DDP's sync."""
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            loss = ddp_model(x, y) / K
        with ddp_model.no_sync() if k < K - 1 else contextlib.nullcontext():
            loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def update_forward_backward_in_no_sync(ddp_model, optimizer, micro_batches):
    """Right, written another way: the first K-1 micro-batches in one no_sync block, the last outside."""
    K = len(micro_batches)

    def one(x, y):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            loss = ddp_model(x, y) / K
        loss.backward()

    with ddp_model.no_sync():
        for x, y in micro_batches[:-1]:
            one(x, y)
    one(*micro_batches[-1])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def update_disabled_scaler(ddp_model, optimizer, micro_batches):
    """Right: the AMP recipe's on/off switch, a GradScaler with enabled=False (bf16 needs none)."""
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        with ddp_model.no_sync() if k < K - 1 else contextlib.nullcontext():
            with torch.autocast(x.device.type, dtype=torch.bfloat16):
                loss = ddp_model(x, y) / K
            scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def update_enabled_scaler_kw(ddp_model, optimizer, micro_batches):
    """Wrong: a scaler switched on explicitly (keyword), otherwise the right loop."""
    scaler = torch.amp.GradScaler(device="cpu", enabled=True)
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        with ddp_model.no_sync() if k < K - 1 else contextlib.nullcontext():
            with torch.autocast(x.device.type, dtype=torch.bfloat16):
                loss = ddp_model(x, y) / K
            scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def accumulate_one_big_forward(model, optimizer, micro_batches):
    """No accumulation: the concatenated micro-batches in one forward/backward (the big batch's gradients)."""
    x = torch.cat([b[0] for b in micro_batches])
    y = torch.cat([b[1] for b in micro_batches])
    model(x, y).backward()
    optimizer.step()
    optimizer.zero_grad()


def accumulate_token_weighted(model, optimizer, micro_batches):
    """Right, written another way: each micro-batch weighted by its share of the rows."""
    total = sum(len(y) for _, y in micro_batches)
    for x, y in micro_batches:
        (model(x, y) * (len(y) / total)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def accumulate_missing_div(model, optimizer, micro_batches):
    for x, y in micro_batches:
        model(x, y).backward()
    optimizer.step()
    optimizer.zero_grad()


def accumulate_zero_grad_inside(model, optimizer, micro_batches):
    K = len(micro_batches)
    for x, y in micro_batches:
        optimizer.zero_grad()
        (model(x, y) / K).backward()
    optimizer.step()


def accumulate_never_zero(model, optimizer, micro_batches):
    K = len(micro_batches)
    for x, y in micro_batches:
        (model(x, y) / K).backward()
    optimizer.step()


def accumulate_step_inside(model, optimizer, micro_batches):
    K = len(micro_batches)
    for x, y in micro_batches:
        (model(x, y) / K).backward()
        optimizer.step()
        optimizer.zero_grad()


# ---- chapter 00 ---------------------------------------------------------------------------------

def test_bytes_per_param(sol):
    passes("bytes_per_param_mixed_adam", sol.bytes_per_param)
    fails("bytes_per_param_mixed_adam", 12, "16-bit weights and gradients")
    fails("bytes_per_param_mixed_adam", 2, "only")


def test_llm_memory(sol):
    passes("llm_memory_gb", sol.llm_gb)
    passes("llm_memory_gb", sol.llm_gb * 1e9 / 2**30)  # the same in GiB
    fails("llm_memory_gb", 26, "16-bit weights")
    fails("llm_memory_gb", 52, "fp32")
    fails("llm_memory_gb", sol.llm_gb * 1e9, "in bytes")  # the right amount in the wrong unit: said so


def test_training_state_bytes(sol):
    passes("training_state_bytes", sol.training_state_bytes)
    fails("training_state_bytes", state_bytes_one_moment, "two")


def test_training_state_bytes_matches_engine(sol):
    """The formula the learner writes agrees with what the engine measures (AdamW adds a step counter
    per tensor: a few bytes)."""
    r = lk.run(lk.Config(model="tiny", steps=1))
    s = r.summary
    measured = s["param_bytes"] + s["grad_bytes"] + s["optimizer_bytes"]
    assert measured == pytest.approx(sol.training_state_bytes(s["n_params"], "adamw"), rel=1e-3)


# ---- chapter 01 ---------------------------------------------------------------------------------

def test_flops_linear(sol):
    passes("flops_linear", sol.linear_flops)
    fails("flops_linear", linear_forward_only, "forward pass only")
    fails("flops_linear", linear_one_backward_matmul, "two")


def test_mfu(sol):
    passes("mfu_from_numbers", sol.my_mfu)
    passes("mfu_from_numbers", 100 * sol.my_mfu)  # percent is fine
    sc = basics.MFU_SCENARIO
    sparse = 6 * sc["n_params"] * sc["tokens_per_s"] / (sc["n_gpus"] * sc["peak_sparse"])
    fails("mfu_from_numbers", sparse, "sparse")
    fails("mfu_from_numbers", sol.my_mfu / 3, "6·N")
    fails("mfu_from_numbers", sol.my_mfu * sc["n_gpus"], "all GPUs")


def test_find_bottleneck(sol):
    passes("find_bottleneck", sol.bottleneck)
    fails("find_bottleneck", bottleneck_smallest, "smallest")
    fails("find_bottleneck", lambda b: "compute")


# ---- chapter 02 ---------------------------------------------------------------------------------

def test_flush_fraction(sol):
    passes("fp16_flush_fraction", sol.flush_fraction)
    fails("fp16_flush_fraction", flush_below_smallest_normal, "subnormal")
    fails("fp16_flush_fraction", flush_counting_zeros, "already")


def test_loss_scaler_matches_gradscaler(sol):
    passes("loss_scaler", sol.MyLossScaler)
    fails("loss_scaler", ScalerNoReset, "starts again from 0")
    fails("loss_scaler", ScalerNeverSkips, "skip")


def test_fixed_training_loop(sol, no_leftover_processes):
    passes("fixed_training_loop", sol.train_update)
    fails("fixed_training_loop", buggy_update, "GradScaler")
    res = fails("fixed_training_loop", update_scaler_fixed_only, "no_sync")
    assert "[" not in res.message  # each update's count said once ("4 in each of the 2 updates"), not a list
    fails("fixed_training_loop", update_no_sync_everywhere, "last")
    fails("fixed_training_loop", update_missing_div, "divide")
    fails("fixed_training_loop", update_one_big_forward, "forward passes", "micro_batch=2 rows")
    res = fails("fixed_training_loop", update_backward_only_in_no_sync, "forward *and* backward")
    assert "first K-1 backward passes" not in res.message
    passes("fixed_training_loop", update_forward_backward_in_no_sync)
    passes("fixed_training_loop", update_disabled_scaler)
    fails("fixed_training_loop", update_enabled_scaler_kw, "GradScaler")
    assert not torch.distributed.is_initialized()  # the checker's process group of one is gone


def test_the_bf16_scaler_hint_names_its_real_costs(no_leftover_processes):
    # with bf16 a scaler causes no overflow skips (fp32's range); it costs a host-device sync per step
    # and silently skips steps that hit a genuine inf/NaN (errata #16, item 4)
    res = fails("fixed_training_loop", buggy_update, "GradScaler", "synchronisation", "skipped silently",
                "enabled=False")
    assert "overflow skip" not in res.message.lower() and "skips steps that overflow" not in res.message.lower()


def test_inspect_update_loop_counts(sol):
    bad = precision.inspect_update_loop(buggy_update, K=3)
    assert bad["allreduce_per_update"] == [3, 3] and bad["grad_scalers"] == 2
    good = precision.inspect_update_loop(sol.train_update, K=3)
    assert good["allreduce_per_update"] == [1, 1] and good["grad_scalers"] == 0
    assert good["delta_error"] < 0.05
    assert good["forward_rows"] == [[2, 2, 2], [2, 2, 2]] and good["micro_batch"] == 2
    big = precision.inspect_update_loop(update_one_big_forward, K=3)
    assert big["forward_rows"] == [[6], [6]] and big["allreduce_per_update"] == [1, 1]
    assert big["delta_error"] < 0.05  # the gradients alone cannot tell it from accumulation
    assert precision.inspect_update_loop(update_disabled_scaler, K=3)["grad_scalers"] == 0


# ---- chapter 03 ---------------------------------------------------------------------------------

def test_accum_steps(sol):
    passes("accum_steps_needed", sol.K_needed)
    fails("accum_steps_needed", 64, "8 GPUs")
    fails("accum_steps_needed", 32, "4 sequences")


def test_token_weights(sol):
    passes("token_weights", sol.token_weights)
    fails("token_weights", lambda counts: [1 / len(counts)] * len(counts), "same number of tokens")


def test_accumulation_loop(sol):
    passes("accumulation_loop", sol.accumulate_update)
    fails("accumulation_loop", accumulate_missing_div, "divide")
    fails("accumulation_loop", accumulate_zero_grad_inside, "zero_grad() inside")
    fails("accumulation_loop", accumulate_never_zero, "previous update")
    fails("accumulation_loop", accumulate_step_inside, "step once")
    fails("accumulation_loop", accumulate_one_big_forward, "K=4 forward passes", "micro_batch=3 rows")
    passes("accumulation_loop", accumulate_token_weighted)


# ---- every checker ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_placeholders_are_not_attempted(name):
    for placeholder in (None, ...):
        res = check(name, placeholder)
        assert not res.passed and not res.attempted


def unfinished(*args):
    ...  # the notebook's placeholder body: returns None


class Unfinished:
    def __init__(self, *args, **kwargs):
        ...

    def update(self, found_inf):
        ...


FUNCTION_CHECKERS = ("training_state_bytes", "flops_linear", "find_bottleneck", "fp16_flush_fraction",
                     "token_weights", "accumulation_loop", "fixed_training_loop")


@pytest.mark.parametrize("name", FUNCTION_CHECKERS)
def test_unfinished_function_is_not_attempted(name):
    res = check(name, unfinished)
    assert not res.attempted, res.message


def test_unfinished_class_is_not_attempted():
    assert not check("loss_scaler", Unfinished).attempted


def crashes(*args, **kwargs):
    raise ZeroDivisionError("learner bug")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("answer", ["abc", [1, 2], {"a": 1}, -3, float("nan"), crashes, object()])
def test_never_raises(name, answer):
    res = check(name, answer)
    assert not res.passed and res.message


def test_all_checkers_are_reachable_by_name():
    for name in NAMES:
        assert getattr(lk.check, name).is_checker
        assert name in lk.check.names()


def test_fallback_hints_point_the_way_without_the_answer():
    """Issue 24 item 13: a hint for an answer that fits no usual mistake says where to look, not the answer."""
    for gb in (104, 78):  # half of it, and no usual mistake at all
        res = fails("llm_memory_gb", gb)
        assert "(16)" not in res.message and "16 bytes" not in res.message, res.message
    res = fails("flops_linear", lambda t, i, o: 5 * t * i * o)
    assert "2·tokens·d_in·d_out" not in res.message and "twice that" not in res.message, res.message
    res = fails("fp16_flush_fraction", lambda g: 0.5)
    assert "g.half()" not in res.message and "g != 0" not in res.message, res.message
    res = fails("token_weights", lambda counts: [1.0] + [0.0] * (len(counts) - 1))
    assert "share of all the tokens" not in res.message, res.message
    res = fails("training_state_bytes", lambda n, opt: 7 * n)
    assert "expected" not in res.message and "16 per parameter" not in res.message, res.message
