"""Real text with no download: this Python's own standard-library source, read as bytes.

The sample order depends on the seed alone. Sample ``i`` of the stream is window ``perm[i]``; update
``u`` uses stream samples ``[u*G, (u+1)*G)`` with ``G = micro_batch * accum * world_size``, so micro-batch
B with K accumulation steps sees, update by update, exactly the samples of micro-batch B*K with K=1.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from .config import ConfigError
from ..base.paths import cache_dirs, dir_problem, is_private_fallback, read_json, write_atomic, write_json_atomic

MAX_CORPUS_BYTES = 16 * 2**20  # plenty for the lab; keeps the cache build to a second or two
_TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst", ".c", ".h", ".json", ".toml", ".cfg", ".html"}


class CorpusError(ConfigError):
    """The text to train on cannot be used: says which path and why."""

    def __init__(self, value, allowed: str):
        super().__init__("corpus", value, allowed)


def _stdlib_files():
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if "site-packages" in rel or "dist-packages" in rel or "test" in rel or "tests" in rel:
            continue
        yield path


def _user_files(path: Path):
    if path.is_file():
        yield path
        return
    for p in sorted(path.rglob("*")):
        if p.is_file() and p.suffix.lower() in _TEXT_SUFFIXES:
            yield p


def _collect(files) -> bytes:
    """The first MAX_CORPUS_BYTES of the files, in order. Each file is read only as far as is kept: a
    10 GB text costs 16 MiB of memory, not 10 GB (or a MemoryError)."""
    parts, total = [], 0
    for f in files:
        try:
            with open(f, "rb") as fh:
                b = fh.read(MAX_CORPUS_BYTES - total)
        except OSError:
            continue
        parts.append(b)
        total += len(b)
        if total >= MAX_CORPUS_BYTES:
            break
    return b"".join(parts)


def corpus_path(source=None) -> Path:
    """Build (once) and return the cached corpus file for ``source`` (None = stdlib source)."""
    if source is None:
        key = f"stdlib-{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}"
        files = _stdlib_files
    else:
        src = Path(source).expanduser().resolve()
        if not src.exists():
            raise CorpusError(source, "an existing text file or folder (this path does not exist)")
        stamp = max((p.stat().st_mtime for p in _user_files(src)), default=0)
        key = "user-" + hashlib.sha256(f"{src}|{stamp}".encode()).hexdigest()[:16]
        files = lambda: _user_files(src)  # noqa: E731
    dirs = cache_dirs()
    blob, failed = None, []
    for d in dirs:  # the usual place first; where it cannot be written, the next writable one
        out = d / f"{key}.bin"
        meta = out.with_suffix(".json")
        problem = dir_problem(d)  # creates it, refuses a planted private fallback, sweeps dead builds' litter
        if problem and is_private_fallback(d):
            failed.append(f"{d} ({problem})")
            continue  # another user's folder: never read a corpus from it either
        if _intact(out, meta):
            return out  # an intact cache in a read-only place is still used
        if problem:
            failed.append(f"{d} ({problem})")
            continue
        if blob is None:
            blob = _collect(files())
            if not blob:
                raise CorpusError(source, "a file or folder with readable, non-empty text (found none)")
        try:
            _write(out, meta, blob, source)
        except (OSError, ValueError) as e:
            failed.append(f"{d} ({type(e).__name__}: {getattr(e, 'strerror', None) or e})")
            continue
        if failed:
            print(f"labkit: cannot write the corpus cache in {failed[0]}; using {d} instead", file=sys.stderr)
        return out
    raise ConfigError("LABKIT_DATA_DIR", str(dirs[0]), "a writable folder for the corpus cache; none of these "
                      "could be written: " + "; ".join(failed))


def _intact(out: Path, meta: Path) -> bool:
    """A cached corpus is used only when its metadata is a dict and the file a non-empty regular
    file of the recorded size and hash; anything else (truncated, edited, a folder) is rebuilt."""
    try:
        if not (out.is_file() and meta.is_file()):
            return False
        stamp = _stamp(out, meta)
        if _checked.get(str(out)) == stamp:
            return True
        info = read_json(meta, what="corpus cache metadata")
        size = out.stat().st_size
        ok = (isinstance(info, dict) and size > 0 and info.get("bytes") == size
              and info.get("sha256") == _sha(out))
        if ok:
            _checked[str(out)] = stamp
        return ok
    except (OSError, ValueError):
        return False


# Hashing the corpus took about 10 ms, twice per run. A file this process has hashed is not hashed again
# while both files keep their inode, size and change time: any write (and any utime) changes the change
# time, so an edited or replaced file is checked afresh.
_checked: dict = {}


def _stamp(out: Path, meta: Path) -> tuple:
    a, b = out.stat(), meta.stat()
    return (a.st_ino, a.st_size, a.st_mtime_ns, a.st_ctime_ns, b.st_ino, b.st_size, b.st_mtime_ns, b.st_ctime_ns)


def _write(out: Path, meta: Path, blob: bytes, source):
    for p in (out, meta):  # something under labkit's own cache name: nothing to keep, and in the way
        if p.is_symlink():
            p.unlink()  # the link itself, never what it points at
        elif p.is_dir():
            shutil.rmtree(p)
    # atomic, temp file removed on failure: two runs building at once never see half a file, and a
    # full disk or a killed build leaves no litter (a killed one's is swept by paths.usable_dir)
    write_atomic(out, blob)
    write_json_atomic(meta, {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest(),
                             "source": str(source or "stdlib")})


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def corpus_sha(path: Path) -> str:
    return read_json(path.with_suffix(".json"), what="corpus cache metadata")["sha256"]


# ---- real CPU work standing in for decoding / augmentation ------------------------------------

def _work(seed: int, iters: int) -> int:
    """Chained SHA-256 rounds: single-threaded, deterministic, keyed by the sample index."""
    h = seed.to_bytes(8, "little")
    for _ in range(iters):
        h = hashlib.sha256(h).digest()
    return h[0]


@functools.lru_cache(maxsize=None)
def iters_per_ms() -> float:
    """Calibrate the work loop once per process (best of three 20 ms probes)."""
    best = 0.0
    for _ in range(3):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.02:
            _work(n, 500)
            n += 500
        best = max(best, n / ((time.perf_counter() - t0) * 1000))
    return best


class ByteWindows(Dataset):
    """Non-overlapping windows of ``seq_len + 1`` bytes: input = first seq_len, target = shifted by
    one. ``work_iters`` rounds of real hashing per sample emulate preprocessing cost."""

    def __init__(self, path, seq_len: int, work_iters: int = 0):
        self.path = str(path)
        self.seq_len = seq_len
        self.work_iters = work_iters
        size = os.path.getsize(self.path)
        self.n = (size - 1) // seq_len
        if self.n < 1:
            raise CorpusError(self.path, f"a text of at least seq_len+1 = {seq_len + 1} bytes (this one has {size})")
        self._data = None

    def _bytes(self):
        if self._data is None:  # opened lazily: each worker maps the file itself
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._data

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        start = i * self.seq_len
        chunk = torch.from_numpy(self._bytes()[start:start + self.seq_len + 1].astype(np.int64))
        if self.work_iters:
            _work(i, self.work_iters)  # the data cost: real CPU time, result unused
        return chunk[:-1], chunk[1:]

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_data"] = None  # never pickle the memory map into a worker
        return state


class StreamSampler(Sampler):
    """Yields one rank's micro-batches: the global stream is a seeded permutation of window indices
    (repeated if it runs out); update u's G samples are split as [micro-step k][rank r][B samples].
    """

    def __init__(self, n: int, seed: int, micro_batch: int, accum: int, world_size: int, rank: int,
                 updates: int, start_update: int = 0):
        self.n, self.seed = n, seed
        self.B, self.K, self.W, self.rank = micro_batch, accum, world_size, rank
        self.updates, self.start = updates, start_update

    def _perm(self, epoch: int):
        if getattr(self, "_epoch", None) != epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch, self._order = epoch, torch.randperm(self.n, generator=g).tolist()
        return self._order

    def stream(self, lo: int, hi: int) -> list:
        """Window indices of global stream positions lo..hi-1 (a new permutation per pass)."""
        return [self._perm(i // self.n)[i % self.n] for i in range(lo, hi)]

    def __iter__(self):
        G = self.B * self.K * self.W
        for u in range(self.start, self.start + self.updates):
            samples = self.stream(u * G, (u + 1) * G)
            for k in range(self.K):
                off = (k * self.W + self.rank) * self.B
                yield samples[off:off + self.B]

    def __len__(self):
        return self.updates * self.K


def check_corpus(config) -> Path:
    """Build (or find) the corpus and check one window fits -- before any process or model exists."""
    path = corpus_path(config.corpus)
    try:
        ByteWindows(path, config.context)
    except CorpusError as e:
        raise CorpusError(config.corpus or "stdlib", e.allowed) from None
    return path


def make_loader(config, rank: int = 0, path=None, *, workers=None, updates=None, persistent_workers=False,
                prefetch_factor=None, context=None, timeout=0):
    """The DataLoader for one rank; returns (loader, dataset). The keywords are knobs the Config does not
    have (chapter 05 turns them: ``ch05_loader.loader_for``); by default everything follows ``config``.
    Shown in 05_data_loader (code-05-loader)."""
    path = path or corpus_path(config.corpus)
    cost = config.data_cost_ms
    ds = ByteWindows(path, config.context, int(round(cost * iters_per_ms())) if cost > 0 else 0)
    # the sampler fixes which samples each update sees (seeded): the order is the same whoever loads them,
    # so the workers need no seeding of their own (worker_init_fn) -- nothing in a sample is random
    sampler = StreamSampler(len(ds), config.seed, config.micro_batch, config.accum, config.world_size,
                            rank, updates or config.steps)
    w = config.workers if workers is None else workers
    kw = {}
    if w > 0:  # the worker knobs: PyTorch refuses them with num_workers=0 (no worker to keep or prefetch in)
        kw = dict(prefetch_factor=prefetch_factor or config.prefetch_factor, persistent_workers=persistent_workers,
                  multiprocessing_context=context, timeout=timeout)
    # pin_memory: batches land in page-locked memory, so the copy to the GPU can be asynchronous (non_blocking)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=w,
                                         pin_memory=config.pin_memory, **kw)
    return loader, ds
