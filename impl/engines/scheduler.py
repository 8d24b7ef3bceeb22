"""The engine's loop: one thread owns every forward (issue 50; docs/engines.md, "The loop").

Request threads submit work and wait for its result; one loop thread decides
what runs and runs it, as llama.cpp's server loop and vLLM v1's
``EngineCore.step`` do (schedule, execute, update):

- **Sessions.** A thread that works on the engine's lineages (a turn, a
  replay, a digest, a rebuild) holds a *session* (:meth:`Scheduler.session`),
  at most one thread at a time, re-entrant, granted in arrival order with
  foreground work first. The holder reads and writes the book's state (its
  lineages, the budget, a crop, a park) on its own thread; every forward it
  needs is a :class:`Job` it hands the loop (:meth:`Scheduler.run`).
- **Decode steps.** A turn's forwards are submitted *releasing* the session
  (:meth:`Scheduler.run` with ``release``, a one-token ``step`` batchable): while the
  loop computes it, another thread takes the session and reaches its own next
  step. So a turn is delayed by forwards of others, never by their whole turn.
- **The decision** (:func:`get_next`, a pure function of the plain state):
  nothing runs while the holder computes (the book is its alone), nor while a
  foreground thread waits for the session (it may be about to join the
  batch). Then foreground jobs before background ones (a forget's replay
  yields to a live turn at every forward and never makes its forward larger);
  the oldest job first; where it is a one-token step, every ready step of the
  same class joins it in one forward, up to the backend's ``batch_limit``, and
  where it is a short prefill chunk (:class:`StepRequest` with ``ids``), every
  ready chunk does (eight conversations' turns prefilled in one forward, not
  eight).
- **Backends compute and hold no threads.** The loop calls the backend's
  ``forward`` (through the job's closure) and, for a batch, its
  ``forward_steps(steps)``; the backend never calls back. A forward's hooks
  hear it in the thread that asked for it (:func:`get_requester`), so a
  forget's report counts its own forwards only.
- **Cancelling.** Work run in a :meth:`Scheduler.cancellable` block stops at
  its next forward once its :class:`Cancel` is set (a client that left): that
  job is withdrawn before it runs and its thread raises :class:`Cancelled`,
  once, so the work's own clean-up (a turn's lineage cut back, a step rolled
  back to the store's state) may still compute. :meth:`Scheduler.stop` (the
  server shutting down) does so for every job from then on. A forward already
  running is finished, never cut: each forward is whole.

One thread computing matters for speed too. libgomp keeps a thread pool for each thread that has
run a parallel region, while that thread lives, and once the pools' threads outnumber the cores it
spins only briefly at a barrier before sleeping; ggml's OpenMP build ends every graph node with one.
A decode step of qwen2.5-1.5b on 2 threads took 45 to 52 ms on a second computing thread of a
process against 37 to 39 ms on the first (docs/serve.md, "Where the time goes").

Exactness does not depend on the order: each lineage's forwards are its own
(a batch of next tokens in split cells gives each sequence the bits of its
own step: docs/bench.md, "many sequences in one forward"), and a forward's
bits do not depend on what ran before it on the engine.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

_acting = threading.local()
#: seconds the loop waits for work before its thread ends
IDLE_S = 0.5
#: every scheduler whose loop may be running: their threads are ended before the interpreter's
#: finalisation frees the models they compute on
_LOOPS: weakref.WeakSet = weakref.WeakSet()


def get_requester() -> int:
    """The thread a forward is computed for: inside the loop, the job's submitter; else the caller."""
    return getattr(_acting, "thread", None) or threading.get_ident()


class Cancelled(Exception):
    """The work was cancelled before its next forward (its client left, or the server stops)."""


@dataclass(eq=False)
class Cancel:
    """A request's cancellation: set (:meth:`set`, from any thread), the work of the
    :meth:`Scheduler.cancellable` block it names raises :class:`Cancelled` at its next forward."""

    scheduler: Any
    thread: int
    is_set: bool = False

    def set(self) -> None:
        self.scheduler.cancel(self)


