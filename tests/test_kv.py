"""KVEngine on the tiny model (CPU, fp32): exactness of chunked prefill,
crop, canonicalised generation, sampling, lineages and counters."""

import pytest

from unsee.impl.engines.hf.engine import KVEngine
from unsee.impl.engines.hf.models import load_model
from unsee.impl.engines.lineage import Counters


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny")


@pytest.fixture
def eng(lm):
    return KVEngine(lm)


def ids(lm, n, salt=""):
    """n token ids of chat-like text (the byte tokenizer: one id per byte)."""
    text = f"<|im_start|>user\n{salt}The quick brown fox jumps over the lazy dog. " * 8
    out = lm.encode(text)
    assert len(out) >= n
    return out[:n]


def fresh(eng, *chunks):
    """A new lineage (made current) that prefilled `chunks` one forward each."""
    h = eng.new_lineage()
    for c in chunks:
        eng.prefill(c)
    return h


# ------------------------------------------------------------ chunking


def test_same_chunking_twice_is_bitwise_identical(eng, lm):
    x = ids(lm, 40)
    a = fresh(eng, x[:13], x[13:])
    b = fresh(eng, x[:13], x[13:])
    assert eng.length(a) == eng.length(b) == 40
    assert eng.digest(a) == eng.digest(b)


def test_40_vs_20_plus_20_recorded(eng, lm, record_property):
    x = ids(lm, 40)
    one = fresh(eng, x)
    one_again = fresh(eng, x)
    two = fresh(eng, x[:20], x[20:])
    two_again = fresh(eng, x[:20], x[20:])
    # The promise is only same-chunking identity ...
    assert eng.digest(one) == eng.digest(one_again)
    assert eng.digest(two) == eng.digest(two_again)
    # ... whether different chunkings agree depends on the kernels: recorded only.
    differs = eng.digest(one) != eng.digest(two)
    record_property("chunking_40_vs_20_20_differs", differs)
    print(f"40 vs 20+20 chunking differs bitwise: {differs}")


def test_crop_then_reprefill_same_chunk_is_original(eng, lm):
    x = ids(lm, 30)
    h = fresh(eng, x[:10], x[10:])
    before = eng.digest(h)
    eng.crop(10)
    assert eng.length() == 10
    assert eng.digest(h) == eng.digest(fresh(eng, x[:10]))
    eng.use(h)
    eng.prefill(x[10:])
    assert eng.digest(h) == before


def test_crop_to_zero_equals_empty(eng, lm):
    h = fresh(eng, ids(lm, 8))
    eng.crop(0)
    assert eng.length(h) == 0
    assert eng.tokens(h) == []
    assert eng.digest(h) == eng.digest(eng.new_lineage())
    # and a prefill after crop(0) matches one on a fresh cache
    eng.use(h)
    eng.prefill(ids(lm, 8))
    assert eng.digest(h) == eng.digest(fresh(eng, ids(lm, 8)))


# ---------------------------------------------------------- generation


def test_greedy_generate_is_repeatable(eng, lm):
    base = fresh(eng, ids(lm, 25))
    other = eng.clone(base)
    g1 = eng.generate(12, stop_ids=())
    eng.use(other)
    g2 = eng.generate(12, stop_ids=())
    assert g1 == g2 and len(g1) == 12
    assert eng.digest(base) == eng.digest(other)
    assert eng.length(base) == 25 + 12


def test_generate_is_canonicalised(eng, lm):
    x = ids(lm, 30)
    h = fresh(eng, x[:17], x[17:])
    g = eng.generate(10, stop_ids=())
    assert eng.tokens(h) == x + g
    # The committed KV is that of prefilling the same chunks, then the
    # generated turn as one chunk -- what a replay does.
    replay = fresh(eng, x[:17], x[17:], g)
    assert eng.digest(h) == eng.digest(replay)
    # ... and generation can continue from it identically.
    eng.use(h)
    n1 = eng.generate(5, stop_ids=())
    eng.use(replay)
    n2 = eng.generate(5, stop_ids=())
    assert n1 == n2 and eng.digest(h) == eng.digest(replay)


def test_generate_stops_after_stop_id_and_includes_it(eng, lm):
    x = ids(lm, 20)
    probe = fresh(eng, x)
    first = eng.generate(4, stop_ids=())
    eng.drop(probe)
    h = fresh(eng, x)
    g = eng.generate(50, stop_ids=[first[1]])
    assert g == first[:2]  # stops right after emitting the stop id
    assert eng.length(h) == 22
    # default stop ids are the model's eos ids
    assert lm.eos_ids == (lm.encode("<|im_end|>")[0],)


