"""What a checkpoint must hold to resume a run exactly (taught in chapter 11): the code a learner writes at work.

    save_checkpoint(path, model, optimizer, scheduler, scaler, sampler, step)
    step = load_checkpoint(path, model, optimizer, scheduler, scaler, sampler)

The six items (``ITEMS``): the weights, the optimizer's state, the scheduler's position, the GradScaler's,
every random generator of this process, the data loader's position. ``read_checkpoint`` turns a damaged or
foreign file into one line (``CheckpointError``). The loader's position is what the training loop consumed
(counted in ``batches``), not how far the sampler ran: workers ask for indices ahead of the loop.
``RESUME_LOGS`` is the inexact-resume exercise's data.
"""
from __future__ import annotations

import os
import random
import re
import zipfile

import torch
from torch.utils.data import DataLoader, Sampler

from ...base.runtime import ConfigError, RunError
from ...engine.data import ByteWindows, corpus_path
from ...tools.collectives import rank_device

try:
    import numpy as np
except ImportError:  # numpy is optional: a run that does not import it has no numpy generator to save
    np = None

ITEMS = ("model", "optimizer", "scheduler", "scaler", "rng", "loader")
KEYS = ("step",) + ITEMS

# exercise-11-inexact-resume: what an engineer's logs showed after five resumes, each with one item missing
# from the checkpoint (lk.check.inexact_resume judges the answer). The straight run is the reference: the
# same run without the interruption.
RESUME_LOGS = {
    "A": ("the loss of the first update after the resume differs from the straight run's; the tokens of its batch "
          "hash to the same value as update 1's batch"),
    "B": ("the loss of the first update after the resume differs; its batch's tokens are the straight run's, and "
          "so is the learning rate; the run has dropout 0.1"),
    "C": ("the first update after the resume matches the straight run (loss and learning rate); from the second "
          "on, the learning rate logged is the one the schedule gave at the run's start, in its warm-up"),
    "D": ("the first update after the resume has the same loss, but every weight moves by about the learning "
          "rate, as at the run's very first update; from the second on, the losses differ"),
    "E": ("the first update after the resume has the same loss; from then on the loss scale logged is 65,536 where "
          "the straight run's had grown to 262,144, and the two runs skip inf-gradient updates at different steps"),
}


class CheckpointError(RunError):
    """A checkpoint that cannot be used: damaged (cut short, not a torch file, a key missing) or made by
    another model. The message is one line naming the file and what is wrong."""


# ---- what the chapter shows: the checkpoint code a learner writes at work ----------------------------------

def rng_state() -> dict:
    """Every random number generator this process draws from. Per rank: each rank saves its own (rank r's
    dropout masks come from rank r's generators), so a job of W ranks writes W of these.
    Shown in 11_long_runs_and_failures (code-11-checkpoint)."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if np is not None:  # numpy's state holds an ndarray: kept as a plain list so weights_only can load it
        name, keys, pos, has_gauss, gauss = np.random.get_state()
        state["numpy"] = (name, keys.tolist(), pos, has_gauss, gauss)
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()  # one generator per GPU this process sees
    return state


def set_rng_state(state: dict) -> None:
    """Put every generator back where ``rng_state`` found it.
    Shown in 11_long_runs_and_failures (code-11-checkpoint)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if np is not None and "numpy" in state:
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path, model, optimizer, scheduler, scaler, sampler, step):
    """Everything the run needs to continue as if it had never stopped. Call it between two updates
    (never in the middle of gradient accumulation): ``step`` is the number of updates done.
    Shown in 11_long_runs_and_failures (code-11-checkpoint)."""
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),  # Adam's two moments and step count per parameter
        "scheduler": scheduler.state_dict() if scheduler else None,  # where the lr schedule is
        "scaler": scaler.state_dict() if scaler else None,  # the loss scale and its growth counter
        "rng": rng_state(),  # this rank's generators: the next dropout masks
        "loader": sampler.state_dict() if sampler else None,  # epoch, and samples the loop consumed
    }
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())  # its bytes on the disk before it becomes the checkpoint
    os.replace(tmp, path)  # atomic: a kill mid-save leaves the previous checkpoint whole, never half a new one
    folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    os.fsync(folder)  # the rename itself on the disk too (a machine crash could undo it otherwise)
    os.close(folder)


