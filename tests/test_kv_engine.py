"""KVEngine's engine-level services on the tiny model (CPU, fp32):
copy-on-write prefixes (`share_prefix`), the KV budget (pins, LRU eviction,
honest byte counts) and the prefix cache that serves B5'."""

import gc
import os
import subprocess
import sys

import pytest

from unsee.impl.engines.counts import Counters
from unsee.impl.engines.lineage import EvictedLineageError, crop, rebuild
from unsee.impl.engines.registry import make_engine


def ids(lm, n, salt=""):
    """n token ids of chat-like text (the byte tokenizer: one id per byte)."""
    out = lm.encode(f"<|im_start|>user\n{salt}The quick brown fox jumps over the lazy dog. " * 8)
    assert len(out) >= n
    return out[:n]


def fresh(tiny_engine, *chunks):
    h = tiny_engine.new_lineage()
    for c in chunks:
        tiny_engine.prefill(h, c)
    return h


# ------------------------------------------------------------ share_prefix


def test_share_prefix_copies_nothing(tiny_engine, lm):
    x = ids(lm, 40)
    a = fresh(tiny_engine, x[:25], x[25:])
    held = tiny_engine.budget.memory().held_bytes
    b = tiny_engine.fork(a, 25)
    assert tiny_engine.budget.memory().held_bytes == held  # the same storages: nothing was copied
    assert tiny_engine.tokens(b) == x[:25] and len(tiny_engine.tokens(b)) == 25
    assert tiny_engine.digest(b) == tiny_engine.digest(fresh(tiny_engine, x[:25]))


