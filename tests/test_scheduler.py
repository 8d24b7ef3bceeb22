"""The engine's loop (impl/engines/scheduler.py; issue 50) with a fake backend and no HTTP:
what it decides (:func:`get_next`, a pure function), and threads through it: ready decode
steps batched, turns interleaved forward by forward, a replay yielding to a live turn,
forwards heard by the thread that asked, an error kept to its own request, and the budget
sparing each thread's lineage (no cursor shared by threads)."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from unsee.impl.engines.scheduler import (
    Cancelled,
    Job,
    LoopState,
    Scheduler,
    StepRequest,
    Waiter,
    get_next,
    get_requester,
)


class FakeRows:
    """A backend of lineages that are token lists; the logits after a lineage are a function of
    its tokens alone (as llama.cpp's are of its own forwards). It logs every forward."""

    def __init__(self, first_waits_for: int = 0):
        self.log: list[list[tuple[str, int, int]]] = []  # forwards: [(handle, token, requester)]
        self.first_waits_for = first_waits_for  # the first forward waits for that many other threads' work
        self.scheduler: Scheduler | None = None
        self.lock = threading.Lock()  # a second thread in here at once is a bug the test sees
        self.fail = set()

    def logits(self, lin: list[int]) -> int:
        return hash(tuple(lin)) % 1000

    def single(self, step: StepRequest) -> int:
        return self.batch([step])[0]

    def batch(self, steps: list[StepRequest]) -> list[int]:
        assert self.lock.acquire(blocking=False), "two forwards at once"
        try:
            if not self.log and self.first_waits_for:
                deadline = time.monotonic() + 10
                while len(steps) + self.scheduler.get_queued() <= self.first_waits_for \
                        and time.monotonic() < deadline:
                    time.sleep(0.001)
            if any(s.handle in self.fail for s in steps):
                raise RuntimeError(f"forward failed for {sorted(s.handle for s in steps)}")
            self.log.append([(s.handle, s.token, get_requester() if len(steps) == 1 else s.thread) for s in steps])
            time.sleep(0.002)
            out = []
            for s in steps:
                s.lin.append(s.token)
                out.append(self.logits(s.lin))
            return out
        finally:
            self.lock.release()


def make(batch_limit: int = 4, first_waits_for: int = 0) -> tuple[Scheduler, FakeRows]:
    rows = FakeRows(first_waits_for)
    loop = Scheduler(rows.batch if batch_limit > 1 else None, batch_limit)
    rows.scheduler = loop
    return loop, rows


def step(loop: Scheduler, rows: FakeRows, handle: str, lin: list[int], token: int) -> int:
    """A decode step through the loop, as a turn submits one (batchable, the session let go of)."""
    request = StepRequest(handle, lin, token, threading.get_ident())
    return loop.run(rows.single, request, release=True, step=request)


def decode(loop: Scheduler, rows: FakeRows, handle: str, lin: list[int], n: int, background: bool = False) -> list[int]:
    """A turn: ``n`` steps, each token chosen from the logits (greedy over a fake vocabulary)."""
    out, token = [], 1
    with loop.session(background):
        for _ in range(n):
            token = step(loop, rows, handle, lin, token) % 50
            out.append(token)
    return out


def serially(n: int) -> list[int]:
    rows, lin, out, token = FakeRows(), [], [], 1
    for _ in range(n):
        token = rows.single(StepRequest("x", lin, token, 0)) % 50
        out.append(token)
    return out


def run_threads(*targets) -> None:
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)


# --- what the loop decides

def job(thread: int, handle: str | None = None, background: bool = False) -> Job:
    if handle is None:
        return Job(thread, background, fn=lambda: None)  # a prefill's forward
    return Job(thread, background, step=StepRequest(handle, [], 1, thread), release=True)


def test_nothing_runs_while_the_holder_computes_or_a_foreground_thread_is_about_to_join():
    jobs = [job(1, "a")]
    assert get_next(LoopState(holder=2, holder_waits=False, waiters=(), jobs=jobs)) == []
    assert get_next(LoopState(holder=None, holder_waits=False, waiters=(Waiter(2, False),), jobs=jobs)) == []
    assert get_next(LoopState(holder=None, holder_waits=False, waiters=(), jobs=jobs)) == jobs
    assert get_next(LoopState(holder=2, holder_waits=True, waiters=(), jobs=[*jobs, job(2)])) == jobs


def test_foreground_steps_run_before_background_ones_and_never_with_them():
    replay, turn = job(1, "r", background=True), job(2, "t")
    state = LoopState(None, False, (Waiter(1, True),), [replay, turn], batch_limit=4)
    assert get_next(state) == [turn]  # the replay's waiter does not hold the turn back
    assert get_next(LoopState(None, False, (), [replay], batch_limit=4)) == [replay]
    assert get_next(LoopState(None, False, (Waiter(3, True),), [replay], batch_limit=4)) == []


