"""An engine shared by a server's threads (issues 40, 50; impl/engines/scheduler.py):
each thread counts and hears its own forwards, its own prefix cache; a forward
hook reads the lineage with the forward's tokens in it; and a turn's forwards
interleaved with another lineage's give the bits of the turn run alone."""

from __future__ import annotations

import threading

import pytest

from unsee.impl.engines.llamacpp import engine as llamacpp
from unsee.impl.engines.protocol import PendingChunks

MODELS = ["tiny", pytest.param("llamacpp-tiny", marks=pytest.mark.skipif(
    not llamacpp.available(), reason="llama-cpp-python is not installed"))]


@pytest.fixture(params=MODELS)
def engine(request, engine_factory):
    return engine_factory(request.param) if request.param == "tiny" else engine_factory(request.param, n_ctx=512)


def fresh(engine, text: str) -> str:
    h = engine.new_lineage()
    engine.prefill(h, engine.lm.encode(text))
    if isinstance(engine, PendingChunks):  # computed now: a turn's forwards are then its own
        engine.flush(h)
    return h


def in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(60)
    return out[0]


def test_a_hook_reads_the_lineage_with_the_forwards_tokens_in_it(engine):
    h = fresh(engine, "Once upon a time")
    start, seen = len(engine.tokens(h)), []
    with engine.hook_forwards(lambda n, _: seen.append(len(engine.tokens(h)) - start)):
        out = engine.generate(h, 5, stop_ids=())
    # decode forward k feeds decided token k: a streaming listener sees it right then
    assert seen[:len(out) - 1] == list(range(1, len(out)))


def test_counters_and_hooks_are_the_calling_threads(engine):
    heard = []
    before = engine.counters.snapshot()
    with engine.hook_forwards(lambda n, _: heard.append(n)):
        in_thread(lambda: engine.generate(fresh(engine, "Another thread's turn"), 4, stop_ids=()))
    assert engine.counters - before == type(before)() and heard == []

    def own_turn():
        start = engine.counters.snapshot()
        engine.generate(fresh(engine, "Its own"), 3, stop_ids=())
        return engine.counters - start
    assert in_thread(own_turn).forward_calls > 0  # the other thread counted its own


def test_a_turn_interleaved_forward_by_forward_with_another_equals_it_alone(engine):
    alone = fresh(engine, "The first conversation says hello")
    expected = engine.generate(alone, 6, stop_ids=())
    a = fresh(engine, "The first conversation says hello")
    b = fresh(engine, "A second one, longer, in another lineage of its own")
    b_alone = fresh(engine, "A second one, longer, in another lineage of its own")
    b_expected = engine.generate(b_alone, 6, stop_ids=())
    got, start = {}, threading.Barrier(2)

    def turn(name, handle):
        start.wait()
        with engine.scheduler.session():  # the loop hands the session over at every forward
            got[name] = engine.generate(handle, 6, stop_ids=())
    threads = [threading.Thread(target=turn, args=(n, h)) for n, h in (("a", a), ("b", b))]
    before = engine.scheduler.handovers
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == {"a": expected, "b": b_expected}
    assert engine.digest(a) == engine.digest(alone) and engine.digest(b) == engine.digest(b_alone)
    assert engine.scheduler.handovers - before >= 2 * 5  # each turn let go of the engine at its forwards


def test_a_threads_prefix_cache_serves_its_own_lineages_never_another_threads(engine):
    ids = engine.lm.encode("A block that two threads prefill alike")
    with engine.prefix_cache(sources=[]):
        other = in_thread(lambda: fresh(engine, "A block that two threads prefill alike"))  # made meanwhile
        before = engine.counters.snapshot()
        mine = engine.new_lineage()
        engine.prefill(mine, ids)
        assert (engine.counters - before).reused_tokens == 0  # not served from the other thread's lineage
        again = engine.new_lineage()
        engine.prefill(again, ids)
        assert (engine.counters - before).reused_tokens == len(ids)  # served from this thread's own
    assert engine.digest(mine) == engine.digest(other) == engine.digest(again)
