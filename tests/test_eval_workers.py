"""The eval parent never waits unboundedly on a worker (impl/eval/workers.py): a worker the
system kills ends the run with an error naming it, and the rows it finished are kept."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from unsee.impl.eval.workers import WorkerError, collect, describe_exit, join_all, raise_errors, stopping_on_signals


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


# --- a worker never outlives its parent --------------------------------------------------

PARENT = """
import multiprocessing, signal, sys, time
from unsee.impl.eval.workers import collect, run_watched, stop_all, stopping_on_signals

if __name__ == "__main__":
    # Ctrl-C's KeyboardInterrupt, whatever this process inherited: a shell starts a
    # background job (pytest under `make test &`, a CI runner's) with SIGINT ignored, and
    # Python keeps an inherited SIG_IGN, so the test's SIGINT would never arrive
    signal.signal(signal.SIGINT, signal.default_int_handler)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    target = run_watched if sys.argv[1] == "watched" else time.sleep
    args = (time.sleep, 120) if sys.argv[1] == "watched" else (120,)
    worker = context.Process(target=target, args=args, daemon=True)
    with stopping_on_signals():
        worker.start()
        print(worker.pid, flush=True)
        try:
            collect(queue, [worker], lambda row: None, poll_s=0.1)
        except BaseException:
            if sys.argv[2] == "stop":
                stop_all([worker])
            raise
"""


def is_running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie waits for a reaper here)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not is_running(pid):
            return True
        time.sleep(0.1)
    return False


def start_parent(tmp_path, kind: str, on_error: str):
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), kind, on_error], stdout=subprocess.PIPE, text=True,
                              stderr=subprocess.DEVNULL)
    worker_pid = int(parent.stdout.readline())
    return parent, worker_pid


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads process states from /proc")
@pytest.mark.parametrize("kind, expect_gone", [("watched", True), ("unwatched", False)])
def test_a_worker_ends_when_its_parent_is_killed(tmp_path, kind, expect_gone):
    # SIGKILL: no handler, no finally in the parent; only the worker's own watch ends it
    parent, worker = start_parent(tmp_path, kind, "keep")
    try:
        time.sleep(0.5)
        parent.kill()
        parent.wait()
        assert wait_gone(worker, 10) is expect_gone
    finally:
        if is_running(worker):
            os.kill(worker, signal.SIGKILL)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads process states from /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_parent_ends_its_workers(tmp_path, sig):
    # an unwatched worker: only the parent's handler and stop_all can end it
    parent, worker = start_parent(tmp_path, "unwatched", "stop")
    try:
        time.sleep(0.5)
        parent.send_signal(sig)
        assert parent.wait(timeout=30) != 0
        assert wait_gone(worker, 10)
    finally:
        if is_running(worker):
            os.kill(worker, signal.SIGKILL)


def test_stopping_on_signals_restores_the_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with stopping_on_signals():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
