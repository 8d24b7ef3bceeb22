"""The server's engine lock (impl/serve/engine_lock.py): handed over between
forwards, in arrival order, foreground requests before a forget's replay."""

from __future__ import annotations

import threading
import time

import pytest

from unsee.impl.serve.engine_lock import EngineLock


def start(target) -> threading.Thread:
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def wait_queued(lock: EngineLock, n: int) -> None:
    """Until ``n`` threads wait for ``lock`` (bounded: a test fails, never hangs)."""
    deadline = time.monotonic() + 10
    while len(lock._queue) < n:
        assert time.monotonic() < deadline, f"{len(lock._queue)} of {n} waiters queued"
        time.sleep(0.001)


def test_share_without_waiters_keeps_the_engine():
    lock = EngineLock(slice_s=0.0)
    with lock.held():
        lock.share()
        lock.share()
    assert lock.handovers == 0


def test_share_in_a_thread_that_does_not_hold_it_does_nothing():
    lock = EngineLock(slice_s=0.0)
    lock.share()
    assert lock.handovers == 0


def test_it_is_reentrant_and_refuses_a_release_by_another_thread():
    lock = EngineLock()
    with lock.held(), lock.held():
        pass
    with lock.held():
        errors = []

        def other():
            try:
                lock.release()
            except RuntimeError as e:
                errors.append(e)
        start(other).join()
    assert errors and "does not hold" in str(errors[0])


def test_a_background_holder_steps_aside_at_its_next_forward_for_a_response():
    lock, order = EngineLock(slice_s=10.0), []  # the slice does not apply to background work
    with lock.held(background=True):
        order.append("replay forward 1")

        def response():
            with lock.held():
                order.append("response")
        t = start(response)
        wait_queued(lock, 1)
        lock.share()  # between the replay's forwards
        order.append("replay forward 2")
    t.join(10)
    assert order == ["replay forward 1", "response", "replay forward 2"] and lock.handovers == 1


def test_a_response_never_steps_aside_for_a_background_waiter():
    lock, order = EngineLock(slice_s=0.0), []
    with lock.held():

        def replay():
            with lock.held(background=True):
                order.append("replay")
        t = start(replay)
        wait_queued(lock, 1)
        lock.share()
        order.append("response forward 2")
    t.join(10)
    assert order == ["response forward 2", "replay"] and lock.handovers == 0


def test_a_response_keeps_the_engine_for_its_slice_then_hands_it_over():
    lock, order = EngineLock(slice_s=3600.0), []
    with lock.held():
        t = start(lambda: (lock.acquire(), order.append("other"), lock.release()))
        wait_queued(lock, 1)
        lock.share()  # the slice is not spent yet
        order.append("mine 1")
        lock.slice_s = 0.0  # now it is (no clock in the test: a loaded machine cannot reorder it)
        lock.share()  # the waiter runs, then this thread goes on
        order.append("mine 2")
    t.join(10)
    assert order == ["mine 1", "other", "mine 2"]


@pytest.mark.parametrize("background_first", [True, False])
def test_waiters_get_the_engine_foreground_first_then_in_arrival_order(background_first):
    lock, order = EngineLock(), []

    def make(name, background):
        def run():
            with lock.held(background):
                order.append(name)
        return run
    with lock.held():
        names = (["bg", "a", "b"] if background_first else ["a", "bg", "b"])
        threads = []
        for i, name in enumerate(names):
            threads.append(start(make(name, name == "bg")))
            wait_queued(lock, i + 1)
    for t in threads:
        t.join(10)
    assert order == ["a", "b", "bg"]


class Batch:
    """A stand-in for the engine's pending decode steps: each thread adds one; a flush runs them all."""

    def __init__(self):
        self.pending: list[tuple[str, int]] = []  # (step, its thread)
        self.done: set[str] = set()
        self.flushes: list[list[str]] = []

    def add(self, name: str):
        self.pending.append((name, threading.get_ident()))
        return lambda: name in self.done

    def flush(self, skip=()) -> None:
        ran = sorted(name for name, thread in self.pending if thread not in skip)
        self.flushes.append(ran)
        self.done.update(ran)
        self.pending = [(name, thread) for name, thread in self.pending if thread in skip]


def test_gather_lets_every_waiter_reach_its_step_and_runs_one_batch():
    """Three requests, each at a decode step: the holder hands the engine to the two that wait,
    each adds its step and hands on, and the last one with no other waiter runs all three at once."""
    lock, batch, order = EngineLock(slice_s=10.0), Batch(), []

    def request(name: str) -> None:
        with lock.held():
            done = batch.add(name)
            lock.gather(done, batch.flush)
            order.append(name)

    lock.acquire()
    others = [start(lambda n=n: request(n)) for n in ("b", "c")]
    wait_queued(lock, 2)
    done = batch.add("a")
    lock.gather(done, batch.flush)
    order.append("a")
    lock.release()
    for t in others:
        t.join(10)
    assert batch.flushes == [["a", "b", "c"]]
    assert sorted(order) == ["a", "b", "c"] and lock.handovers >= 2


def test_gather_alone_runs_its_step_at_once():
    lock, batch = EngineLock(), Batch()
    with lock.held():
        lock.gather(batch.add("a"), batch.flush)
    assert batch.flushes == [["a"]] and lock.handovers == 0


def test_gather_never_hands_a_foreground_step_to_background_work():
    """A forget's replay waiting for the engine does not delay a response's step: the response's
    batch runs without waiting for the replay to reach a step of its own."""
    lock, batch = EngineLock(slice_s=10.0), Batch()
    lock.acquire()
    replay = start(lambda: lock.acquire(background=True) or lock.release())
    wait_queued(lock, 1)
    lock.gather(batch.add("a"), batch.flush)
    assert batch.flushes == [["a"]] and lock.handovers == 0
    lock.release()
    replay.join(10)


def test_gather_in_a_thread_that_does_not_hold_it_is_refused():
    lock, batch = EngineLock(), Batch()
    with pytest.raises(RuntimeError, match="does not hold"):
        lock.gather(batch.add("a"), batch.flush)


def test_a_responses_batch_leaves_a_forgets_step_out():
    """A replay at its step hands the engine to a response (as background work does); the
    response's batch is its own step alone, and the replay's runs once the response lets go."""
    lock, batch, holding = EngineLock(slice_s=10.0), Batch(), threading.Event()

    def replay() -> None:
        with lock.held(background=True):
            holding.set()
            wait_queued(lock, 1)  # the response below waits for the engine
            lock.gather(batch.add("replay"), batch.flush)

    t = start(replay)
    assert holding.wait(10)
    with lock.held():  # the response gets the engine when the replay reaches its step
        assert batch.pending and not batch.flushes
        lock.gather(batch.add("response"), batch.flush)
        assert batch.flushes == [["response"]]
    t.join(10)
    assert batch.flushes == [["response"], ["replay"]]