@dataclass(frozen=True)
class StepRequest:
    """A batchable forward: lineage ``handle`` (object ``lin``) extended by ``token`` (a decode
    step), or by the chunk ``ids`` where given (``token`` its last), a chunk whose rows are the
    same however it is cut (at most the engine's ``max_forward`` tokens), so that llama.cpp may
    compute it beside other lineages' chunks in one forward."""

    handle: str
    lin: Any
    token: int
    thread: int
    ids: tuple[int, ...] = ()

    @property
    def tokens(self) -> tuple[int, ...]:
        """The tokens the forward appends."""
        return self.ids or (self.token,)

    @property
    def is_chunk(self) -> bool:
        """A chunk of several tokens, which batches with chunks only, not with decode steps."""
        return len(self.tokens) > 1


@dataclass(eq=False)
class Waiter:
    """A thread waiting for the session (``depth``: its re-entrant depth to restore)."""

    thread: int
    background: bool
    depth: int = 1


@dataclass(eq=False)
class Job:
    """Work for the loop: ``fn(*args)`` (a forward), which, where it is a one-token decode
    step (``step``), the loop may instead run in a batch with other steps; its result or error."""

    thread: int
    background: bool
    fn: Callable[..., Any] | None = None
    args: tuple = ()
    step: StepRequest | None = None
    release: bool = False  # the submitter lets go of its session while the job runs
    depth: int = 0  # the session depth it let go of (0: it held none)
    waiter: Waiter | None = None  # its place in the session's queue once run (the loop queues it)
    result: Any = None
    error: BaseException | None = None
    done: bool = False

    @property
    def batchable(self) -> bool:
        return self.step is not None


@dataclass
class LoopState:
    """What the loop decides on: the session's holder (None: free), whether the holder waits
    on a job of its own, the threads waiting for the session, and the jobs not yet run."""

    holder: int | None
    holder_waits: bool
    waiters: Sequence[Waiter]
    jobs: Sequence[Job]
    batch_limit: int = 1


def get_next(state: LoopState) -> list[Job]:
    """The jobs to run as the next forward (empty: wait). See the module docstring."""
    if not state.jobs:
        return []
    if state.holder is not None and not state.holder_waits:
        return []  # the holder is computing on the book: it may submit more, and owns the state now
    foreground = [j for j in state.jobs if not j.background]
    if state.holder is None and any(not w.background for w in state.waiters):
        return []  # a foreground thread is about to take the session and may join this forward
    if state.holder is None and not foreground and state.waiters:
        return []  # background waiters only: let them reach their steps first
    pool = foreground or list(state.jobs)
    first = pool[0]
    if not first.batchable or state.batch_limit <= 1:
        return [first]
    return get_batch(pool, state.batch_limit)


def get_batch(jobs: Sequence[Job], limit: int) -> list[Job]:
    """The oldest ready steps of the first one's kind (one-token steps, or chunks), one per
    lineage, at most ``limit``. Kinds are not mixed: llama.cpp computes a batch over streams
    in micro-batches of an equal share of every stream, so a chunk beside one-token steps
    would still be a graph computation of its own, and would delay the steps' tokens."""
    batch, seen, kind = [], set(), jobs[0].step.is_chunk
    for job in jobs:
        if job.batchable and job.step.handle not in seen and job.step.is_chunk == kind:
            batch.append(job)
            seen.add(job.step.handle)
            if len(batch) == limit:
                break
    return batch


