"""Checkers for chapters 00-03: memory arithmetic, FLOPs and MFU, mixed precision, accumulation.

Every checker takes the learner's answer (a number, a function or a class), returns
``(passed, message)`` and is wrapped by ``checker`` so that it never raises in a notebook. A
placeholder answer (None or ``...``) -- or a function whose body is still ``...`` and so returns
None -- counts as "not attempted". The hints name the mistake learners actually make.
"""
from __future__ import annotations

import contextlib
import gc
import inspect
import math

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.flop_counter import FlopCounterMode

from ..engine import ddp as ddp_mod
from ..base import runtime
from ..base.errors import RunError
from ._core import AnswerError, NotAttempted, checker, describe, number, shielded
from ..engine.config import ModelSpec
from ..engine.model import GPT

__all__ = [
    # 00 start here
    "bytes_per_param_mixed_adam", "llm_memory_gb", "training_state_bytes",
    # 01 measure first
    "flops_linear", "mfu_from_numbers", "find_bottleneck",
    # 02 mixed precision
    "fp16_flush_fraction", "loss_scaler", "fixed_training_loop",
    # 03 gradient accumulation
    "accum_steps_needed", "token_weights", "accumulation_loop",
]


# ---- small helpers ----------------------------------------------------------------------------

def _given(value):
    """A learner's function returned None (its body is still ``...``): not attempted yet."""
    if value is None or value is Ellipsis:
        raise NotAttempted()
    return value


def _number(answer, want="give a number") -> float:
    """The learner's own answer as a number; a wrong type is the answer's fault, said as such."""
    return number(answer, want)


def _returned(value, want) -> float:
    """What the learner's function returned, as a number (``want``: 'return a number of bytes')."""
    return number(_given(value), want, "your function returned")


def _callable(fn, what="a function"):
    if not callable(fn):
        raise AnswerError(f"your answer is {describe(fn)}; pass {what} itself (its name, without calling it)")
    return fn


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else abs(a)


# ---- 00 start here ---------------------------------------------------------------------------

@checker
def bytes_per_param_mixed_adam(answer):
    """Bytes per parameter of training state for mixed-precision Adam (before any activation).

    The regime checked: gradients kept once, so 16 bytes -- 16-bit weights and gradients next to fp32
    master weights and Adam moments (the ZeRO paper's count), or autocast's fp32 weights and gradients.
    The Ultra-Scale Playbook's 20 (gradients also accumulated in fp32) is a different regime and fails,
    with a hint that says so."""
    v = _number(answer, "give a number of bytes")
    if abs(v - 16) < 0.01:
        return True, ("16 bytes, with the gradients kept once: 16-bit weights (2) + 16-bit gradients (2) + fp32 "
                      "master weights (4) + Adam's two fp32 moments (4 + 4). PyTorch's autocast (labkit's engine) "
                      "keeps fp32 weights and gradients instead (4 + 4 + 8): the same 16. Frameworks that also "
                      "accumulate the gradients in fp32 need about 20 (the Ultra-Scale Playbook's table).")
    hints = {
        2: "2 bytes is only the 16-bit copy of the weights.",
        4: "4 bytes is only one fp32 number per parameter (the master weights).",
        8: "you have two or three of the pieces; Adam alone keeps two fp32 numbers per parameter (8 bytes).",
        12: "close: 12 is fp32 master weights plus Adam's two moments; the 16-bit weights and gradients "
            "(2 + 2) are missing.",
        20: "20 is the count when gradients are also accumulated in fp32 (the Ultra-Scale Playbook's "
            "table: 2 + 2 + 4 + 4 + 8). This exercise checks the regime that keeps the gradients once, "
            "in 16 bits, next to fp32 master weights and Adam's moments.",
    }
    hint = hints.get(round(v), "list every tensor mixed-precision Adam keeps per parameter -- the weights and "
                               "their master copy, the gradients, Adam's state -- each with its width, and add up "
                               "their bytes.")
    return False, f"{v:g} bytes is not it. {hint}"


