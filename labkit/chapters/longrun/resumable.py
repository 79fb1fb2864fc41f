"""The data loader's position in a checkpoint (taught in chapter 11): a sampler that shuffles each epoch with its
own seeded generator and knows how many samples the training loop has consumed.

    sampler = ResumableSampler(len(dataset), seed=0)
    loader = make_loader(dataset, sampler, micro_batch=4, workers=1, seed=0)
    for x, y in batches(loader, sampler): ...          # counts each batch as the loop takes it
    sampler.state_dict()                               # {"epoch": 0, "consumed": 12, ...} into the checkpoint

The subtlety with workers (``num_workers > 0``): the sampler runs in the main process, and the loader asks it
for indices AHEAD of the training loop -- ``prefetch_factor`` batches per worker are already being loaded while
the model trains on the current one. The position to save is therefore what the loop consumed (counted in
``batches``), not how far the sampler's iterator has run: a checkpoint that recorded the sampler's own
progress would skip the prefetched batches on resume.
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Sampler

from ...base.errors import ConfigError
from ...engine.data import ByteWindows, corpus_path


# ---- what the chapter shows ------------------------------------------------------------------------------

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