def test_ready_steps_batch_one_per_lineage_up_to_the_limit_and_a_closure_runs_alone():
    steps = [job(1, "a"), job(2, "b"), job(3, "a"), job(4, "c"), job(5, "d")]
    assert get_next(LoopState(None, False, (), steps, batch_limit=3)) == [steps[0], steps[1], steps[3]]
    assert get_next(LoopState(None, False, (), steps, batch_limit=1)) == [steps[0]]
    solo = job(9)
    assert get_next(LoopState(None, False, (), [solo, *steps], batch_limit=3)) == [solo]


def chunk(thread: int, handle: str, n: int) -> Job:
    """A prefill chunk of ``n`` tokens, batchable (short enough that its rows are the same however
    it is cut)."""
    return Job(thread, False, step=StepRequest(handle, [], 1, thread, (1,) * n), release=True)


def test_prefill_chunks_batch_with_chunks_and_decode_steps_with_steps_never_mixed():
    a, b, c, d = chunk(1, "a", 35), job(2, "b"), chunk(3, "c", 3), chunk(4, "a", 2)
    jobs = [a, b, c, d]
    assert get_next(LoopState(None, False, (), jobs, batch_limit=8)) == [a, c]  # one chunk a lineage
    assert get_next(LoopState(None, False, (), [b, a, c], batch_limit=8)) == [b]  # a step first: steps only
    assert get_next(LoopState(None, False, (), [c, d], batch_limit=1)) == [c]
    assert StepRequest("a", [], 7, 0).tokens == (7,) and a.step.tokens == (1,) * 35


# --- threads through the loop

def test_ready_decode_steps_of_three_turns_share_forwards_and_each_equals_its_serial_run():
    loop, rows = make(batch_limit=4, first_waits_for=2)
    got = {}
    run_threads(*[lambda h=h: got.__setitem__(h, decode(loop, rows, h, [], 6)) for h in "abc"])
    assert got == {h: serially(6) for h in "abc"}
    assert max(len(f) for f in rows.log) == 3 and loop.get_stats()["batch_sizes"].get(3, 0) >= 5
    for forward in rows.log:  # each step heard by the thread that asked for it, one step a lineage
        assert len({h for h, _, _ in forward}) == len(forward)


def test_without_batching_two_turns_alternate_forward_by_forward():
    loop, rows = make(batch_limit=1, first_waits_for=1)
    run_threads(lambda: decode(loop, rows, "a", [], 5), lambda: decode(loop, rows, "b", [], 5))
    order = [f[0][0] for f in rows.log]
    assert sorted(order) == ["a"] * 5 + ["b"] * 5
    assert all(x != y for x, y in itertools.pairwise(order[1:]))  # after the first, round robin


def test_a_replay_yields_to_a_live_turn_at_its_next_forward():
    loop, rows = make(batch_limit=4)
    started = threading.Event()
    replay_out = []

    def replay():
        with loop.session(background=True):
            lin, token = [], 1
            for i in range(40):
                token = step(loop, rows, "replay", lin, token) % 50
                if i == 2:
                    started.set()
            replay_out.append(len(lin))

    def turn():
        started.wait(10)
        decode(loop, rows, "turn", [], 5)
    run_threads(replay, turn)
    handles = [[h for h, _, _ in f] for f in rows.log]
    assert all(len(f) == 1 for f in handles)  # never in one forward together
    first = next(i for i, f in enumerate(handles) if f == ["turn"])
    assert [f[0] for f in handles[first:first + 5]] == ["turn"] * 5  # the turn ran through, unslowed
    assert replay_out == [40]


def test_an_error_in_one_request_is_its_own_and_the_loop_goes_on():
    loop, rows = make(batch_limit=1)
    rows.fail.add("bad")
    errors, got = [], {}

    def bad():
        try:
            decode(loop, rows, "bad", [], 3)
        except RuntimeError as e:
            errors.append(str(e))
    run_threads(bad, lambda: got.__setitem__("good", decode(loop, rows, "good", [], 4)))
    assert errors == ["forward failed for ['bad']"] and got == {"good": serially(4)}
    assert decode(loop, rows, "after", [], 2) == serially(2)


def test_a_closure_runs_on_the_loop_for_the_thread_that_asked():
    loop, _ = make()
    me = threading.get_ident()
    assert loop.run(lambda: (threading.get_ident() != me, get_requester() == me)) == (True, True)
    with loop.session(), loop.session():  # re-entrant
        assert loop.holds() and loop.run(max, 3, 7, release=True) == 7 and loop.holds()
    assert not loop.holds()


def test_the_budget_spares_each_threads_lineage_not_only_the_last_ones(engine_factory):
    """Two threads at work on lineages of their own under a budget of 0: the other thread's
    verb enforces the budget, and neither thread's lineage is evicted under it."""
    from unsee.impl.engines.llamacpp import engine as llamacpp

    engine = engine_factory("llamacpp-tiny" if llamacpp.available() else "tiny")
    engine.budget.set(0)
    ids = engine.lm.encode("A lineage a thread is working on")
    mine, gate, done = engine.new_lineage(), threading.Event(), threading.Event()
    engine.prefill(mine, ids)

    def other():
        h = engine.new_lineage()
        engine.prefill(h, ids)  # enforces the budget: only this thread's own lineage is spared by it
        gate.set()
        done.wait(10)
    t = threading.Thread(target=other)
    t.start()
    gate.wait(10)
    try:
        assert mine in engine.budget.lineages  # spared for this thread, whatever the other one did
        engine.prefill(mine, ids)
    finally:
        done.set()
        t.join(10)