@checker
def llm_memory_gb(answer, n_params: float = 13e9):
    """GB (10^9 bytes) of weights, gradients and Adam state for mixed-precision training, in the
    16-bytes-per-parameter regime (gradients kept once; see ``bytes_per_param_mixed_adam``)."""
    v = _number(answer, "give a number in GB")
    want = 16 * n_params / 1e9
    if _rel(v, want) <= 0.02:
        return True, (f"{want:,.0f} GB at 16 bytes per parameter (gradients kept once; about "
                      f"{20 * n_params / 1e9:,.0f} GB at 20 if they are also accumulated in fp32) -- before a "
                      "single activation. No single 80 GB or 141 GB GPU holds that: sharding (ZeRO/FSDP) or "
                      "offloading is needed.")
    if _rel(v, want / 1.073741824) <= 0.02:
        return True, f"right, in GiB (2^30 bytes); in GB (10^9 bytes) it is {want:,.0f}."
    per = v * 1e9 / n_params
    hints = {2: "that is only the 16-bit weights (2 bytes per parameter).",
             4: "that is only one fp32 copy of the weights (4 bytes per parameter).",
             8: "that is half of it: count each piece of the training state again (the exercise before).",
             12: "the 16-bit weights and gradients (2 + 2 bytes per parameter) are missing.",
             20: "20 is the count when gradients are also accumulated in fp32; this exercise checks the "
                 "16-byte regime (gradients kept once)."}
    hint = hints.get(round(per), f"how many bytes does mixed-precision Adam keep per parameter, with the gradients "
                                 f"kept once (the exercise before)? Scale that to {n_params:.3g} parameters, in "
                                 "GB (10^9 bytes).")
    return False, f"{v:g} GB is {per:.3g} bytes per parameter. {hint}"


@checker
def training_state_bytes(fn):
    """fn(n_params, optimizer) -> bytes of fp32 weights + gradients + optimizer state: plain fp32
    training, which is also what PyTorch's autocast keeps (labkit's engine measures the same)."""
    _callable(fn)
    cases = [(n, opt) for n in (1_000, 3_257_856, 7_000_000_000) for opt in ("adamw", "sgd")]
    # every answer before anything right exists: the learner's code finds no expected value to read
    answers = [_returned(fn(n, opt), "return a number of bytes") for n, opt in cases]
    for (n, opt), got in zip(cases, answers):
        bpp = {"adamw": 16, "sgd": 12}[opt]
        if _rel(got, bpp * n) > 1e-6:
                ratio = got / n
                if opt == "adamw" and round(ratio) == 12:
                    hint = "AdamW keeps *two* fp32 moments per parameter (exp_avg and exp_avg_sq)."
                elif opt == "sgd" and round(ratio) == 16:
                    hint = "SGD with momentum keeps only *one* buffer per parameter."
                elif round(ratio) == bpp - 4:
                    hint = "the gradients are missing: one fp32 number per parameter, as big as the weights."
                elif round(ratio) == 4:
                    hint = "that is the weights alone; add gradients and the optimizer's state."
                else:
                    hint = ("which fp32 tensors does training keep for every parameter: the weights, and what "
                            f"else? Count what {opt} itself keeps.")
                return False, (f"for {n:,} parameters with {opt} you return {got:,.0f} bytes ({ratio:.3g} per "
                               f"parameter): that is not it. Hint: {hint}")
    return True, ("16 bytes per parameter with AdamW, 12 with SGD + momentum (fp32 weights, gradients, state). "
                  "Autocast keeps the same, plus 16-bit weight copies that live only during a step.")


# ---- 01 measure first ------------------------------------------------------------------------

def _counted_linear_flops(tokens: int, d_in: int, d_out: int) -> int:
    """FlopCounterMode's count for forward + backward of one Linear inside a network (the input
    needs a gradient too, as every layer but the first does)."""
    with torch.device("meta"):
        layer = torch.nn.Linear(d_in, d_out)
        x = torch.empty(tokens, d_in, requires_grad=True)
    counter = FlopCounterMode(display=False)
    with counter:
        layer(x).sum().backward()
    return int(counter.get_total_flops())


