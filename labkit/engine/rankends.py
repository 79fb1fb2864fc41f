"""Which rank a failed run blames (used by ``launch``: ``Ranks.collect``, the engine's watch, and through them
chapter 11's restart loop): the rank that failed or died first, and how -- never a survivor's consequent error.

A SIGKILLed rank's exit code is known only once it is reaped (by the launcher, or by the warm server, which
writes it down a pipe), while its survivor's "Connection closed by peer" travels the queue in milliseconds.
So after the first sign of trouble ``settle`` waits until every rank has reported, said goodbye or ended (at
most ``SETTLE_S``), and ``blame`` orders what it learned by cause, not by arrival.
"""
from __future__ import annotations

import queue as queue_mod
import signal
import time
from dataclasses import dataclass


def _exit_words(code) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# What a rank's exception says when all it saw was a peer going away (gloo's TCP pair, NCCL's abort): a
# consequence of another rank's end, never a cause while another cause is known.
_LOST_PEER = ("Connection closed", "Connection reset", "Broken pipe", "by peer", "remote worker crashing",
              "remote process exited", "NCCL communicator was aborted")
# After the first sign of trouble, how long the other ranks get to report their own error or be reaped.
# A SIGKILLed rank's exit code is known only once it is reaped (by this process, or by the warm server,
# which then writes the code down a pipe): its survivor's "connection closed" often arrives first.
SETTLE_S = 3.0


@dataclass(frozen=True)
class RankEnd:
    """How one rank ended badly, as the parent learned it at ``seen`` (``time.monotonic()``): by its own
    exception (``error``, the text it sent home), or without a word -- a signal or an exit code
    (``exit_code``, negative for a signal, as multiprocessing reports it)."""

    rank: int
    seen: float
    error: str | None = None
    exit_code: int | None = None

    @property
    def lost_peer(self) -> bool:
        """Its exception only says that a connection to another rank broke."""
        return self.error is not None and any(s in self.error for s in _LOST_PEER)

    def words(self) -> str:
        """'rank 1 died (killed by SIGKILL)', 'rank 1 died (exit code 3)' or 'rank 0 failed: ValueError: ...'."""
        if self.error is None:
            return f"rank {self.rank} died ({_exit_words(self.exit_code)})"
        return f"rank {self.rank} failed: {self.error}"


def _cause_order(end: RankEnd):
    """Which end came first. A rank that died without a word (a signal, an exit code) cannot have been
    brought down by a peer's exception -- its peers' broken connections follow from it -- so deaths come
    first, then a rank's own exception, then a mere broken connection; among equals, the one seen first.
    The time a death is *seen* comes late (it waits for the reaping), so time alone would blame the
    survivor, whose error travels the queue in milliseconds."""
    return (0 if end.error is None else 2 if end.lost_peer else 1, end.seen)


def settle(procs, out_q, ends: dict, exited=(), settle_s: float = SETTLE_S) -> dict:
    """{rank: RankEnd} for every rank that failed or died, gathered until each rank has reported an error,
    said goodbye (``exited``, or an "exit" message) or ended -- or for ``settle_s`` seconds at most (a rank
    stuck in a collective never does). ``ends``: what is known already. Records arriving meanwhile are dropped:
    the run is over."""
    ends, said_bye = dict(ends), set(exited)
    deadline = time.monotonic() + settle_s
    while True:
        try:  # what is in the queue first: a rank that reported and then exited is known by its words
            msg = out_q.get(timeout=0.05)
        except queue_mod.Empty:
            msg = None
        if msg is not None and msg[0] == "error" and msg[1] not in ends:
            ends[msg[1]] = RankEnd(msg[1], time.monotonic(), error=msg[2])
        elif msg is not None and msg[0] == "exit":
            said_bye.add(msg[1])
        now = time.monotonic()
        codes = [p.exitcode for p in procs]
        for r, code in enumerate(codes):
            if code not in (None, 0) and r not in ends:
                ends[r] = RankEnd(r, now, exit_code=code)
        if now > deadline or (msg is None and all(r in ends or r in said_bye or code is not None
                                                  for r, code in enumerate(codes))):
            return ends


def first_end(ends: dict) -> RankEnd | None:
    """The rank whose end came first (``_cause_order``), or None."""
    return min(ends.values(), key=_cause_order) if ends else None


def blame(ends: dict) -> str:
    """One sentence naming the rank that failed or died first and how, then what a survivor saw."""
    first = first_end(ends)
    if first.lost_peer:  # the cause never showed: a peer stuck, or ended after settle_s
        return f"rank {first.rank} lost its connection to another rank, which probably failed or died: {first.error}"
    lost = sorted((e for e in ends.values() if e.lost_peer), key=lambda e: e.seen)
    if not lost:
        return first.words()
    if first.error is None:
        return (f"{first.words()}, so rank {lost[0].rank} lost its connection to it and the run stopped. "
                f"Rank {lost[0].rank} saw: {lost[0].error}")
    return f"{first.words()} (rank {lost[0].rank} then lost its connection to it)"


def _rank_error(rank, text, procs, out_q, exited=(), settle_s: float = SETTLE_S) -> str:
    """The message for a run in which rank ``rank`` raised ``text``: the rank that failed or died first
    leads (``blame``), once the others have reported or been reaped."""
    return blame(settle(procs, out_q, {rank: RankEnd(rank, time.monotonic(), error=text)}, exited, settle_s))