def test_generate_zero_tokens(eng, lm):
    h = fresh(eng, ids(lm, 5))
    d = eng.digest(h)
    assert eng.generate(0) == []
    assert eng.digest(h) == d


def test_sampling_same_seed_repeatable_and_seed_required(eng, lm):
    base = fresh(eng, ids(lm, 20))
    other = eng.clone(base)
    third = eng.clone(base)
    s1 = eng.generate(10, stop_ids=(), temperature=1.0, seed=7)
    eng.use(other)
    s2 = eng.generate(10, stop_ids=(), temperature=1.0, seed=7)
    assert s1 == s2
    assert eng.digest(base) == eng.digest(other)
    eng.use(third)
    with pytest.raises(ValueError, match="seed"):
        eng.generate(3, temperature=0.8)
    with pytest.raises(ValueError, match="temperature"):
        eng.generate(3, temperature=-1.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        eng.generate(-1)
    assert eng.length(third) == 20  # failed calls changed nothing


def test_generate_needs_logits(eng, lm):
    eng.new_lineage()
    with pytest.raises(RuntimeError, match="prefill first"):
        eng.generate(3)
    eng.prefill(ids(lm, 10))
    eng.crop(6)  # crop clears the logits: they belonged to the removed tokens
    with pytest.raises(RuntimeError, match="prefill first"):
        eng.generate(3)
    eng.prefill(ids(lm, 10)[6:])
    assert len(eng.generate(2, stop_ids=())) == 2


# ------------------------------------------------------------- errors


def test_crop_errors_name_bad_n(eng, lm):
    h = fresh(eng, ids(lm, 10))
    with pytest.raises(ValueError, match="n_tokens=11"):
        eng.crop(11)
    with pytest.raises(ValueError, match="n_tokens=-1"):
        eng.crop(-1)
    eng.crop(10)  # a no-op crop is fine
    assert eng.length(h) == 10


def test_prefill_rejects_bad_ids(eng, lm):
    eng.new_lineage()
    with pytest.raises(ValueError, match="empty"):
        eng.prefill([])
    with pytest.raises(ValueError, match="outside"):
        eng.prefill([1, lm.vocab_size])
    with pytest.raises(TypeError):
        eng.prefill([1.5])
    assert eng.length() == 0


def test_no_current_and_unknown_lineage(eng, lm):
    with pytest.raises(RuntimeError, match="no current lineage"):
        eng.prefill([1])
    h = fresh(eng, [1, 2])
    eng.drop(h)
    assert eng.current is None
    with pytest.raises(KeyError, match=h):
        eng.use(h)
    # handles are never reused
    assert eng.new_lineage() != h


# ------------------------------------------------------------- lineages


def test_lineages_are_independent(eng, lm):
    x, y = ids(lm, 20), ids(lm, 20, salt="other ")
    a = fresh(eng, x)
    da = eng.digest(a)
    b = fresh(eng, y)
    assert eng.current == b and set(eng.lineages) >= {a, b}
    db = eng.digest(b)
    assert da != db
    eng.crop(5, lineage=a)
    assert eng.length(a) == 5 and eng.length(b) == 20
    assert eng.digest(b) == db
    eng.prefill(y[:3])  # current is still b
    assert eng.length(a) == 5 and eng.length(b) == 23


def test_clone_is_independent(eng, lm):
    x = ids(lm, 20)
    a = fresh(eng, x)
    da = eng.digest(a)
    c = eng.clone()
    assert eng.current == a  # clone does not switch
    assert eng.digest(c) == da and eng.tokens(c) == eng.tokens(a)
    eng.use(c)
    eng.prefill(x[:4])
    assert eng.digest(a) == da and eng.length(a) == 20
    eng.crop(3, lineage=a)
    assert eng.length(c) == 24
    # the clone kept the last logits, so it can generate straight away
    d = eng.clone(c)
    eng.use(d)
    assert len(eng.generate(2, stop_ids=())) == 2


# ------------------------------------------------------------- counters


def test_counters_count(eng, lm):
    fresh(eng, ids(lm, 10))
    assert eng.counters == Counters(forward_calls=1, prefilled_tokens=10, decoded_tokens=0)
    before = eng.counters.snapshot()
    eng.generate(5, stop_ids=())
    spent = eng.counters - before
    # 4 one-token decode forwards (the 5th token is never fed alone) + 1
    # canonical prefill of the 5 generated tokens
    assert spent == Counters(forward_calls=5, prefilled_tokens=5, decoded_tokens=5)
    assert before == Counters(1, 10, 0)  # a snapshot does not move
    eng.prefill([1, 2, 3])
    assert eng.counters.since(before) == Counters(6, 8, 5)
    eng.crop(0)
    eng.clone()
    eng.digest()
    assert eng.counters.since(before) == Counters(6, 8, 5)  # no forwards