@checker
def flops_linear(fn):
    """fn(tokens, d_in, d_out) -> FLOPs of forward + backward of a Linear layer (matmuls only)."""
    _callable(fn)
    shapes = ((8, 16, 32), (128, 64, 256), (3, 5, 7), (4096, 768, 3072))
    answers = [_returned(fn(*shape), "return a number of FLOPs") for shape in shapes]  # before any count exists
    for shape, got in zip(shapes, answers):
        want = _counted_linear_flops(*shape)
        if _rel(got, want) > 1e-9:
            r = got / want
            if abs(r - 1 / 3) < 1e-6:
                hint = "that is the forward pass only; the backward pass costs twice the forward."
            elif abs(r - 2 / 3) < 1e-6:
                hint = ("the backward pass has *two* matmuls: the gradient for the input (to pass on) and the "
                        "gradient for the weight.")
            elif abs(r - 0.5) < 1e-6 or abs(r - 1 / 6) < 1e-6:
                hint = "a multiply-add is 2 FLOPs (one multiply, one add)."
            else:
                hint = ("count the matmuls: the forward's one, then backward's (a gradient for the input and one "
                        "for the weight), at 2 FLOPs per multiply-add.")
            return False, f"for tokens, d_in, d_out = {shape} you return {got:,.0f}; FlopCounterMode counts {want:,}. {hint}"
    return True, "6·tokens·d_in·d_out, as FlopCounterMode counts: forward 2, backward 4 (input and weight gradients)."


# The scenario of chapter 01's MFU exercise (also printed in the notebook).
MFU_SCENARIO = dict(n_params=1.3e9, tokens_per_s=240_000, n_gpus=8, peak_dense=989e12, peak_sparse=1979e12)


@checker
def mfu_from_numbers(answer, n_params=1.3e9, tokens_per_s=240_000, n_gpus=8, peak_dense=989e12,
                     peak_sparse=1979e12):
    """MFU of the chapter's scenario, as a fraction (0.25) or in percent (25)."""
    v = _number(answer, "give a number: a fraction such as 0.4, or a percentage")
    want = 6 * n_params * tokens_per_s / (n_gpus * peak_dense)
    if _rel(v, want) <= 0.03:
        return True, f"MFU = 6·N·tokens/s ÷ (GPUs × dense peak) = {want:.3f} ({100 * want:.1f}%)."
    if _rel(v, 100 * want) <= 0.03:
        return True, f"right, in percent ({v:.3g}%); as a fraction it is {want:.3f}."
    frac = v / 100 if v > 1.5 else v
    candidates = {
        "sparse": (6 * n_params * tokens_per_s / (n_gpus * peak_sparse),
                   "you divided by the 2:4-sparse peak; MFU uses the dense figure."),
        "2N": (2 * n_params * tokens_per_s / (n_gpus * peak_dense),
               "a training step costs 6·N FLOPs per token (forward 2N + backward 4N), not 2·N."),
        "one gpu": (6 * n_params * tokens_per_s / peak_dense,
                    "the tokens/s are for all GPUs together: divide by the peak of all of them."),
        "per gpu tokens": (6 * n_params * tokens_per_s / (n_gpus * n_gpus * peak_dense),
                           "the tokens/s are already the total: divide by the GPUs once."),
    }
    for value, hint in candidates.values():
        if _rel(frac, value) <= 0.03 or _rel(v, value) <= 0.03:
            return False, f"{v:g} is not it: {hint}"
    return False, (f"{v:g} is not it. MFU compares the FLOP/s the model's training does (per token: its forward and "
                   "backward) with the peak FLOP/s of every GPU the run uses.")


_PHASES = ("data", "compute", "optimizer")


def _phase(name) -> str:
    s = str(name).lower().strip()
    for p in _PHASES:
        if s.startswith(p):
            return p
    raise ValueError(f"return one of 'data', 'compute', 'optimizer'; got {name!r}")


@checker
def find_bottleneck(fn):
    """fn(breakdown) -> 'data', 'compute' or 'optimizer': the phase that takes most of the step."""
    _callable(fn)
    cases = [{"data_wait_s": 0.120, "compute_s": 0.060, "optimizer_s": 0.010},
             {"data_wait_s": 0.002, "compute_s": 0.180, "optimizer_s": 0.015},
             {"data_wait_s": 0.001, "compute_s": 0.020, "optimizer_s": 0.045},
             {"data_wait_s": 0.050, "compute_s": 0.049, "optimizer_s": 0.001}]
    answers = [_phase(_given(fn(dict(breakdown)))) for breakdown in cases]  # before the right phase is known
    for breakdown, got in zip(cases, answers):
        want = _phase(max(breakdown, key=breakdown.get))
        if got != want:
            smallest = min(breakdown, key=breakdown.get)
            hint = ("you picked the *smallest* part; the bottleneck is where most of the time goes."
                    if got == _phase(smallest) else "compare all three parts: which one is the largest?")
            return False, f"for {breakdown} you say {got!r}, but the step mostly waits on {want!r}. {hint}"
    return True, "the largest part of the step is the one to fix first."


