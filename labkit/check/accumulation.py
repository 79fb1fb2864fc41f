"""Checkers for chapter 03, gradient accumulation: K for a token target, token weights, and an
accumulation loop whose gradients must equal the big batch's -- with the helpers every accumulation check
shares (chapter 02's bf16 update and chapter 06's no_sync fix are accumulation loops too): the forward
calls counted, and the one-big-forward mistake named.
"""
from __future__ import annotations

import contextlib

import torch

from ..base import phrases
from ._core import AnswerError, NotAttempted, a_function, checker, describe, given, number

__all__ = ["accum_steps_needed", "token_weights", "accumulation_loop"]


# the hints, in the learner's language: notebooks/lab_messages.md, ## Checks: chapter 03
WORDS = phrases.load_section("lab_messages.md", "Checks: chapter 03", {
    "accumulate": (), "one-big-forward": ("calls", "rows", "K", "micro_batch"),
    "k-right": ("want", "micro_batch", "seq_len", "world_size", "target"), "k-one-gpu": ("answer", "world_size"),
    "k-sequences": ("answer", "micro_batch"), "k-tokens": ("answer", "seq_len"), "k-wrong": ("answer",),
    "w-uniform": (), "w-counts": (), "w-other": (), "w-wrong": ("counts", "got", "want", "hint"), "w-right": (),
    "loop-no-step": (), "loop-steps": ("steps", "K"), "loop-too-large": ("K",), "loop-last-only": (),
    "loop-stale": (), "loop-wrong": ("update", "hint"), "loop-right": ()})
# The way to accumulation, not the recipe: what a wrong update that fits no usual mistake is told.
ACCUMULATE_HINT = WORDS.sentences["accumulate"]  # in English; accumulate_hint() says it in the learner's language


def accumulate_hint() -> str:
    return WORDS.say("accumulate")


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
    return WORDS.say("one-big-forward", calls=len(rows), rows=rows, K=K, micro_batch=micro_batch)


@checker
def accum_steps_needed(answer, target_tokens=524_288, world_size=8, micro_batch=4, seq_len=2048):
    """K such that micro_batch × seq_len × K × world_size = target_tokens."""
    v = number(answer, "give a number of micro-batches")
    want = target_tokens / (micro_batch * seq_len * world_size)
    if abs(v - want) < 1e-9:
        return True, WORDS.say("k-right", want=f"{want:g}", micro_batch=micro_batch, seq_len=seq_len,
                               world_size=world_size, target=f"{target_tokens:,}")
    if abs(v - want * world_size) < 1e-9:
        return False, WORDS.say("k-one-gpu", answer=f"{v:g}", world_size=world_size)
    if abs(v - want * micro_batch) < 1e-9:
        return False, WORDS.say("k-sequences", answer=f"{v:g}", micro_batch=micro_batch)
    if abs(v - want * seq_len) < 1e-9 or abs(v * seq_len - want) < 1e-9:
        return False, WORDS.say("k-tokens", answer=f"{v:g}", seq_len=seq_len)
    return False, WORDS.say("k-wrong", answer=f"{v:g}")


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
            if len(got) == K and all(abs(w - 1 / K) < 1e-9 for w in got):
                hint = WORDS.say("w-uniform")
            elif len(got) == K and all(abs(a - n) < 1e-9 for a, n in zip(got, counts)):
                hint = WORDS.say("w-counts")
            else:
                hint = WORDS.say("w-other")
            return False, WORDS.say("w-wrong", counts=counts, got=got, want=[round(w, 4) for w in want], hint=hint)
    return True, WORDS.say("w-right")


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
            return False, WORDS.say("loop-no-step")
        if steps > 1:
            return False, WORDS.say("loop-steps", steps=steps, K=K)
        with torch.no_grad():  # the reference starts this update where the learner's model started it
            for p, w in zip(ref.parameters(), run["before"]):
                p.copy_(w)
        want = _grads(ref, torch.cat([b[0] for b in data[u]]), torch.cat([b[1] for b in data[u]]))
        last = _grads(ref, *data[u][-1])
        if not _close(got, want):
            if _close(got, [K * w for w in want]):
                hint = WORDS.say("loop-too-large", K=K)
            elif _close(got, [w / K for w in last]) or _close(got, last):
                hint = WORDS.say("loop-last-only")
            elif prev_want is not None and _close(got, [a + b for a, b in zip(want, prev_want)], 1e-6):
                hint = WORDS.say("loop-stale")
            else:
                hint = accumulate_hint()
            return False, WORDS.say("loop-wrong", update=u + 1, hint=hint)
        prev_want = want
    return True, WORDS.say("loop-right")