@pytest.mark.parametrize("n", [0, 13, 25, 40])
def test_either_side_changing_leaves_the_other_alone(tiny_engine, lm, n):
    x, y = ids(lm, 40), ids(lm, 30, salt="other ")
    a = fresh(tiny_engine, x[:25], x[25:])
    b = tiny_engine.fork(a, n)
    da, db = tiny_engine.digest(a), tiny_engine.digest(b)
    # extend and crop the share: the source is unchanged
    tiny_engine.prefill(b, y[:7])
    b = crop(tiny_engine, b, max(0, n - 5))
    tiny_engine.prefill(b, y[7:20])
    assert tiny_engine.digest(a) == da and tiny_engine.tokens(a) == x
    # extend, crop and drop the source: the share is unchanged
    db2, tb2 = tiny_engine.digest(b), tiny_engine.tokens(b)
    tiny_engine.prefill(a, y[:3])
    a = crop(tiny_engine, a, n // 2)
    tiny_engine.prefill(a, y[:9])
    tiny_engine.drop(a)
    assert tiny_engine.digest(b) == db2 and tiny_engine.tokens(b) == tb2
    assert db != db2  # the share did change on its own side


def test_continued_share_equals_fresh_prefill(tiny_engine, lm):
    x = ids(lm, 60)
    a = fresh(tiny_engine, x[:20], x[20:45], x[45:])
    b = tiny_engine.fork(a, 45)  # a chunk boundary, like every checkpoint
    tiny_engine.prefill(b, x[45:52])
    g = tiny_engine.generate(b, 6, stop_ids=())
    ref = fresh(tiny_engine, x[:20], x[20:45], x[45:52])
    assert tiny_engine.generate(ref, 6, stop_ids=()) == g
    assert tiny_engine.digest(b) == tiny_engine.digest(ref) and tiny_engine.tokens(b) == tiny_engine.tokens(ref)


def test_whole_share_keeps_the_logits_and_errors_name_n(tiny_engine, lm):
    x = ids(lm, 20)
    a = fresh(tiny_engine, x)
    g = tiny_engine.generate(a, 4, stop_ids=())
    b = tiny_engine.fork(a)  # whole: can generate straight away
    c = tiny_engine.fork(a)
    g1 = tiny_engine.generate(b, 5, stop_ids=())
    assert tiny_engine.generate(c, 5, stop_ids=()) == g1 and len(g) == 4
    d = tiny_engine.fork(a, 10)
    with pytest.raises(RuntimeError, match="prefill first"):
        tiny_engine.generate(d, 2)
    for bad in (-1, 25, 1.5):
        with pytest.raises(ValueError, match=f"n_tokens={bad!r}"):
            tiny_engine.fork(a, bad)


# ------------------------------------------------------------------ budget


def test_budget_zero_keeps_only_pinned_and_current(lm):
    eng = make_engine(lm, kv_budget=0)
    x = ids(lm, 30)
    a = fresh(eng, x)
    pin = eng.budget.pin(a)
    b = fresh(eng, x[:10])  # a is pinned, b current: both stay
    c = fresh(eng, x[:12])  # b is neither now: evicted
    assert set(eng.budget.lineages) == {a, c} and eng.budget.is_evicted(b) and eng.budget.evicted == (b,)
    with pytest.raises(EvictedLineageError, match=f"{b}.*evicted"):
        eng.prefill(b, [1])
    del pin
    gc.collect()
    eng.budget.set(0)  # a pin dies with its last reference
    assert set(eng.budget.lineages) == {c}
    assert eng.budget.memory().unpinned_bytes == 0 and eng.budget.peak_unpinned_bytes == 0
    eng.drop(b)  # an evicted handle can be forgotten
    assert not eng.budget.is_evicted(b)


def test_budget_evicts_least_recently_used_first(lm):
    eng = make_engine(lm)
    x = ids(lm, 30)
    a, b, c = fresh(eng, x), fresh(eng, x[:20]), fresh(eng, x[:25])
    pin = eng.budget.pin(c)
    len(eng.tokens(a))  # a is now more recently used than b
    solo = make_engine(lm)
    fresh(solo, x)
    bytes_a = solo.budget.memory().held_bytes  # a holds storages of its own
    eng.budget.set(bytes_a)  # room for a alone: b, the least recently used, goes
    assert eng.budget.lineages == (a, c) and eng.budget.evicted == (b,)
    assert eng.budget.memory().unpinned_bytes == bytes_a == eng.budget.peak_unpinned_bytes
    eng.budget.set(bytes_a - 1)
    assert eng.budget.lineages == (c,) and pin.lineage == c


def test_the_budget_names_the_pinned_owners_to_release_least_recently_used_first(lm):
    """The one evictor (issue 50): owners of pinned lineages (a server's sessions) are named, by
    the lineages' one LRU clock, until the engine would hold at most the bound; storage an owner
    shares with a lineage it does not own frees nothing, and the budget releases nothing itself."""
    eng = make_engine(lm)
    x = ids(lm, 30)
    a, b, c = fresh(eng, x), fresh(eng, ids(lm, 30, "b")), fresh(eng, ids(lm, 30, "c"))
    pins = [eng.budget.pin(h) for h in (a, b, c)]
    shared = eng.fork(a, 30)  # unpinned, shares all of a's storage
    len(eng.tokens(b)), len(eng.tokens(a))  # c is now the least recently used, then b
    owners = [("A", {a}), ("B", {b, "not-a-lineage"}), ("C", {c})]
    held = eng.budget.memory().held_bytes
    assert eng.budget.get_releases(owners) == []  # no bound
    eng.budget.limit = held  # (set() would enforce: shared is unpinned)
    assert eng.budget.get_releases(owners) == []
    eng.budget.limit = held - 1
    assert eng.budget.get_releases(owners) == ["C"]
    eng.budget.limit = 0
    assert eng.budget.get_releases(owners) == ["C", "B", "A"]  # A's release frees nothing: shared keeps it
    assert eng.budget.get_releases([("A", {a})]) == ["A"] and eng.budget.memory().held_bytes == held
    assert set(eng.budget.lineages) == {a, b, c, shared} and len(pins) == 3


def test_shared_storage_counts_once(lm):
    eng = make_engine(lm)
    a = fresh(eng, ids(lm, 30))
    one = eng.budget.memory()
    shares = [eng.fork(a, n) for n in (5, 10, 30)]
    many = eng.budget.memory()
    assert many.held_bytes == one.held_bytes and many.lineages == 4
    assert many.cached_tokens == one.cached_tokens + 45
    eng.prefill(shares[0], [1, 2, 3])  # new storage for the extended share only
    assert eng.budget.memory().held_bytes > one.held_bytes


def test_bad_budget_is_refused(lm):
    with pytest.raises(ValueError, match="kv_budget=-1"):
        make_engine(lm, kv_budget=-1)
    eng = make_engine(lm, kv_budget=10)
    with pytest.raises(ValueError, match="kv_budget='big'"):
        eng.budget.set("big")
    assert eng.budget.limit == 10


def test_rebuild_counts_as_rebuilt(tiny_engine, lm):
    x = ids(lm, 30)
    a = fresh(tiny_engine, x[:10], x[10:])
    before = tiny_engine.counters.snapshot()
    b = rebuild(tiny_engine, [x[:10], x[10:]])
    assert tiny_engine.digest(b) == tiny_engine.digest(a)
    assert tiny_engine.counters - before == Counters(forward_calls=2, prefilled_tokens=30, rebuilt_tokens=30)


# ------------------------------------------------------------ prefix cache


def test_prefix_cache_serves_whole_matching_chunks(tiny_engine, lm):
    x = ids(lm, 60)
    a = fresh(tiny_engine, x[:20], x[20:40], x[40:])
    before = tiny_engine.counters.snapshot()
    with tiny_engine.prefix_cache():
        b = fresh(tiny_engine, x[:20], x[20:40], x[40:50])  # the third chunk differs from a's
    spent = tiny_engine.counters - before
    assert spent == Counters(forward_calls=1, prefilled_tokens=10, reused_tokens=40)
    assert tiny_engine.digest(b) == tiny_engine.digest(fresh(tiny_engine, x[:20], x[20:40], x[40:50]))
    # a different chunking of the same tokens is never served
    before = tiny_engine.counters.snapshot()
    with tiny_engine.prefix_cache():
        fresh(tiny_engine, x[:40])
        fresh(tiny_engine, x[:10], x[10:20])
    assert (tiny_engine.counters - before).reused_tokens == 0
    assert tiny_engine.digest(a) == tiny_engine.digest(fresh(tiny_engine, x[:20], x[20:40], x[40:]))


def test_decode_after_a_served_chunk(tiny_engine, lm):
    x = ids(lm, 40)
    src = fresh(tiny_engine, x[:25], x[25:30])  # x[25:30] plays an assistant header
    g = tiny_engine.generate(src, 6, stop_ids=())  # the logits it decoded from are kept
    ref = tiny_engine.digest(src)
    before = tiny_engine.counters.snapshot()
    with tiny_engine.prefix_cache():
        b = fresh(tiny_engine, x[:25], x[25:30])
        assert tiny_engine.generate(b, 6, stop_ids=()) == g  # decoded, never served
    spent = tiny_engine.counters - before
    # header served with its kept logits; the turn's canonical prefill too
    assert spent == Counters(forward_calls=5, prefilled_tokens=0, decoded_tokens=6, reused_tokens=36)
    assert tiny_engine.digest(b) == ref
    # where no decode started, the served chunk is recomputed for its logits
    expected = fresh(tiny_engine, x[:25])
    g3 = tiny_engine.generate(expected, 3, stop_ids=())
    before = tiny_engine.counters.snapshot()
    with tiny_engine.prefix_cache():
        c = fresh(tiny_engine, x[:25])  # served (from src), but no decode started at 25 there ...
        assert (tiny_engine.counters - before).reused_tokens == 25
        # ... while `expected` did decode there: its kept logits serve this one
        assert tiny_engine.generate(c, 3, stop_ids=()) == g3
    assert (tiny_engine.counters - before).reused_tokens == 25 + 3
    assert tiny_engine.digest(c) == tiny_engine.digest(expected)
    tiny_engine.drop(expected)
    tiny_engine.drop(c)
    before = tiny_engine.counters.snapshot()
    with tiny_engine.prefix_cache():
        d = fresh(tiny_engine, x[:25])  # served by src or b, where no decode started at 25
        # no lineage kept those logits: the chunk is recomputed
        assert tiny_engine.generate(d, 3, stop_ids=()) == g3
    spent = tiny_engine.counters - before
    assert spent.reused_tokens == 0 and spent.prefilled_tokens == 25 + 3
    assert tiny_engine.tokens(d) == x[:25] + g3


#: Allocates and frees 64 MiB of host tensors (like dropping a lineage), then
#: allocates them again and prints the page faults of that second allocation.
_REUSE_CHILD = """
import resource, torch
from unsee.impl.engines.registry import load_engine
engine = load_engine("tiny")
tensors = [torch.ones(1_000_000) for _ in range(16)]
del tensors
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
tensors = [torch.ones(1_000_000) for _ in range(16)]
print(engine.host_memory_retained, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_engine_keeps_freed_host_memory_for_reuse():
    """With the engine's default, host memory freed by dropped KV is reused,
    not faulted in again (what made a restored lineage's first prefill slower
    at 7k tokens than at 1k); UNSEE_RETAIN_HOST_MEMORY=0 shows the default
    allocator faulting the 64 MiB in again (16,384 pages)."""
    def run(env):
        out = subprocess.run([sys.executable, "-c", _REUSE_CHILD], capture_output=True, text=True, check=True,
                             env={**os.environ, **env}).stdout.split()
        return out[0] == "True", int(out[1])
    retained, faults = run({})
    if not retained:
        pytest.skip("the C library is not glibc")
    # 64 MiB is 16,384 pages; reused memory faults few of them (0 in most
    # runs here, once 4,883: other allocations of the process moved the heap)
    assert faults < 8_000
    retained, faults = run({"UNSEE_RETAIN_HOST_MEMORY": "0"})
    assert not retained and faults > 8_000


def test_forwards_use_the_cache_argument_the_model_takes(tiny_engine, lm):
    """transformers 5.24 deprecates ``past_key_values`` for ``cache`` (removed in
    5.40): a prefill and a decode raise no FutureWarning, so the adapter passes
    the name the model's forward takes (issue 41, item 4)."""
    import warnings

    from unsee.impl.engines.hf.adapter import get_cache_argument

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        handle = fresh(tiny_engine, ids(lm, 12))
        tiny_engine.generate(handle, 3, stop_ids=())
    assert get_cache_argument(lm.model) in ("cache", "past_key_values")