# ---- 02 mixed precision ----------------------------------------------------------------------

def _log_uniform(n=20_000, lo=-12, hi=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    mag = 10 ** (lo + (hi - lo) * torch.rand(n, generator=g))
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    x = sign * mag
    x[:200] = 0.0  # some exact zeros: they do not "flush", they already are zero
    return x


@checker
def fp16_flush_fraction(fn):
    """fn(g) -> fraction of g's elements that are non-zero in fp32 but become 0 in fp16."""
    _callable(fn)
    tensors = [_log_uniform(lo=lo, hi=hi, seed=seed) for seed, (lo, hi) in enumerate(((-12, 0), (-9, -3), (-6, 2)))]
    answers = [_returned(fn(g.clone()), "return a fraction between 0 and 1") for g in tensors]  # before any count
    for g, got in zip(tensors, answers):
        want = float(((g != 0) & (g.half() == 0)).float().mean())
        if abs(got - want) > 2e-4:
            a = g.abs()
            tiny = float(((a > 0) & (a < torch.finfo(torch.float16).tiny)).float().mean())
            if abs(got - tiny) < 2e-3:
                hint = ("you counted everything below fp16's smallest *normal* number (6.1e-5). Below it fp16 "
                        "still has subnormals, down to 2^-24 ≈ 6e-8: only values below about half of that "
                        "become 0. Let fp16 itself decide: a cast shows which values it cannot hold.")
            elif abs(got - float((g.half() == 0).float().mean())) < 2e-4:
                hint = "values that were already exactly 0 do not flush: leave them out of the count."
            elif 1.0 < got <= 100.0:
                hint = "give a fraction (0.012), not a percentage."
            else:
                hint = ("which values does fp16 turn into 0 that were not 0 before? Count those, as a share of "
                        "all the elements.")
            return False, f"on a test tensor you return {got:.4g}, expected {want:.4g}. {hint}"
    return True, "right: non-zero values below about 3e-8 (half of fp16's smallest subnormal) round to 0."


def _scaler_run(cls, kw, flags) -> list:
    """(take the step?, scale) after each update of the learner's scaler, as plain values."""
    s = cls(**kw)
    _given(getattr(s, "scale", None))
    seen = []
    for i, inf in enumerate(flags):
        take = s.update(inf)
        if take is None:
            raise NotAttempted() if i == 0 and s.scale == kw["init_scale"] else TypeError(
                "update() must return True (take the step) or False (skip it)")
        seen.append((bool(take), number(s.scale, "keep a number in .scale", "your scaler's .scale is")))
    return seen


def _gradscaler_trace(flags, init_scale, growth_factor, backoff_factor, growth_interval):
    """What torch.amp.GradScaler really does for a sequence of overflow flags: (scale after each
    update, whether the optimizer step was taken)."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_factor=growth_factor,
                                  backoff_factor=backoff_factor, growth_interval=growth_interval)
    scales, taken = [], []
    for inf in flags:
        scaler.scale(torch.ones(()))  # creates the scale tensor on first use
        before = p.detach().clone()
        p.grad = torch.full((1,), float("inf") if inf else 1.0)
        scaler.step(opt)
        scaler.update()
        scales.append(float(scaler.get_scale()))
        taken.append(not torch.equal(before, p.detach()))
        opt.zero_grad(set_to_none=True)
    return scales, taken


@checker
def loss_scaler(cls):
    """cls(init_scale, growth_factor, backoff_factor, growth_interval) with .scale and
    .update(found_inf) -> whether to take the optimizer step; compared with torch.amp.GradScaler."""
    _callable(cls, "a class")
    kw = dict(init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    flags = [False, False, True, False, False, True, True, False, False, False, False, False, False, False, True,
             False, False, False]
    seen = _scaler_run(cls, kw, flags)  # the learner's scaler runs to the end before GradScaler's trace exists
    want_scales, want_taken = _gradscaler_trace(flags, **kw)
    for i, (inf, (take, scale)) in enumerate(zip(flags, seen)):
        history = ", ".join("inf" if f else "ok" for f in flags[:i + 1])
        if take != want_taken[i]:
            what = "skip" if not want_taken[i] else "take"
            return False, (f"update {i + 1} ({'overflow' if inf else 'finite gradients'}): GradScaler would "
                           f"{what} the optimizer step. Skip it exactly when the gradients hold inf/NaN.")
        if abs(scale - want_scales[i]) > 1e-9 * want_scales[i]:
            hint = ("after an overflow the scale is multiplied by backoff_factor *and* the count of good steps "
                    "starts again from 0" if scale > want_scales[i] else
                    "the scale grows by growth_factor only after growth_interval finite updates in a row")
            return False, (f"after updates [{history}] your scale is {scale:g}, GradScaler's is "
                           f"{want_scales[i]:g}. Hint: {hint}.")
    return True, "your scaler backs off, skips and grows exactly like torch.amp.GradScaler."


# The way to accumulation, not the recipe: what a wrong update that fits no usual mistake is told.
_ACCUMULATE_HINT = ("compare with one big batch: by what must each micro-batch's loss be scaled, and how often may "
                    "step() and zero_grad() run in one update?")


def _rows_of(args, kwargs):
    """Rows (sequences or samples) of the first tensor a forward call got: its batch size."""
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            return int(v.shape[0])
    return 0


@contextlib.contextmanager
def _counting_forwards(module):
    """Record the rows of every forward call of ``module`` (a list, filled while the block runs)."""
    rows = []
    handle = module.register_forward_pre_hook(lambda m, a, kw: rows.append(_rows_of(a, kw)), with_kwargs=True)
    try:
        yield rows
    finally:
        handle.remove()


def _one_big_forward(rows, K, micro_batch):
    """A failing message when the forwards of one update are not K micro-batches (None when they are):
    one forward over the concatenated micro-batches gives the big batch's gradients and one AllReduce,
    but holds the whole batch's activations at once -- no accumulation, none of its memory saving."""
    if not rows or max(rows) <= micro_batch:
        return None
    return (f"forward calls in one update: {len(rows)}, seeing {rows} rows. Accumulation means K={K} forward passes "
            f"of micro_batch={micro_batch} rows each, each followed by its backward: one forward over the "
            "concatenated micro-batches gives the big batch's gradients, but keeps the whole batch's activations "
            "in memory at once -- the very thing accumulation avoids. Loop over the micro-batches.")


def _tiny_gpt():
    torch.manual_seed(0)
    return GPT(ModelSpec(n_layer=1, d_model=32, n_head=2, seq_len=16))


def _batches(updates, K, B=2, T=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randint(0, 256, (B, T), generator=g), torch.randint(0, 256, (B, T), generator=g))
             for _ in range(K)] for _ in range(updates)]


