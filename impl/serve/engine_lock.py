"""The engine's lock, shared between forwards (issue 40; docs/serve.md, "Many conversations").

One engine computes one forward at a time, so the server serialises model
work. Held for a whole turn, a lock would make every other conversation
wait for that turn, and for a forget's whole replay. This lock is instead
handed over *between forwards*: the engine calls :meth:`EngineLock.share`
after each decode forward (``engine.between_forwards``), and the holder
steps aside there once it has held the engine for ``slice_s`` seconds and
another request waits. A turn is then delayed by at most a slice and a
forward of each request ahead of it, not by their whole length.

- **Order.** Waiters get the engine in arrival order, one slice each
  (round robin between forwards), so no request starves another.
- **Background work.** A forget's replay takes the lock as *background*
  (``hold(background=True)``): it steps aside at its next forward whenever a
  foreground request (a response, a chat completion) waits, and a
  foreground holder never steps aside for it. A forget therefore slows a
  live turn by at most one of its forwards, and finishes when the engine is
  otherwise idle.
- **Re-entrant.** The holder may take it again (the pool's budget
  enforcement runs inside a hold).
- **Batched steps.** Where the engine batches decode steps (llama.cpp with
  slots), a step calls :meth:`EngineLock.gather` instead of computing alone:
  the engine goes to each waiter not yet at a step, and the last one runs
  every step in one forward (a response's batch leaves background steps out).

Exactness does not depend on the order: each conversation's lineage is its
own, and a forward's bits do not depend on what ran before it on the engine
(llama.cpp loads a parked lineage into empty cells, the layout a fresh run
has, and a batch of next tokens gives each its own step's bits; transformers
keeps one cache per lineage). tests/test_serve.py checks each digest of eight
interleaved conversations, batched or not, against its serial replay.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

#: how long a holder keeps the engine before it lets a waiting request run one slice (seconds)
SLICE_S = 0.25


@dataclass(eq=False)
class Waiter:
    """A thread in the lock's queue: whether it is background work, and, where it has a
    step pending in the engine's batch (:meth:`EngineLock.gather`), that step's ``done()``."""

    thread: int
    background: bool
    pending: Callable[[], bool] | None = None


class EngineLock:
    """A re-entrant lock, handed over in arrival order, foreground waiters first."""

    def __init__(self, slice_s: float = SLICE_S):
        self.slice_s = slice_s
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._background = False  # whether the holder is background work
        self._since = 0.0  # when the holder got the engine (its slice started)
        self._queue: collections.deque[Waiter] = collections.deque()
        #: hand-overs so far (a measure of interleaving; the server's stats)
        self.handovers = 0

    # --- taking and letting go

    def acquire(self, background: bool = False) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return
            self._wait_turn(me, 1, background)

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("EngineLock released by a thread that does not hold it")
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify_all()

    @contextlib.contextmanager
    def held(self, background: bool = False) -> Iterator[EngineLock]:
        """The lock held for the block (``background``: see the module docstring)."""
        self.acquire(background)
        try:
            yield self
        finally:
            self.release()

    def get_waiting(self) -> int:
        """How many requests wait for the engine now (at their start, or stepped aside between forwards)."""
        with self._cond:
            return len(self._queue)

    # --- sharing

    def share(self) -> None:
        """Between two forwards: step aside when a foreground request waits and this holder is
        background work, or has held the engine for a slice; take the engine back when it is this
        thread's turn again. Nothing happens in a thread that does not hold the lock."""
        me = threading.get_ident()
        with self._cond:
            if self._owner != me or not self._should_yield():
                return
            depth, background = self._depth, self._background
            self._owner, self._depth = None, 0
            self.handovers += 1
            self._cond.notify_all()
            self._wait_turn(me, depth, background)

    def gather(self, done: Callable[[], bool], flush: Callable[[Collection[int]], None]) -> None:
        """At a decode step that can share a forward (the holder's step is pending in the
        engine's batch): hand the engine to each waiting request that is not itself
        pending, so that it reaches its own next step, and run the batch (``flush``) once
        none is left; return when ``done()``, holding the engine again. A foreground
        holder hands over to foreground waiters only, and its batch leaves out the steps
        of background work (a forget's replay waits, as :meth:`share` has it, and never
        makes a response's forward larger); a background holder hands over to any, and
        runs every step. Nothing is decided by time: a request at its step never runs
        ahead of one that could join it."""
        me = threading.get_ident()
        while True:
            with self._cond:
                if done():
                    return
                if self._owner != me:
                    raise RuntimeError("EngineLock.gather called by a thread that does not hold it")
                if self._has_joiner():
                    depth, background = self._depth, self._background
                    self._owner, self._depth = None, 0
                    self.handovers += 1
                    self._cond.notify_all()
                    self._wait_turn(me, depth, background, done)
                    continue
                skip = () if self._background else {w.thread for w in self._queue if w.background}
            flush(skip)

    def _has_joiner(self) -> bool:
        """Whether a waiter that is not pending at a step would get the engine from the holder."""
        return any(w.pending is None or w.pending() for w in self._queue if self._background or not w.background)

    def _should_yield(self) -> bool:
        if not self._queue:
            return False
        foreground_waits = any(not w.background for w in self._queue)
        if self._background:
            return foreground_waits
        return foreground_waits and time.monotonic() - self._since >= self.slice_s

    def _next_ticket(self) -> Waiter:
        """The waiter whose turn it is: the first foreground one, else the first."""
        for waiter in self._queue:
            if not waiter.background:
                return waiter
        return self._queue[0]

    def _wait_turn(self, me: int, depth: int, background: bool, pending: Callable[[], bool] | None = None) -> None:
        """Queue, wait until the engine is free and this ticket is next, then take it (the
        condition's lock held). ``pending``: this waiter has a step in the engine's batch, done
        when it returns True (:meth:`gather`)."""
        entry = Waiter(me, background, pending)
        self._queue.append(entry)
        try:
            while self._owner is not None or self._next_ticket() is not entry:
                self._cond.wait()
        except BaseException:  # interrupted while waiting: out of the queue, the next one told
            self._queue.remove(entry)
            self._cond.notify_all()
            raise
        self._queue.remove(entry)
        self._owner, self._depth, self._background, self._since = me, depth, background, time.monotonic()


__all__ = ["SLICE_S", "EngineLock", "Waiter"]
