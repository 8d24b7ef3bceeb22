"""The eval parent never waits unboundedly on a worker (impl/eval/workers.py): a worker the
system kills ends the run with an error naming it, and the rows it finished are kept."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from unsee.impl.eval.workers import WorkerError, collect, describe_exit, join_all, raise_errors


def start_sleepers(n: int):
    """``n`` spawned processes that say nothing (stand-ins for workers mid-case), and a queue."""
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=time.sleep, args=(120,), daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    return context.Queue(), procs


def test_a_killed_worker_ends_the_collection_with_its_rows_kept():
    queue, (worker,) = start_sleepers(1)
    try:
        rows = [{"case": "c1", "method": "none"}, {"case": "c1", "method": "replay"}]
        for row in rows:  # what the worker finished before the system killed it
            queue.put(("row", 0, row))
        time.sleep(0.2)  # the queue's feeder has written them
        os.kill(worker.pid, signal.SIGKILL)
        emitted: list[dict] = []
        started = time.monotonic()
        errors = collect(queue, [worker], emitted.append, poll_s=0.1)
        assert time.monotonic() - started < 30
    finally:
        join_all([worker], timeout_s=1)
    assert emitted == rows
    (error,) = errors
    assert "worker 0" in error and "SIGKILL" in error and "2 of its rows" in error
    with pytest.raises(WorkerError, match="SIGKILL.*run the same command again"):
        raise_errors(errors)


def test_the_others_finish_when_one_dies():
    queue, (dead, alive) = start_sleepers(2)
    try:
        os.kill(dead.pid, signal.SIGKILL)
        queue.put(("row", 1, {"case": "c2"}))
        queue.put(("done", 1, None))
        emitted: list[dict] = []
        errors = collect(queue, [dead, alive], emitted.append, poll_s=0.1)
    finally:
        join_all([dead, alive], timeout_s=1)
    assert emitted == [{"case": "c2"}] and len(errors) == 1 and errors[0].startswith("worker 0")


def test_a_worker_that_raised_is_reported_and_one_that_finished_is_not():
    queue, (a, b) = start_sleepers(2)
    try:
        queue.put(("error", 0, "MemoryError: "))
        queue.put(("done", 1, None))
        assert collect(queue, [a, b], lambda row: None, poll_s=0.1) == ["worker 0: MemoryError: "]
    finally:
        join_all([a, b], timeout_s=1)
    assert not a.is_alive() and not b.is_alive()  # join_all ends what still runs


def test_describe_exit():
    assert describe_exit(-9) == "killed by signal SIGKILL" and describe_exit(1) == "exit code 1"
