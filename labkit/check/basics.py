"""Checkers for chapters 00-01 (memory arithmetic, FLOPs and MFU, the step's bottleneck) and 03 (gradient
accumulation: K for a token target, token weights, a loop whose gradients must equal the big batch's), with the
helpers every accumulation check shares (chapter 02's bf16 update and chapter 06's no_sync fix are accumulation
loops too): the forward calls counted, and the one-big-forward mistake named.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..base import phrases
from ._core import AnswerError, NotAttempted, a_function, checker, describe, given, number, returned

__all__ = ["bytes_per_param_mixed_adam", "llm_memory_gb", "training_state_bytes",  # 00 start here
           "flops_linear", "mfu_from_numbers", "find_bottleneck",  # 01 measure first
           "accum_steps_needed", "token_weights", "accumulation_loop"]  # 03 gradient accumulation


# the hints, in the learner's language: notebooks/lab_messages.md, ## Checks: chapters 00 and 01
WORDS = phrases.load_section("lab_messages.md", "Checks: chapters 00 and 01", {
    "flops-one-grad": ("em",),
    "state-sgd": ("em",),
    "state-adamw": ("em",),
    **dict.fromkeys(("bpp-right", "bpp-2", "bpp-4", "bpp-8", "bpp-12", "bpp-20", "bpp-other"), ()),
    "bpp-wrong": ("answer", "hint"), "gb-right": ("want", "at20"), "gb-gib": ("want",), "gb-bytes": ("answer",),
    **dict.fromkeys(("gb-2", "gb-4", "gb-8", "gb-12", "gb-20"), ()), "gb-other": ("n_params",),
    "gb-wrong": ("answer", "per", "hint"),
    **dict.fromkeys(("state-no-grads", "state-weights", "state-right"), ()),
    "state-other": ("opt",), "state-wrong": ("n", "opt", "got", "ratio", "hint"),
    **dict.fromkeys(("flops-forward", "flops-madd", "flops-other", "flops-right"), ()),
    "flops-wrong": ("shape", "got", "want", "hint"),
    "mfu-right": ("want", "pct"), "mfu-percent": ("answer", "want"),
    **dict.fromkeys(("mfu-sparse", "mfu-2n", "mfu-one-gpu", "mfu-per-gpu"), ()), "mfu-hinted": ("answer", "hint"),
    "mfu-wrong": ("answer",), "phase-smallest": ("em",), "phase-compare": (), "phase-right": (),
    "phase-wrong": ("breakdown", "got", "want", "hint")})


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else abs(a)


# ---- 00 start here ---------------------------------------------------------------------------

@checker
def bytes_per_param_mixed_adam(answer):
    """Bytes per parameter of training state for mixed-precision Adam (before any activation), gradients kept
    once: 16 -- 16-bit weights and gradients next to fp32 master weights and Adam moments (the ZeRO paper's count),
    or autocast's fp32 weights and gradients. The Ultra-Scale Playbook's 20 (gradients also accumulated in fp32)
    is a different regime and fails, with a hint that says so."""
    v = number(answer, "give a number of bytes")
    if abs(v - 16) < 0.01:
        return True, WORDS.say("bpp-right")
    hint = WORDS.say(f"bpp-{round(v)}" if round(v) in (2, 4, 8, 12, 20) else "bpp-other")
    return False, WORDS.say("bpp-wrong", answer=f"{v:g}", hint=hint)


@checker
def llm_memory_gb(answer, n_params: float = 13e9):
    """GB (10^9 bytes) of weights, gradients and Adam state for mixed-precision training, in the
    16-bytes-per-parameter regime (gradients kept once; see ``bytes_per_param_mixed_adam``)."""
    v = number(answer, "give a number in GB")
    want = 16 * n_params / 1e9
    if _rel(v, want) <= 0.02:
        return True, WORDS.say("gb-right", want=f"{want:,.0f}", at20=f"{20 * n_params / 1e9:,.0f}")
    if _rel(v, want / 1.073741824) <= 0.02:
        return True, WORDS.say("gb-gib", want=f"{want:,.0f}")
    if _rel(v, want * 1e9) <= 0.02:  # the right amount, in bytes
        return False, WORDS.say("gb-bytes", answer=f"{v:g}")
    per = v * 1e9 / n_params
    hint = (WORDS.say(f"gb-{round(per)}") if round(per) in (2, 4, 8, 12, 20)
            else WORDS.say("gb-other", n_params=f"{n_params:.3g}"))
    return False, WORDS.say("gb-wrong", answer=f"{v:g}", per=f"{per:.3g}", hint=hint)


@checker
def training_state_bytes(fn):
    """fn(n_params, optimizer) -> bytes of fp32 weights + gradients + optimizer state: plain fp32
    training, which is also what PyTorch's autocast keeps (labkit's engine measures the same)."""
    a_function(fn)
    cases = [(n, opt) for n in (1_000, 3_257_856, 7_000_000_000) for opt in ("adamw", "sgd")]
    # every answer before anything right exists: the learner's code finds no expected value to read
    answers = [returned(fn(n, opt), "return a number of bytes") for n, opt in cases]
    for (n, opt), got in zip(cases, answers):
        bpp = {"adamw": 16, "sgd": 12}[opt]
        if _rel(got, bpp * n) > 1e-6:
            ratio = got / n
            r = round(ratio)
            mistakes = (("state-adamw", opt == "adamw" and r == 12), ("state-sgd", opt == "sgd" and r == 16),
                        ("state-no-grads", r == bpp - 4), ("state-weights", r == 4))
            hint = WORDS.say(next((key for key, when in mistakes if when), "state-other"), em="*", opt=opt)
            return False, WORDS.say("state-wrong", n=f"{n:,}", opt=opt, got=f"{got:,.0f}", ratio=f"{ratio:.3g}",
                                    hint=hint)
    return True, WORDS.say("state-right")


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
    a_function(fn)
    shapes = ((8, 16, 32), (128, 64, 256), (3, 5, 7), (4096, 768, 3072))
    answers = [returned(fn(*shape), "return a number of FLOPs") for shape in shapes]  # before any count exists
    for shape, got in zip(shapes, answers):
        want = _counted_linear_flops(*shape)
        if _rel(got, want) > 1e-9:
            r = got / want
            mistakes = (("flops-forward", (1 / 3,)), ("flops-one-grad", (2 / 3,)), ("flops-madd", (0.5, 1 / 6)))
            key = next((key for key, ratios in mistakes if any(abs(r - x) < 1e-6 for x in ratios)), "flops-other")
            hint = WORDS.say(key, em="*")
            return False, WORDS.say("flops-wrong", shape=str(shape), got=f"{got:,.0f}", want=f"{want:,}", hint=hint)
    return True, WORDS.say("flops-right")


# The scenario of chapter 01's MFU exercise (also printed in the notebook).
MFU_SCENARIO = dict(n_params=1.3e9, tokens_per_s=240_000, n_gpus=8, peak_dense=989e12, peak_sparse=1979e12)


@checker
def mfu_from_numbers(answer, n_params=1.3e9, tokens_per_s=240_000, n_gpus=8, peak_dense=989e12,
                     peak_sparse=1979e12):
    """MFU of the chapter's scenario, as a fraction (0.25) or in percent (25)."""
    v = number(answer, "give a number: a fraction such as 0.4, or a percentage")
    want = 6 * n_params * tokens_per_s / (n_gpus * peak_dense)
    if _rel(v, want) <= 0.03:
        return True, WORDS.say("mfu-right", want=f"{want:.3f}", pct=f"{100 * want:.1f}")
    if _rel(v, 100 * want) <= 0.03:
        return True, WORDS.say("mfu-percent", answer=f"{v:.3g}", want=f"{want:.3f}")
    frac = v / 100 if v > 1.5 else v
    candidates = ((6 * n_params * tokens_per_s / (n_gpus * peak_sparse), "mfu-sparse"),
                  (2 * n_params * tokens_per_s / (n_gpus * peak_dense), "mfu-2n"),
                  (6 * n_params * tokens_per_s / peak_dense, "mfu-one-gpu"),
                  (6 * n_params * tokens_per_s / (n_gpus * n_gpus * peak_dense), "mfu-per-gpu"))
    for value, hint in candidates:
        if _rel(frac, value) <= 0.03 or _rel(v, value) <= 0.03:
            return False, WORDS.say("mfu-hinted", answer=f"{v:g}", hint=WORDS.say(hint))
    return False, WORDS.say("mfu-wrong", answer=f"{v:g}")


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
    a_function(fn)
    cases = [{"data_wait_s": 0.120, "compute_s": 0.060, "optimizer_s": 0.010},
             {"data_wait_s": 0.002, "compute_s": 0.180, "optimizer_s": 0.015},
             {"data_wait_s": 0.001, "compute_s": 0.020, "optimizer_s": 0.045},
             {"data_wait_s": 0.050, "compute_s": 0.049, "optimizer_s": 0.001}]
    answers = [_phase(given(fn(dict(breakdown)))) for breakdown in cases]  # before the right phase is known
    for breakdown, got in zip(cases, answers):
        want = _phase(max(breakdown, key=breakdown.get))
        if got != want:
            smallest = min(breakdown, key=breakdown.get)
            hint = WORDS.say("phase-smallest" if got == _phase(smallest) else "phase-compare", em="*")
            return False, WORDS.say("phase-wrong", breakdown=str(breakdown), got=repr(got), want=repr(want), hint=hint)
    return True, WORDS.say("phase-right")