def _delta_error(model, ref, start):
    """Relative error of the learner's weight change against the reference's, and their norm ratio."""
    num = den = mine = 0.0
    for p, q, s in zip(model.parameters(), ref.parameters(), start):
        d_me, d_ref = (p.detach() - s).double(), (q.detach() - s).double()
        num += float((d_me - d_ref).pow(2).sum())
        den += float(d_ref.pow(2).sum())
        mine += float(d_me.pow(2).sum())
    return math.sqrt(num / den), math.sqrt(mine / den)


def inspect_update_loop(fn, K: int = 4, updates: int = 2, lr: float = 0.1) -> dict:
    """Run ``fn(ddp_model, optimizer, micro_batches)`` -- one optimizer update with bf16 autocast on the
    CPU -- under real DDP in a process group of one, with labkit's counting comm hook.

    Returns {"allreduce_per_update": [...], "grad_scalers": n created, "delta_error": relative error of
    the weight change against one big-batch update, "delta_ratio": its size relative to that,
    "forward_rows": per update, the rows each forward call of the model saw}.
    A GradScaler created with ``enabled=False`` (the AMP recipe's on/off switch) does nothing and is
    not counted. It takes labkit's one-run slot (a process has one default process group): while a run is
    going in this kernel the check says so and builds nothing.
    """
    with contextlib.ExitStack() as slot:
        try:
            slot.enter_context(runtime.one_run(_BUSY))
        except RunError as e:  # not the learner's fault: said as it is, not as a crash in their code
            raise AnswerError(str(e)) from None
        if dist.is_initialized():
            raise AnswerError("a process group already exists in this kernel (made outside labkit?): restart the "
                              "kernel, then run the check again")
        return _update_loop(fn, K, updates, lr)