@pytest.mark.parametrize("slots", [1, 3])
def test_three_turns_on_llamacpp_through_the_loop_equal_each_turn_alone(engine_factory, slots):
    from unsee.impl.engines.llamacpp import engine as llamacpp

    if not llamacpp.available():
        pytest.skip("llama-cpp-python is not installed")
    alone = engine_factory("llamacpp-tiny", n_ctx=512)
    engine = engine_factory("llamacpp-tiny", n_ctx=512, slots=slots)
    prompts = [[5 + i, 40, 77 + 3 * i] * (1 + 20 * i) for i in range(3)]
    expected = []
    for p in prompts:
        h = alone.new_lineage()
        alone.prefill(h, p)
        expected.append((alone.generate(h, 8, stop_ids=()), alone.digest(h)))
    handles = [engine.new_lineage() for _ in prompts]
    got = {}

    def turn(i):
        with engine.scheduler.session():
            engine.prefill(handles[i], prompts[i])
            out = engine.generate(handles[i], 8, stop_ids=())
            got[i] = (out, engine.digest(handles[i]))
    run_threads(*[lambda i=i: turn(i) for i in range(3)])
    assert [got[i] for i in range(3)] == expected
    if slots == 1:  # one slot: every step alone (with more, how many meet in a forward is timing)
        assert max(engine.scheduler.get_stats()["batch_sizes"]) == 1


def test_turns_that_start_together_on_llamacpp_prefill_in_one_forward_each_equal_to_its_own(engine_factory):
    """Three threads queued for the session when it is let go of: each submits its prefill chunk
    (at most ``max_forward`` tokens) and lets go, so the loop computes the three in one forward,
    and each lineage's logits and KV equal its prefill alone; a chunk over ``max_forward`` (its rows
    depend on how it is cut) is a forward of its own."""
    from unsee.impl.engines.llamacpp import engine as llamacpp

    if not llamacpp.available():
        pytest.skip("llama-cpp-python is not installed")
    alone = engine_factory("llamacpp-tiny", n_ctx=512)
    engine = engine_factory("llamacpp-tiny", n_ctx=512, slots=4)
    cap = engine.max_forward
    prompts = [[5 + i, 40, 77 + 3 * i] * n for i, n in enumerate((4, 11, cap // 3, cap))]
    expected = []
    for p in prompts:
        h = alone.new_lineage()
        alone.prefill(h, p)
        expected.append((alone.logits(h).numpy().tobytes(), alone.digest(h)))
    handles = [engine.new_lineage() for _ in prompts]
    got = {}

    def turn(i):
        with engine.scheduler.session():
            engine.prefill(handles[i], prompts[i])
            got[i] = (engine.logits(handles[i]).numpy().tobytes(), engine.digest(handles[i]))
    threads = [threading.Thread(target=turn, args=(i,)) for i in range(len(prompts))]
    with engine.scheduler.session():
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while engine.scheduler.get_waiting() < len(threads) and time.monotonic() < deadline:
            time.sleep(0.01)
    for t in threads:
        t.join(30)
    assert [got[i] for i in range(len(prompts))] == expected
    assert engine.scheduler.get_stats()["batch_sizes"] == {1: 1, 3: 1}


def test_a_cancelled_block_withdraws_its_next_job_once_and_a_stop_withdraws_every_job():
    """Cancelling (serve: the client left): the job not yet run is withdrawn and its thread raises
    Cancelled once (its clean-up may still compute); a forward never runs for it; after the
    block, setting its Cancel changes nothing. ``stop()`` withdraws every job until ``stop(False)``."""
    loop, rows = make(batch_limit=1)
    lin: list[int] = []
    step = StepRequest("a", lin, 1, threading.get_ident())
    with loop.session(), loop.cancellable() as cancel:
        loop.run(rows.single, step, release=True)
        cancel.set()
        with pytest.raises(Cancelled):
            loop.run(rows.single, step, release=True)
        assert len(rows.log) == 1 and loop.holds()  # not run, and the session is back
        loop.run(rows.single, step, release=True)  # once: the clean-up computes
    cancel.set()  # the block ended: nothing to cancel
    with loop.session():
        loop.run(rows.single, step, release=True)
    assert len(rows.log) == 3
    loop.stop()
    with pytest.raises(Cancelled), loop.session():
        loop.run(rows.single, step, release=True)
    with pytest.raises(Cancelled):
        loop.run(rows.single, step)
    loop.stop(False)
    loop.run(rows.single, step)
    assert len(rows.log) == 4