# ---- 03 gradient accumulation ---------------------------------------------------------------------

# the hints, in the learner's language: notebooks/lab_messages.md, ## Checks: chapter 03
WORDS03 = phrases.load_section("lab_messages.md", "Checks: chapter 03", {
    "accumulate": (), "one-big-forward": ("calls", "rows", "K", "micro_batch"),
    "k-right": ("want", "micro_batch", "seq_len", "world_size", "target"), "k-one-gpu": ("answer", "world_size"),
    "k-sequences": ("answer", "micro_batch"), "k-tokens": ("answer", "seq_len"), "k-wrong": ("answer",),
    "w-uniform": (), "w-counts": (), "w-other": (), "w-wrong": ("counts", "got", "want", "hint"), "w-right": (),
    "loop-no-step": (), "loop-steps": ("steps", "K"), "loop-too-large": ("K",), "loop-last-only": (),
    "loop-stale": (), "loop-wrong": ("update", "hint"), "loop-right": ()})


def accumulate_hint() -> str:
    """The way to accumulation, not the recipe: what a wrong update that fits no usual mistake is told."""
    return WORDS03.say("accumulate")


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
    return WORDS03.say("one-big-forward", calls=len(rows), rows=rows, K=K, micro_batch=micro_batch)


@checker
def accum_steps_needed(answer, target_tokens=524_288, world_size=8, micro_batch=4, seq_len=2048):
    """K such that micro_batch × seq_len × K × world_size = target_tokens."""
    v = number(answer, "give a number of micro-batches")
    want = target_tokens / (micro_batch * seq_len * world_size)
    if abs(v - want) < 1e-9:
        return True, WORDS03.say("k-right", want=f"{want:g}", micro_batch=micro_batch, seq_len=seq_len,
                                 world_size=world_size, target=f"{target_tokens:,}")
    mistakes = (("k-one-gpu", abs(v - want * world_size) < 1e-9), ("k-sequences", abs(v - want * micro_batch) < 1e-9),
                ("k-tokens", abs(v - want * seq_len) < 1e-9 or abs(v * seq_len - want) < 1e-9))
    return False, WORDS03.say(next((key for key, when in mistakes if when), "k-wrong"), answer=f"{v:g}",
                              world_size=world_size, micro_batch=micro_batch, seq_len=seq_len)