_BUSY = "a training run is going in this kernel: wait for it to finish, then run the check again"


def _update_loop(fn, K: int, updates: int, lr: float) -> dict:
    """inspect_update_loop's work, run while it holds the one-run slot."""
    model = _tiny_gpt()
    start = [p.detach().clone() for p in model.parameters()]
    data = _batches(updates, K)
    created = []
    real_init = torch.amp.GradScaler.__init__

    def spy(self, *a, **kw):  # every GradScaler (torch.amp, torch.cpu.amp, torch.cuda.amp) passes here
        # the `enabled` argument as written, not is_enabled(): a CUDA scaler switches itself off on a
        # machine without CUDA, and that must not turn a wrong answer into a right one here
        try:
            enabled = inspect.signature(real_init).bind(self, *a, **kw).arguments.get("enabled", True)
        except TypeError:
            enabled = True
        if enabled is not False:
            created.append(type(self).__name__)
        real_init(self, *a, **kw)

    rounds, forwards = [], []
    net = None
    with shielded():  # the time limit must not cut the group's set-up half-way
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        net = DDP(model)
        state = ddp_mod.CommCounter()
        net.register_comm_hook(state, ddp_mod.counting_hook)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        torch.amp.GradScaler.__init__ = spy
        for u in range(updates):
            before = len(state.rounds)
            with _counting_forwards(model) as rows:
                fn(net, opt, data[u])
            rounds.append(len(state.rounds) - before)
            forwards.append(rows)
    finally:
        torch.amp.GradScaler.__init__ = real_init
        net = None  # free DDP's reducer before its process group
        with shielded():  # nor its teardown: a group left behind would break every later check
            gc.collect()
            dist.destroy_process_group()
    ref = _tiny_gpt()  # only now, from the same start: nothing to compare with existed while the learner's code ran
    with torch.no_grad():
        for q, s in zip(ref.parameters(), start):
            q.copy_(s)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=lr)
    for u in range(updates):  # the same updates as one big batch each, no DDP
        x = torch.cat([b[0] for b in data[u]])
        y = torch.cat([b[1] for b in data[u]])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = ref(x, y)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
    err, ratio = _delta_error(model, ref, start)
    return {"allreduce_per_update": rounds, "grad_scalers": len(created), "delta_error": err,
            "delta_ratio": ratio, "K": K, "forward_rows": forwards, "micro_batch": int(data[0][0][0].shape[0])}


@checker
def fixed_training_loop(fn):
    """fn(ddp_model, optimizer, micro_batches): one bf16 update with accumulation under DDP --
    one AllReduce per update, no (enabled) GradScaler, K forward passes of one micro-batch each, and the
    same weights as one big-batch update."""
    if not callable(fn):
        _callable(fn)
    r = inspect_update_loop(fn)
    K = r["K"]
    if not r["grad_scalers"] and not any(r["allreduce_per_update"]) and r["delta_ratio"] < 1e-12:
        raise NotAttempted()  # the body is still `...`: nothing ran
    if r["grad_scalers"]:
        # Not "it skips steps on overflow": with bf16 there is no overflow for it to catch. Its real
        # costs are a sync every step and silently skipped steps when something truly diverges.
        return False, ("a GradScaler was created. bf16 has fp32's 8 exponent bits (range up to about 3e38, "
                       "normal numbers down to about 1e-38), so its gradients neither overflow nor flush to zero "
                       "the way fp16's do: the scaler has nothing to rescue. It still costs you: its inf/NaN "
                       "check makes the host wait for the device every step (a host-device synchronisation), and "
                       "a step that hits a genuine inf/NaN is skipped silently while the scale shrinks, which "
                       "hides a diverging run. Drop it (or create it with enabled=False) and call "
                       "loss.backward() and optimizer.step().")
    for rows in r["forward_rows"]:
        big = _one_big_forward(rows, K, r["micro_batch"])
        if big:
            return False, big
    calls = r["allreduce_per_update"]
    if any(c == 0 for c in calls):
        return False, (f"AllReduce calls per update: {calls}. An update without any AllReduce leaves every "
                       "rank with its own gradients: the *last* micro-batch's backward must run outside no_sync().")
    if any(c != 1 for c in calls):
        return False, (f"AllReduce calls per update: {calls} with K={K} micro-batches. Every micro-batch whose "
                       "forward pass runs outside no_sync() all-reduces its gradients in backward (DDP decides in "
                       "the forward whether the backward will synchronise): the micro-batches that must not "
                       "communicate need their forward *and* backward inside DDP's context for that.")
    if r["delta_ratio"] < 1e-6:
        return False, "the weights did not change: call optimizer.step() once per update, after the K micro-batches."
    if r["delta_error"] > 0.05:
        if abs(r["delta_ratio"] - K) < 0.1 * K:
            hint = f"the update is {K}× too large: divide each micro-batch's loss by K before backward()."
        else:
            hint = _ACCUMULATE_HINT
        return False, (f"one AllReduce per update and no scaler -- good -- but the weights differ from one "
                       f"big-batch update by {100 * r['delta_error']:.0f}%. {hint}")
    return True, (f"one AllReduce per update (instead of {K}), no GradScaler with bf16, and the weights match "
                  f"one big-batch update (difference {100 * r['delta_error']:.2f}%, bf16 rounding).")


