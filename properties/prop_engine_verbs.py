"""Engine-level properties: each verb of the Engine protocol against its definition.

They run on every engine (:func:`unsee.properties.engines.verb_engine_names`:
``tiny`` and, where installed, ``llamacpp-tiny``; ``UNSEE_ENGINE`` picks
others) and first in CI (pyproject's ``testpaths`` lists this file first):
a bug in one verb fails the property named after it in seconds, before any
episode-level property runs.

=============================  ==============================================================
test                           checks (every comparison bitwise: digests and logits)
=============================  ==============================================================
crop_then_continue             fork(n) at a chunk boundary, then a prefill == prefilling the
                               first n tokens in the same chunks, then the same prefill
clone_is_independent           a clone (and a shared prefix) equals its source, and later
                               prefills or crops on either side leave the other unchanged;
                               a continued clone == a fresh run
generate_follows_the_rule      generate's tokens are drafts.pick(get_scores(logits, ...))
                               step by step on the engine's own logits, and the turn is
                               committed as one prefilled chunk
drop_frees_the_lineage         after drop the handle is unknown, memory() is back to what it
                               was before the lineage, and handles are never reused
digest_sees_every_position     changing the last token (only the last position's KV) or
                               cropping one position changes the digest; parking and
                               reloading a lineage does not
=============================  ==============================================================
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from unsee.impl.conform.episodes import scaled
from unsee.impl.engines.decoding import get_scores, pick
from unsee.impl.engines.lineage import crop
from unsee.properties.engines import make_engine, verb_engine_names

#: Token ids are drawn below 256: valid in every engine's vocabulary (the
#: tiny models' byte ids, ordinary tokens of SmolLM2).
TOKEN_IDS = st.integers(0, 255)


pytestmark = pytest.mark.usefixtures("one_thread")


#: every test runs once per engine
per_engine = pytest.mark.parametrize("engine_name", verb_engine_names())


def chunks(min_size: int = 1, max_size: int = 4) -> st.SearchStrategy[list[list[int]]]:
    """Prefill chunks: 1-4 lists of 1-12 token ids (shrinks to one chunk ``[0]``)."""
    return st.lists(st.lists(TOKEN_IDS, min_size=1, max_size=12), min_size=min_size, max_size=max_size)


def continuations() -> st.SearchStrategy[list[int]]:
    """One more chunk to prefill after a crop or a clone."""
    return st.lists(TOKEN_IDS, min_size=1, max_size=8)


def prefilled(engine, parts: list[list[int]]) -> str:
    handle = engine.new_lineage()
    for part in parts:
        engine.prefill(handle, part)
    return handle


def state(engine, handle: str) -> tuple:
    """What must be equal bit for bit: tokens, KV digest and last logits."""
    logits = engine.logits(handle)
    return engine.tokens(handle), engine.digest(handle), None if logits is None else logits.numpy().tobytes()


@per_engine
@given(parts=chunks(), cut=st.integers(0, 4), more=continuations())
@example(parts=[[1, 2, 3], [4, 5]], cut=1, more=[6])
@scaled(4)
def test_crop_then_continue(engine_name, parts, cut, more):
    engine = make_engine(engine_name)
    cut = min(cut, len(parts))
    n = sum(len(p) for p in parts[:cut])
    cropped = prefilled(engine, parts)
    whole = n == len(engine.tokens(cropped))
    cropped = crop(engine, cropped, n)  # a fork at n: the logits come along only when it is the whole lineage
    assert len(engine.tokens(cropped)) == n and (whole or engine.logits(cropped) is None), \
        "crop: length or logits not cut"
    engine.prefill(cropped, more)
    fresh = prefilled(engine, parts[:cut] + [more])
    assert state(engine, cropped) == state(engine, fresh), "crop: crop + continue differs from a fresh prefill"


@per_engine
@given(parts=chunks(), more=continuations(), other=continuations(), cut=st.integers(0, 4))
@scaled(4)
def test_clone_is_independent(engine_name, parts, more, other, cut):
    engine = make_engine(engine_name)
    src = prefilled(engine, parts)
    before = state(engine, src)
    clone = engine.fork(src)
    assert state(engine, clone) == before, "clone: not equal to its source"
    n = sum(len(p) for p in parts[:cut])
    prefix = engine.fork(src, n)
    # the clone moves on: the source does not
    engine.prefill(clone, more)
    assert state(engine, src) == before, "clone: prefilling the clone changed its source"
    # a continued clone is a fresh run
    fresh = prefilled(engine, parts + [more])
    assert state(engine, clone) == state(engine, fresh), "clone: a continued clone differs from a fresh run"
    # the source moves on (a crop and a prefill): the clone and the prefix do not
    clone_state, prefix_state = state(engine, clone), state(engine, prefix)
    src = crop(engine, src, n)
    engine.prefill(src, other)
    assert state(engine, clone) == clone_state, "clone: changing the source changed the clone"
    assert state(engine, prefix) == prefix_state, "share_prefix: changing the source changed the prefix"
    # the prefix moves on as a fresh prefill of the first n tokens would
    engine.prefill(prefix, more)
    fresh = prefilled(engine, parts[:cut] + [more])
    assert state(engine, prefix) == state(engine, fresh), "share_prefix: a continued prefix differs from fresh"


@per_engine
@given(parts=chunks(), max_new=st.integers(1, 6), temperature=st.sampled_from([0.0, 0.7, 1.5]),
       seed=st.integers(0, 2**31), stop=st.one_of(st.none(), TOKEN_IDS))
@example(parts=[[1, 2, 3]], max_new=4, temperature=0.0, seed=0, stop=None)
@scaled(4)
def test_generate_follows_the_rule(engine_name, parts, max_new, temperature, seed, stop):
    engine = make_engine(engine_name)
    stops = () if stop is None else (stop,)
    seed = seed if temperature > 0 else None
    start = sum(len(p) for p in parts)
    turn = prefilled(engine, parts)
    # the rule by hand, on a clone: decide on the engine's logits, feed the token back
    ref = engine.fork(turn)
    expected: list[int] = []
    while len(expected) < max_new:
        tok, _ = pick(get_scores(engine.logits(ref), temperature, seed, len(expected)))
        expected.append(tok)
        if tok in stops:
            break
        engine.prefill(ref, [tok])
    got = engine.generate(turn, max_new, stop_ids=stops, temperature=temperature, seed=seed)
    assert got == expected, "generate: tokens differ from the decoding rule applied to the logits"
    # committed canonically: as prefilling the turn as one chunk after the header
    canonical = prefilled(engine, parts + [got])
    assert state(engine, turn) == state(engine, canonical), "generate: the turn is not one prefilled chunk"
    assert len(engine.tokens(turn)) == start + len(got)


@per_engine
@given(parts=chunks(), keep=chunks(max_size=2))
@scaled(4)
def test_drop_frees_the_lineage(engine_name, parts, keep):
    engine = make_engine(engine_name)
    kept = prefilled(engine, keep)
    before = engine.budget.memory().held_bytes
    handles = set(engine.budget.lineages)
    gone = prefilled(engine, parts)
    clone = engine.fork(gone)
    engine.drop(gone)
    engine.drop(clone)
    assert gone not in engine.budget.lineages and clone not in engine.budget.lineages, "drop: handle still listed"
    for verb in (engine.tokens, engine.digest, lambda h: engine.prefill(h, [1])):
        with pytest.raises(KeyError):
            verb(gone)
    assert engine.budget.memory().held_bytes == before, "drop: the lineage's memory was not released"
    assert set(engine.budget.lineages) == handles and engine.tokens(kept) == [t for p in keep for t in p]
    assert engine.new_lineage() not in (gone, clone, kept), "drop: a handle was reused"


@per_engine
@given(parts=chunks(), replacement=TOKEN_IDS)
@example(parts=[[1]], replacement=2)
@scaled(4)
def test_digest_sees_every_position(engine_name, parts, replacement):
    engine = make_engine(engine_name)
    a = prefilled(engine, parts)
    last = parts[-1][-1]
    changed = parts[:-1] + [parts[-1][:-1] + [replacement]]
    b = prefilled(engine, changed)  # the same KV but for the last position
    if replacement != last:
        assert engine.digest(a) != engine.digest(b), "digest: blind to the last position's KV"
    else:
        assert engine.digest(a) == engine.digest(b), "digest: the same chunks give different digests"
    # parking a and loading it again (it is not current any more, then is): same digest
    digest = engine.digest(a)
    engine.prefill(a, [replacement])
    a = crop(engine, a, len(engine.tokens(a)) - 1)
    c = engine.fork(a)
    engine.prefill(b, [0])
    assert engine.digest(a) == engine.digest(c) == digest, "digest: depends on where the KV sits"
    a = crop(engine, a, len(engine.tokens(a)) - 1)
    assert engine.digest(a) != digest, "digest: blind to a cropped position"