@checker
def token_weights(fn):
    """fn(token_counts) -> weights w_k with sum_k w_k · mean_loss_k = mean loss over all tokens."""
    a_function(fn)
    cases = ([100, 100], [512, 128, 256], [7, 1, 1, 1], [1000])
    answers = [_weights(fn(list(counts)), len(counts)) for counts in cases]  # before any right weight exists
    for counts, got in zip(cases, answers):
        want = [n / sum(counts) for n in counts]
        if len(got) != len(want) or any(abs(a - b) > 1e-9 for a, b in zip(got, want)):
            K = len(counts)
            like = [key for key, ws in (("w-uniform", [1 / K] * K), ("w-counts", counts))
                    if len(got) == K and all(abs(a - b) < 1e-9 for a, b in zip(got, ws))]
            return False, WORDS03.say("w-wrong", counts=counts, got=got, want=[round(w, 4) for w in want],
                                      hint=WORDS03.say((like or ["w-other"])[0]))
    return True, WORDS03.say("w-right")


def _weights(got, k: int) -> list:
    """What the learner's token_weights returned, as a list of plain numbers."""
    got = given(got)
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
    a_function(fn)
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
            return False, WORDS03.say("loop-no-step")
        if steps > 1:
            return False, WORDS03.say("loop-steps", steps=steps, K=K)
        with torch.no_grad():  # the reference starts this update where the learner's model started it
            for p, w in zip(ref.parameters(), run["before"]):
                p.copy_(w)
        want = _grads(ref, torch.cat([b[0] for b in data[u]]), torch.cat([b[1] for b in data[u]]))
        last = _grads(ref, *data[u][-1])
        if not _close(got, want):
            if _close(got, [K * w for w in want]):
                hint = WORDS03.say("loop-too-large", K=K)
            elif _close(got, [w / K for w in last]) or _close(got, last):
                hint = WORDS03.say("loop-last-only")
            elif prev_want is not None and _close(got, [a + b for a, b in zip(want, prev_want)], 1e-6):
                hint = WORDS03.say("loop-stale")
            else:
                hint = accumulate_hint()
            return False, WORDS03.say("loop-wrong", update=u + 1, hint=hint)
        prev_want = want
    return True, WORDS03.say("loop-right")