# ---- 03 gradient accumulation ----------------------------------------------------------------

@checker
def accum_steps_needed(answer, target_tokens=524_288, world_size=8, micro_batch=4, seq_len=2048):
    """K such that micro_batch × seq_len × K × world_size = target_tokens."""
    v = _number(answer, "give a number of micro-batches")
    want = target_tokens / (micro_batch * seq_len * world_size)
    if abs(v - want) < 1e-9:
        return True, (f"K = {want:g}: {micro_batch} × {seq_len} tokens × {want:g} micro-batches × {world_size} "
                      f"GPUs = {target_tokens:,} tokens per update.")
    if abs(v - want * world_size) < 1e-9:
        return False, f"{v:g} would be right on one GPU: every one of the {world_size} GPUs adds its own micro-batches."
    if abs(v - want * micro_batch) < 1e-9:
        return False, f"{v:g} forgets that each micro-batch holds {micro_batch} sequences."
    if abs(v - want * seq_len) < 1e-9 or abs(v * seq_len - want) < 1e-9:
        return False, f"{v:g}: count tokens -- each sequence holds {seq_len} of them."
    return False, (f"{v:g} is not it: count the tokens one update holds -- on every GPU, in every micro-batch, "
                   "every sequence -- and find the K that makes them the target.")


@checker
def token_weights(fn):
    """fn(token_counts) -> weights w_k with sum_k w_k · mean_loss_k = mean loss over all tokens."""
    _callable(fn)
    cases = ([100, 100], [512, 128, 256], [7, 1, 1, 1], [1000])
    answers = [_weights(fn(list(counts)), len(counts)) for counts in cases]  # before any right weight exists
    for counts, got in zip(cases, answers):
        want = [n / sum(counts) for n in counts]
        if len(got) != len(want) or any(abs(a - b) > 1e-9 for a, b in zip(got, want)):
            K = len(counts)
            if len(got) == K and all(abs(w - 1 / K) < 1e-9 for w in got):
                hint = ("1/K is right only when every micro-batch holds the same number of tokens; a "
                        "micro-batch with more tokens must count more.")
            elif len(got) == K and all(abs(a - n) < 1e-9 for a, n in zip(got, counts)):
                hint = "those are token counts; divide by the total so the weights sum to 1."
            else:
                hint = ("a token must count the same whichever micro-batch it is in: how much should a "
                        "micro-batch's mean loss weigh, given how many tokens stand behind it?")
            return False, f"for token counts {counts} you return {got}; expected {[round(w, 4) for w in want]}. {hint}"
    return True, "w_k = n_k / Σn: every token counts the same, however the tokens are split into micro-batches."


def _weights(got, k: int) -> list:
    """What the learner's token_weights returned, as a list of plain numbers."""
    got = _given(got)
    got = got.tolist() if isinstance(got, torch.Tensor) else got
    if isinstance(got, (str, bytes, dict)) or not hasattr(got, "__iter__"):
        raise AnswerError(f"your function returned {describe(got)}; return a list of {k} weights")
    return [number(w, "return a list of numbers", "your list holds") for w in got]


