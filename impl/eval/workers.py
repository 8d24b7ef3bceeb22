"""The eval parent's side of its worker processes: collect their messages, and notice a death.

Each worker puts ``(kind, index, payload)`` on one queue: ``("row", i, row)`` per
finished row, then ``("done", i, None)``, or ``("error", i, text)`` where it raised.
A worker the system kills (the OOM killer, a signal) says nothing more, so the parent
never waits on the queue unboundedly: between messages it looks, every ``poll_s``
seconds, for a worker that has ended without its last word. The rows that worker sent
before it died are taken first (they are in the queue by the time it has exited), the
other workers run to their end, and the run then fails naming the dead worker, its exit
code and signal, with every finished row kept.

The other way round, a worker never outlives its parent: a worker that finds its parent
gone (killed by any signal, SIGKILL included, which no handler sees) exits at once
(:func:`run_watched`), and a parent stopped by SIGINT, SIGTERM or SIGHUP ends its
workers before it exits (:func:`stopping_on_signals`). Without both, an interrupted
``unsee eval --workers 2`` left its workers running as orphans, each holding a core
and a model.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue as queue_module
import signal
import threading
from collections.abc import Callable, Iterator, Sequence

#: seconds between the parent's looks at its workers while the queue is quiet
POLL_S = 1.0


class WorkerError(RuntimeError):
    """A worker raised or died before finishing its cases; the rows it finished are kept."""


def describe_exit(exitcode: int | None) -> str:
    """A process's exit status in words (a negative code is the signal that ended it)."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def collect(queue, workers: Sequence, emit: Callable[[dict], None], poll_s: float = POLL_S) -> list[str]:
    """Emit every row the ``workers`` (started processes) put on ``queue`` until each has
    said done, raised or died; the errors, in words (empty when all finished)."""
    pending = set(range(len(workers)))
    errors: list[str] = []
    rows = [0] * len(workers)

    def take(message) -> None:
        kind, index, payload = message
        if kind == "row":
            rows[index] += 1
            emit(payload)
            return
        pending.discard(index)
        if kind == "error":
            errors.append(f"worker {index}: {payload}")

    while pending:
        try:
            take(queue.get(timeout=poll_s))
            continue
        except queue_module.Empty:
            pass
        dead = [i for i in pending if not workers[i].is_alive()]
        if not dead:
            continue
        drain(queue, take)  # what the dead sent before they died
        for i in dead:
            if i in pending:
                pending.discard(i)
                errors.append(f"worker {i} (pid {workers[i].pid}) ended, {describe_exit(workers[i].exitcode)}, "
                              f"before finishing its cases ({rows[i]} of its rows were finished and kept)")
    return errors


def drain(queue, take: Callable) -> None:
    """Take every message already in ``queue``."""
    while True:
        try:
            take(queue.get_nowait())
        except queue_module.Empty:
            return


def join_all(workers: Sequence, timeout_s: float = 5.0) -> None:
    """Wait a little for each worker to exit; end any still running (after an error in the parent)."""
    for w in workers:
        w.join(timeout=timeout_s)
        if w.is_alive():
            w.terminate()
            w.join(timeout=timeout_s)


def stop_all(workers: Sequence, timeout_s: float = 5.0) -> None:
    """End every worker still running now, without waiting for its cases (the parent is being stopped)."""
    for w in workers:
        if w.is_alive():
            w.terminate()
    for w in workers:
        w.join(timeout=timeout_s)
        if w.is_alive():
            w.kill()
            w.join(timeout=timeout_s)


class Stopped(KeyboardInterrupt):
    """The parent received a stopping signal (SIGTERM, SIGHUP) while it collected; an
    interrupt like Ctrl-C, so the CLI reports the rows kept the same way."""


@contextlib.contextmanager
def stopping_on_signals(signals: Sequence[int] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Within the block, a stopping signal raises :class:`Stopped` instead of ending the
    process at once, so that the caller's ``finally`` runs and ends the workers
    (Python's default for SIGTERM skips every ``finally`` and ``atexit``, so daemon
    workers survive it). SIGINT already raises KeyboardInterrupt. Outside the main
    thread, where handlers cannot be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped(f"stopped by {signal.Signals(signum).name}")

    previous = {s: signal.signal(s, stop) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def watch_parent(poll_s: float | None = None) -> threading.Thread | None:
    """In a worker: a daemon thread that exits the process as soon as its parent has
    ended. It waits on the parent's sentinel, which the system closes however the
    parent ended. None in a process that has no multiprocessing parent."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return None

    def wait() -> None:
        from multiprocessing.connection import wait as wait_for

        while not wait_for([parent.sentinel], timeout=poll_s):
            pass
        # at once, no cleanup: the parent that would collect this worker's rows is gone
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=wait, name="unsee-watch-parent", daemon=True)
    thread.start()
    return thread


def run_watched(target: Callable, *args) -> None:
    """A worker's entry point: ``target(*args)``, ending when its parent ends."""
    watch_parent()
    target(*args)


def raise_errors(errors: Sequence[str], path_hint: str = "rows.jsonl") -> None:
    """The run's end where a worker failed: one error naming each, the finished rows kept."""
    if errors:
        raise WorkerError("evaluation worker failed: " + "; ".join(errors)
                          + f". The finished rows are kept in {path_hint}; run the same command again to resume")


__all__ = ["POLL_S", "Stopped", "WorkerError", "collect", "describe_exit", "drain", "join_all", "raise_errors",
           "run_watched", "stop_all", "stopping_on_signals", "watch_parent"]
