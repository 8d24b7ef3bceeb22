"""KVEngine on the tiny model (CPU, fp32): exactness of chunked prefill,
crop, canonicalised generation, sampling, lineages and counters."""

import pytest

from unsee.impl.engines.counts import Counters
from unsee.impl.engines.lineage import crop


def ids(lm, n, salt=""):
    """n token ids of chat-like text (the byte tokenizer: one id per byte)."""
    text = f"<|im_start|>user\n{salt}The quick brown fox jumps over the lazy dog. " * 8
    out = lm.encode(text)
    assert len(out) >= n
    return out[:n]


def fresh(tiny_engine, *chunks):
    """A new lineage (made current) that prefilled `chunks` one forward each."""
    h = tiny_engine.new_lineage()
    for c in chunks:
        tiny_engine.prefill(h, c)
    return h


# ------------------------------------------------------------ chunking


def test_same_chunking_twice_is_bitwise_identical(tiny_engine, lm):
    x = ids(lm, 40)
    a = fresh(tiny_engine, x[:13], x[13:])
    b = fresh(tiny_engine, x[:13], x[13:])
    assert len(tiny_engine.tokens(a)) == len(tiny_engine.tokens(b)) == 40
    assert tiny_engine.digest(a) == tiny_engine.digest(b)


def test_40_vs_20_plus_20_recorded(tiny_engine, lm, record_property):
    x = ids(lm, 40)
    one = fresh(tiny_engine, x)
    one_again = fresh(tiny_engine, x)
    two = fresh(tiny_engine, x[:20], x[20:])
    two_again = fresh(tiny_engine, x[:20], x[20:])
    # The promise is only same-chunking identity ...
    assert tiny_engine.digest(one) == tiny_engine.digest(one_again)
    assert tiny_engine.digest(two) == tiny_engine.digest(two_again)
    # ... whether different chunkings agree depends on the kernels: recorded only.
    differs = tiny_engine.digest(one) != tiny_engine.digest(two)
    record_property("chunking_40_vs_20_20_differs", differs)
    print(f"40 vs 20+20 chunking differs bitwise: {differs}")


def test_crop_then_reprefill_same_chunk_is_original(tiny_engine, lm):
    x = ids(lm, 30)
    h = fresh(tiny_engine, x[:10], x[10:])
    before = tiny_engine.digest(h)
    h = crop(tiny_engine, h, 10)
    assert len(tiny_engine.tokens(h)) == 10
    assert tiny_engine.digest(h) == tiny_engine.digest(fresh(tiny_engine, x[:10]))
    tiny_engine.prefill(h, x[10:])
    assert tiny_engine.digest(h) == before


def test_crop_to_zero_equals_empty(tiny_engine, lm):
    h = fresh(tiny_engine, ids(lm, 8))
    h = crop(tiny_engine, h, 0)
    assert len(tiny_engine.tokens(h)) == 0
    assert tiny_engine.tokens(h) == []
    assert tiny_engine.digest(h) == tiny_engine.digest(tiny_engine.new_lineage())
    # and a prefill after crop(0) matches one on a fresh cache
    tiny_engine.prefill(h, ids(lm, 8))
    assert tiny_engine.digest(h) == tiny_engine.digest(fresh(tiny_engine, ids(lm, 8)))


# ---------------------------------------------------------- generation


def test_greedy_generate_is_repeatable(tiny_engine, lm):
    base = fresh(tiny_engine, ids(lm, 25))
    other = tiny_engine.fork(base)
    g1 = tiny_engine.generate(base, 12, stop_ids=())
    g2 = tiny_engine.generate(other, 12, stop_ids=())
    assert g1 == g2 and len(g1) == 12
    assert tiny_engine.digest(base) == tiny_engine.digest(other)
    assert len(tiny_engine.tokens(base)) == 25 + 12


def test_generate_is_canonicalised(tiny_engine, lm):
    x = ids(lm, 30)
    h = fresh(tiny_engine, x[:17], x[17:])
    g = tiny_engine.generate(h, 10, stop_ids=())
    assert tiny_engine.tokens(h) == x + g
    # The committed KV is that of prefilling the same chunks, then the
    # generated turn as one chunk -- what a replay does.
    replay = fresh(tiny_engine, x[:17], x[17:], g)
    assert tiny_engine.digest(h) == tiny_engine.digest(replay)
    # ... and generation can continue from it identically.
    n1 = tiny_engine.generate(h, 5, stop_ids=())
    n2 = tiny_engine.generate(replay, 5, stop_ids=())
    assert n1 == n2 and tiny_engine.digest(h) == tiny_engine.digest(replay)


def test_generate_stops_after_stop_id_and_includes_it(tiny_engine, lm):
    x = ids(lm, 20)
    probe = fresh(tiny_engine, x)
    first = tiny_engine.generate(probe, 4, stop_ids=())
    tiny_engine.drop(probe)
    h = fresh(tiny_engine, x)
    g = tiny_engine.generate(h, 50, stop_ids=[first[1]])
    assert g == first[:2]  # stops right after emitting the stop id
    assert len(tiny_engine.tokens(h)) == 22
    # default stop ids are the model's eos ids
    assert lm.eos_ids == (lm.encode("<|im_end|>")[0],)


def test_generate_zero_tokens(tiny_engine, lm):
    h = fresh(tiny_engine, ids(lm, 5))
    d = tiny_engine.digest(h)
    assert tiny_engine.generate(h, 0) == []
    assert tiny_engine.digest(h) == d