def load_checkpoint(path, model, optimizer, scheduler, scaler, sampler):
    """Put a freshly built run back where ``save_checkpoint`` left it; returns the updates already done.
    Shown in 11_long_runs_and_failures (code-11-checkpoint)."""
    state = read_checkpoint(path, model)
    model.load_state_dict(state["model"])
    for obj, key in ((optimizer, "optimizer"), (scheduler, "scheduler"), (scaler, "scaler"),
                     (sampler, "loader")):
        if obj is not None and state[key] is not None:  # None: the saving run had none (bf16: no scaler)
            obj.load_state_dict(state[key])
    if state["rng"] is not None:
        set_rng_state(state["rng"])  # last: building the model and the loader above drew from the generators
    return state["step"]


def read_checkpoint(path, model) -> dict:
    """The checkpoint in ``path``, checked against ``model``: damaged or foreign is a one-line error.
    Shown in 11_long_runs_and_failures (code-11-checkpoint)."""
    try:
        # weights_only: tensors and plain containers only, no arbitrary classes (keep torch current: this
        # unpickler had a code-execution hole up to 2.5.1)
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 -- whatever torch found wrong, said in one line below
        raise CheckpointError(damaged(path, e)) from None
    problem = mismatch(state, model)
    if problem:
        raise CheckpointError(f"checkpoint {path} {problem}")
    return state


# ---- the checks behind read_checkpoint's one line ---------------------------------------------------------

def _size(path) -> str:
    try:
        return f"{os.path.getsize(path):,} bytes"
    except OSError:
        return "no such file"


def _first_sentence(e: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", " ".join(str(e).split()))  # one line, no terminal colours
    text = text.split(". ")[0]
    return f"{type(e).__name__}: " + (text[:100] + "..." if len(text) > 100 else text)


def damaged(path, e: BaseException) -> str:
    """Why ``torch.load`` refused ``path``, in one line: missing, empty, not a torch file, cut short, unsafe."""
    if not os.path.exists(path):
        return f"checkpoint {path} does not exist"
    if os.path.isdir(path):
        return f"checkpoint {path} is a folder, not a file (a distributed checkpoint is loaded with dcp)"
    with open(path, "rb") as f:
        head = f.read(4)
    unsafe = re.search(r"GLOBAL ([\w.]+)", str(e))
    if unsafe:  # weights_only refused a class: unpickling the file would run that class's code
        return (f"checkpoint {path} is refused ({_size(path)}): it holds a Python object, {unsafe.group(1)}, "
                "not only tensors -- loading it would run code")
    if not head:
        what, detail = "empty", ""
    elif head.startswith(b"PK") and not zipfile.is_zipfile(path):
        what, detail = "cut short", "its zip directory is missing (a save killed part-way?)"
    elif not head.startswith(b"PK"):
        what, detail = "not a torch file", f"it starts with bytes {head.hex(' ')}, not a zip archive's 'PK'"
    else:
        what, detail = "a zip archive torch cannot read", _first_sentence(e)
    return f"checkpoint {path} is damaged ({what}, {_size(path)})" + (f": {detail}" if detail else "")


def mismatch(state, model):
    """None when ``state`` is a whole checkpoint of ``model``'s shape; else the words for what is wrong."""
    if not isinstance(state, dict):
        return f"is damaged: it holds a {type(state).__name__}, not a checkpoint's dict of {', '.join(KEYS)}"
    missing = [k for k in KEYS if k not in state]
    if missing:
        return f"is damaged: key {missing[0]!r} is missing (a checkpoint holds {', '.join(KEYS)})"
    saved = state["model"]
    if not isinstance(saved, dict):
        return f"is damaged: its 'model' is a {type(saved).__name__}, not a state_dict"
    here = model.state_dict()
    for name, t in here.items():
        if name not in saved:
            return f"is from another model: it has no {name} (this model has {len(here)} tensors, it {len(saved)})"
        if not torch.is_tensor(saved[name]):
            return f"is damaged: {name} is a {type(saved[name]).__name__}, not a tensor"
        if saved[name].shape != t.shape:
            return (f"is from another model: {name} is {list(saved[name].shape)} there, "
                    f"{list(t.shape)} here")
    extra = [name for name in saved if name not in here]
    if extra:
        return f"is from another model: it has {extra[0]}, which this model does not"
    opt = state["optimizer"]
    if opt is not None:
        if not isinstance(opt, dict) or not isinstance(opt.get("param_groups"), list):
            return "is damaged: its 'optimizer' is not an optimizer's state_dict"
        n, mine = sum(len(g.get("params", ())) for g in opt["param_groups"]), len(list(model.parameters()))
        if n != mine:
            return f"is from another model: its optimizer holds {n} parameters, this model has {mine}"
    return None


# ---- plumbing for the ablation: a checkpoint with one item left out ----------------------------------------

def drop_item(path, item: str, out_path) -> None:
    """Write ``out_path``: the checkpoint in ``path`` with ``item`` not stored -- what a save without it
    leaves, so the resumed run keeps that item as its own fresh start made it. The optimizer keeps its
    parameter groups (their lr) and loses its state (Adam's moments and step counts)."""
    if item not in ITEMS[1:]:
        raise ConfigError("item", item, "one of " + ", ".join(ITEMS[1:]) + " (without the model there is "
                          "nothing to resume)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if item == "optimizer":
        state["optimizer"] = {"state": {}, "param_groups": state["optimizer"]["param_groups"]}
    else:
        state[item] = None
    tmp = f"{out_path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, out_path)


# ---- where the demos' processes compute -----------------------------------------------------------

def device_for(kind: str, rank: int = 0, strict: bool = False) -> torch.device:
    """A demo process's set-up (``rank_device``: one thread, its device) with deterministic kernels when
    ``kind`` is "cuda" -- bit for bit needs them: the embedding's backward adds with atomics, in another
    order each run; cuBLAS reads its workspace setting before its first matmul. Without ``strict`` an op
    with no deterministic kernel warns instead of failing (the comparison then says so)."""
    if kind == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=not strict)
    return rank_device(kind, rank)


# ---- the loader's position: what the chapter shows ----------------------------------------------------

class ResumableSampler(Sampler):
    """Indices 0..n-1 in a new seeded order each epoch; ``state_dict`` says where the training loop is.
    Shown in 11_long_runs_and_failures (code-11-sampler)."""

    def __init__(self, n, seed=0):
        self.n, self.seed = n, seed
        self.epoch, self.consumed = 0, 0  # consumed: samples of this epoch the training loop has taken

    def __iter__(self):
        # its own generator, seeded by (seed, epoch): the order never depends on the global RNG's history
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.n, generator=g).tolist()
        return iter(order[self.consumed:])  # resumed mid-epoch: continue after what was trained on

    def __len__(self):
        return self.n - self.consumed

    def state_dict(self):
        return {"n": self.n, "seed": self.seed, "epoch": self.epoch, "consumed": self.consumed}

    def load_state_dict(self, state):
        if (state["n"], state["seed"]) != (self.n, self.seed):
            raise ValueError(f"the loader was saved for {state['n']} samples with seed {state['seed']}, "
                             f"this one has {self.n} with seed {self.seed}")
        self.epoch, self.consumed = state["epoch"], state["consumed"]