class Scheduler:
    """The loop that owns an engine's forwards (the module docstring). ``batch``: runs a list of
    :class:`StepRequest` as one forward and returns each one's logits (None: every job runs
    alone); ``batch_limit``: the most steps one forward takes."""

    def __init__(self, batch: Callable[[list[StepRequest]], list] | None = None, batch_limit: int = 1):
        self.batch = batch
        self.batch_limit = batch_limit if batch is not None else 1
        self._cond = threading.Condition(threading.Lock())
        self._holder: int | None = None
        self._depth = 0
        self._background = False
        self._waiters: collections.deque[Waiter] = collections.deque()
        self._jobs: list[Job] = []
        self._running = False  # the loop is computing a forward: no thread may take the session now
        self._thread: threading.Thread | None = None
        self._closing = False
        self._cancels: dict[int, Cancel] = {}  # by thread: the cancellable blocks open now
        self._stopping = False  # stop(): every job not yet run is withdrawn
        _LOOPS.add(self)
        #: forwards run, by the steps each batched (1: a lone step or a forward of a closure)
        self.batch_sizes: collections.Counter[int] = collections.Counter()
        self.forwards = 0
        self.busy_s = 0.0  # seconds the loop spent computing forwards (the rest it waited for work)
        self.handovers = 0  # sessions let go while a job ran, so another thread took the engine

    # --- sessions

    @contextlib.contextmanager
    def session(self, background: bool = False) -> Iterator[Scheduler]:
        """The engine's state for this thread for the block (re-entrant; ``background``: a forget's
        replay, which gets the session only when no foreground thread waits for it)."""
        me = threading.get_ident()
        with self._cond:
            if self._holder == me:
                self._depth += 1
            else:
                self._wait_session(Waiter(me, background))
        try:
            yield self
        finally:
            with self._cond:
                self._depth -= 1
                if self._depth == 0:
                    self._holder = None
                    self._cond.notify_all()

    def get_waiting(self) -> int:
        """Threads waiting for the session now (at their start, or back from a step)."""
        with self._cond:
            return len(self._waiters)

    def get_queued(self) -> int:
        """Threads waiting for the session or for a job of theirs not yet started, now."""
        with self._cond:
            return len(self._waiters) + len(self._jobs)

    def holds(self) -> bool:
        """Whether the calling thread holds the session."""
        return self._holder == threading.get_ident()

    # --- work

    def get_stats(self) -> dict:
        """Forwards run, batch sizes (``{steps: forwards}``), seconds spent computing them and
        hand-overs, so far."""
        with self._cond:  # the loop counts under it (a scrape reads from another thread)
            return {"forwards": self.forwards, "batch_sizes": dict(sorted(self.batch_sizes.items())),
                    "busy_s": self.busy_s, "handovers": self.handovers}

    # --- cancelling

    @contextlib.contextmanager
    def cancellable(self) -> Iterator[Cancel]:
        """A block whose forwards stop once the yielded :class:`Cancel` is set (the module docstring)."""
        cancel = Cancel(self, threading.get_ident())
        with self._cond:
            self._cancels[cancel.thread] = cancel
        try:
            yield cancel
        finally:
            with self._cond:
                if self._cancels.get(cancel.thread) is cancel:
                    del self._cancels[cancel.thread]

    def cancel(self, cancel: Cancel) -> None:
        """Stop ``cancel``'s block at its next forward (nothing once the block has ended)."""
        with self._cond:
            cancel.is_set = True
            self._cond.notify_all()

    def stop(self, stopping: bool = True) -> None:
        """Withdraw every job not yet run, from now until ``stop(False)``: its thread raises
        :class:`Cancelled` (the server is shutting down: no turn waits for its end)."""
        with self._cond:
            self._stopping = stopping
            self._cond.notify_all()

    def _check_cancelled(self, job: Job) -> None:
        """Raise :class:`Cancelled` where ``job`` has not started and its work is cancelled (a
        block's cancel once: it is cleared as it is raised)."""
        cancel = self._cancels.get(job.thread)
        if job not in self._jobs or not (self._stopping or (cancel is not None and cancel.is_set)):
            return
        if cancel is not None:
            cancel.is_set = False
        raise Cancelled("the server is shutting down" if self._stopping else "the request was cancelled")

    # --- inside

    def _background_of_caller(self) -> bool:
        return self._background if self.holds() else False

    def run(self, fn: Callable[..., Any], *args, release: bool = False, step: StepRequest | None = None) -> Any:
        """``fn(*args)`` computed by the loop (a forward), for the calling thread. ``release``: let go
        of the session while it waits (a turn's forward: its lineage is its own), taking it back
        after; ``step``: the forward is this one-token step, which the loop may batch with others."""
        job = Job(threading.get_ident(), self._background_of_caller(), fn, args, step, release)
        with self._cond:
            self._start()
            if job.release and self._holder == job.thread:
                job.depth, self._holder, self._depth = self._depth, None, 0
                self.handovers += 1
            self._jobs.append(job)
            self._cond.notify_all()
            try:
                while not job.done:
                    self._check_cancelled(job)
                    self._cond.wait()
            except BaseException:  # interrupted: withdrawn if not started, and the session taken back
                if job in self._jobs:
                    self._jobs.remove(job)
                if job.depth and job.waiter is None:
                    depth, job.depth = job.depth, 0  # the loop must not queue it again
                    self._wait_session(Waiter(job.thread, job.background, depth))
                raise
            finally:
                if job.waiter is not None:
                    self._take_session(job.waiter)
        if job.error is not None:
            raise job.error
        return job.result

    def _wait_session(self, entry: Waiter) -> None:
        """Queue for the session and take it when free and ``entry`` is next (the condition held)."""
        self._waiters.append(entry)
        self._cond.notify_all()
        self._take_session(entry)

    def _take_session(self, entry: Waiter) -> None:
        """Wait, queued as ``entry``, until the session is free and ``entry`` is next; take it."""
        try:
            while self._holder is not None or self._running or self._next_waiter() is not entry:
                self._cond.wait()
        finally:
            self._waiters.remove(entry)
        self._holder, self._depth, self._background = entry.thread, entry.depth, entry.background
        self._cond.notify_all()

    def _next_waiter(self) -> Waiter:
        for waiter in self._waiters:
            if not waiter.background:
                return waiter
        return self._waiters[0]

    def close(self) -> None:
        """End the loop's thread once it is idle (at exit; a later job starts another)."""
        with self._cond:
            self._closing, thread = True, self._thread
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
        with self._cond:
            self._closing = False

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="unsee-engine-loop", daemon=True)
            self._thread.start()

    def _state(self) -> LoopState:
        holder_waits = any(j.thread == self._holder for j in self._jobs)
        return LoopState(self._holder, holder_waits, tuple(self._waiters), tuple(self._jobs), self.batch_limit)

    def _loop(self) -> None:
        """Schedule, execute, update, until idle for :data:`IDLE_S` (the thread then ends, so an
        engine no one uses holds none; the next job starts another)."""
        try:
            while self._iterate():
                pass
        except BaseException as e:  # noqa: BLE001 (a bug in scheduling: every waiting job hears it, none hangs)
            with self._cond:
                for job in self._jobs:
                    job.error, job.done = e, True
                self._jobs.clear()
                self._running, self._thread = False, None
                self._cond.notify_all()

    def _iterate(self) -> bool:
        """One iteration: wait for runnable jobs, run them as one forward, hand back the results;
        False once idle for :data:`IDLE_S` (the thread ends)."""
        with self._cond:
            jobs = get_next(self._state())
            while not jobs:
                if (not self._cond.wait(IDLE_S) and not self._jobs) or self._closing:
                    self._thread = None
                    return False
                jobs = get_next(self._state())
            for job in jobs:
                self._jobs.remove(job)
            self._running = True
        seconds = self._execute(jobs)
        with self._cond:
            self._running = False
            self.busy_s += seconds
            self.forwards += 1
            self.batch_sizes[len(jobs)] += 1
            for job in jobs:
                job.done = True
                if job.depth:  # queued for the session now, so that nothing runs before it is back
                    job.waiter = Waiter(job.thread, job.background, job.depth)
                    self._waiters.append(job.waiter)
            self._cond.notify_all()
        return True

    def _execute(self, jobs: list[Job]) -> float:
        """Run ``jobs`` as one forward, each given its result or the forward's error; its seconds."""
        started = time.perf_counter()
        try:
            _acting.thread = jobs[0].thread
            if len(jobs) == 1:
                jobs[0].result = jobs[0].fn(*jobs[0].args)
            else:
                for job, out in zip(jobs, self.batch([j.step for j in jobs]), strict=True):
                    job.result = out
        except BaseException as e:  # noqa: BLE001 (each job's own thread raises it; the loop goes on)
            for job in jobs:
                job.error = e
        finally:
            _acting.thread = None
        return time.perf_counter() - started


@atexit.register
def close_loops() -> None:
    """End every loop's thread (before the interpreter frees what they compute on)."""
    for loop in list(_LOOPS):
        loop.close()


__all__ = ["IDLE_S", "Cancel", "Cancelled", "Job", "LoopState", "Scheduler", "StepRequest", "Waiter", "close_loops", "get_batch", "get_next", "get_requester"]