class _RecordingSGD(torch.optim.SGD):
    """SGD that remembers the gradients it was asked to apply, one entry per step() call."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.seen = []

    @torch.no_grad()
    def step(self, closure=None):
        self.seen.append([None if p.grad is None else p.grad.detach().clone()
                          for g in self.param_groups for p in g["params"]])
        return super().step(closure)


class _Net(torch.nn.Module):
    """A small classifier: model(x, y) returns the mean cross-entropy, as labkit's GPT does."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l1 = torch.nn.Linear(8, 16)
        self.l2 = torch.nn.Linear(16, 4)

    def forward(self, x, y=None):
        logits = self.l2(torch.tanh(self.l1(x)))
        return logits if y is None else torch.nn.functional.cross_entropy(logits, y)


def _grads(model, x, y):
    model.zero_grad(set_to_none=True)
    model(x, y).backward()
    out = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out


def _close(a, b, tol=1e-9):
    return all(g is not None and torch.allclose(g, h, rtol=tol, atol=tol) for g, h in zip(a, b))


def _accumulation_runs(fn, model, data, K) -> list:
    """Run the learner's update on every batch of ``data``, recording for each: the weights before it, how
    often it stepped, the gradients at its last step(), the rows of each forward, whether anything ran."""
    opt = _RecordingSGD(model.parameters(), lr=0.1)
    runs = []
    for batches in data:
        before = [p.detach().clone() for p in model.parameters()]
        n_before = len(opt.seen)
        with _counting_forwards(model) as rows:
            fn(model, opt, batches)
        steps = len(opt.seen) - n_before
        runs.append({"before": before, "steps": steps, "got": opt.seen[-1] if steps else None, "rows": list(rows),
                     "idle": steps == 0 and all(p.grad is None for p in model.parameters())})
    return runs


@checker
def accumulation_loop(fn):
    """fn(model, optimizer, micro_batches): one optimizer update from K micro-batches whose gradients
    equal those of the big batch (compared at optimizer.step()), from K forward passes of one micro-batch each."""
    _callable(fn)
    K, B, updates = 4, 3, 2
    g = torch.Generator().manual_seed(0)
    data = [[(torch.randn(B, 8, generator=g, dtype=torch.float64), torch.randint(0, 4, (B,), generator=g))
             for _ in range(K)] for _ in range(updates)]
    # every update runs before the big batch's gradients exist: the learner's code finds none to read
    runs = _accumulation_runs(fn, _Net().double(), data, K)
    ref = _Net().double()
    prev_want = None
    for u, run in enumerate(runs):
        if u == 0 and run["idle"]:
            raise NotAttempted()  # the body is still `...`: nothing ran
        big = _one_big_forward(run["rows"], K, B)
        if big:
            return False, big
        steps, got = run["steps"], run["got"]
        if steps == 0:
            return False, "optimizer.step() was never called: one update = K backward passes, then one step()."
        if steps > 1:
            return False, (f"optimizer.step() ran {steps} times for K={K} micro-batches: step once, after the loop "
                           "(stepping inside the loop is K small updates, not accumulation).")
        with torch.no_grad():  # the reference starts this update where the learner's model started it
            for p, w in zip(ref.parameters(), run["before"]):
                p.copy_(w)
        want = _grads(ref, torch.cat([b[0] for b in data[u]]), torch.cat([b[1] for b in data[u]]))
        last = _grads(ref, *data[u][-1])
        if not _close(got, want):
            if _close(got, [K * w for w in want]):
                hint = f"the gradients are {K}× too large: divide each micro-batch's loss by K before backward()."
            elif _close(got, [w / K for w in last]) or _close(got, last):
                hint = ("only the last micro-batch's gradient reached the optimizer: zero_grad() inside the "
                        "micro-batch loop wipes what the earlier ones accumulated. Zero once per update.")
            elif prev_want is not None and _close(got, [a + b for a, b in zip(want, prev_want)], 1e-6):
                hint = ("the previous update's gradients were still there: zero the gradients once per update "
                        "(after step(), or before the first micro-batch).")
            else:
                hint = _ACCUMULATE_HINT
            return False, f"update {u + 1}: the gradients at optimizer.step() differ from the big batch's. {hint}"
        prev_want = want
    return True, "the gradients at each step() equal the big batch's: K micro-batches of loss/K = one big batch."