def batches(loader, sampler):
    """(x, y) batches epoch after epoch, each counted when the training loop takes it.
    Shown in 11_long_runs_and_failures (code-11-sampler)."""
    while True:
        for x, y in loader:
            sampler.consumed += len(x)  # taken by the loop: the workers have prefetched more than this
            yield x, y
        sampler.epoch, sampler.consumed = sampler.epoch + 1, 0


def make_loader(dataset, sampler, micro_batch, workers, seed):
    """A shuffled loader whose position lives in ``sampler`` (drop_last: every batch has ``micro_batch``).
    Shown in 11_long_runs_and_failures (code-11-sampler)."""
    # persistent: the workers live across epochs; fork: one starts in 0.1 s (spawn re-imports torch: seconds)
    kw = dict(persistent_workers=True, multiprocessing_context="fork") if workers else {}
    # generator=: the loader draws its workers' base seed from this one, not from the global torch RNG --
    # otherwise starting an iterator (at each epoch, and after a resume) would shift the dropout masks
    return DataLoader(dataset, batch_size=micro_batch, sampler=sampler, drop_last=True, num_workers=workers,
                      generator=torch.Generator().manual_seed(seed), **kw)


# ---- plumbing: the chapter's data ------------------------------------------------------------------------

def dataset(seq_len: int) -> ByteWindows:
    """labkit's text (this Python's standard-library source, as bytes) in windows of ``seq_len`` + 1."""
    return ByteWindows(corpus_path(), seq_len)


class CountingSampler(ResumableSampler):
    """A ResumableSampler that also counts the indices it has handed to the loader this epoch (``yielded``):
    with workers that runs ahead of ``consumed`` by the batches being prefetched. For the measurement only."""

    def __iter__(self):
        self.yielded = self.consumed
        for i in super().__iter__():
            self.yielded += 1
            yield i


def check_n(n, available: int) -> None:
    """Refuse a sampler size the data set cannot give (before any process starts)."""
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= available:
        raise ConfigError("samples", n, f"a whole number of windows from 1 to {available}")