def test_sampling_same_seed_repeatable_and_seed_required(tiny_engine, lm):
    base = fresh(tiny_engine, ids(lm, 20))
    other = tiny_engine.fork(base)
    third = tiny_engine.fork(base)
    s1 = tiny_engine.generate(base, 10, stop_ids=(), temperature=1.0, seed=7)
    s2 = tiny_engine.generate(other, 10, stop_ids=(), temperature=1.0, seed=7)
    assert s1 == s2
    assert tiny_engine.digest(base) == tiny_engine.digest(other)
    with pytest.raises(ValueError, match="seed"):
        tiny_engine.generate(third, 3, temperature=0.8)
    with pytest.raises(ValueError, match="temperature"):
        tiny_engine.generate(third, 3, temperature=-1.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        tiny_engine.generate(third, -1)
    assert len(tiny_engine.tokens(third)) == 20  # failed calls changed nothing


def test_generate_needs_logits(tiny_engine, lm):
    lin = tiny_engine.new_lineage()
    with pytest.raises(RuntimeError, match="prefill first"):
        tiny_engine.generate(lin, 3)
    tiny_engine.prefill(lin, ids(lm, 10))
    lin = crop(tiny_engine, lin, 6)  # crop clears the logits: they belonged to the removed tokens
    with pytest.raises(RuntimeError, match="prefill first"):
        tiny_engine.generate(lin, 3)
    tiny_engine.prefill(lin, ids(lm, 10)[6:])
    assert len(tiny_engine.generate(lin, 2, stop_ids=())) == 2


# ------------------------------------------------------------- errors


def test_crop_errors_name_bad_n(tiny_engine, lm):
    h = fresh(tiny_engine, ids(lm, 10))
    with pytest.raises(ValueError, match="n_tokens=11"):
        h = crop(tiny_engine, h, 11)
    with pytest.raises(ValueError, match="n_tokens=-1"):
        h = crop(tiny_engine, h, -1)
    h = crop(tiny_engine, h, 10)  # a no-op crop is fine
    assert len(tiny_engine.tokens(h)) == 10


def test_prefill_rejects_bad_ids(tiny_engine, lm):
    lin = tiny_engine.new_lineage()
    with pytest.raises(ValueError, match="empty"):
        tiny_engine.prefill(lin, [])
    with pytest.raises(ValueError, match="outside"):
        tiny_engine.prefill(lin, [1, lm.vocab_size])
    with pytest.raises(TypeError):
        tiny_engine.prefill(lin, [1.5])
    assert len(tiny_engine.tokens(lin)) == 0


def test_unknown_lineage(tiny_engine, lm):
    h = fresh(tiny_engine, [1, 2])
    tiny_engine.drop(h)
    with pytest.raises(KeyError, match=h):
        tiny_engine.prefill(h, [1])
    # handles are never reused
    assert tiny_engine.new_lineage() != h


# ------------------------------------------------------------- lineages


def test_lineages_are_independent(tiny_engine, lm):
    x, y = ids(lm, 20), ids(lm, 20, salt="other ")
    a = fresh(tiny_engine, x)
    da = tiny_engine.digest(a)
    b = fresh(tiny_engine, y)
    assert set(tiny_engine.budget.lineages) >= {a, b}
    db = tiny_engine.digest(b)
    assert da != db
    a = crop(tiny_engine, a, 5)
    assert len(tiny_engine.tokens(a)) == 5 and len(tiny_engine.tokens(b)) == 20
    assert tiny_engine.digest(b) == db
    tiny_engine.prefill(b, y[:3])
    assert len(tiny_engine.tokens(a)) == 5 and len(tiny_engine.tokens(b)) == 23


def test_clone_is_independent(tiny_engine, lm):
    x = ids(lm, 20)
    a = fresh(tiny_engine, x)
    da = tiny_engine.digest(a)
    c = tiny_engine.fork(a)
    assert tiny_engine.digest(c) == da and tiny_engine.tokens(c) == tiny_engine.tokens(a)
    tiny_engine.prefill(c, x[:4])
    assert tiny_engine.digest(a) == da and len(tiny_engine.tokens(a)) == 20
    a = crop(tiny_engine, a, 3)
    assert len(tiny_engine.tokens(c)) == 24
    # the clone kept the last logits, so it can generate straight away
    d = tiny_engine.fork(c)
    assert len(tiny_engine.generate(d, 2, stop_ids=())) == 2


# ------------------------------------------------------------- counters


def test_counters_count(tiny_engine, lm):
    h = fresh(tiny_engine, ids(lm, 10))
    assert tiny_engine.counters == Counters(forward_calls=1, prefilled_tokens=10, decoded_tokens=0)
    before = tiny_engine.counters.snapshot()
    tiny_engine.generate(h, 5, stop_ids=())
    spent = tiny_engine.counters - before
    # 4 one-token decode forwards (the 5th token is never fed alone) + 1
    # canonical prefill of the 5 generated tokens
    assert spent == Counters(forward_calls=5, prefilled_tokens=5, decoded_tokens=5)
    assert before == Counters(1, 10, 0)  # a snapshot does not move
    tiny_engine.prefill(h, [1, 2, 3])
    assert tiny_engine.counters.since(before) == Counters(6, 8, 5)
    h = crop(tiny_engine, h, 0)
    tiny_engine.fork(h)
    tiny_engine.digest(h)
    assert tiny_engine.counters.since(before) == Counters(6, 8, 5)  # no forwards
