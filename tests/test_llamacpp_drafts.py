"""The llama.cpp engine's drafts (decode == prefill measured per file) and its B5' prefix cache.

The episode-level properties (forget with drafts == reset, B5' == B5) are
``properties/prop_llamacpp.py``; here the unit facts: where the bound comes
from and when it is refused, that the measurement is cached, and the prefix
cache's exact work on fixed chunks (as tests/test_kv_engine.py checks the
transformers engine's)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

from unsee.impl.engines.counts import Counters
from unsee.impl.engines.llamacpp import cost, facts
from unsee.impl.engines.llamacpp import engine as llamacpp
from unsee.impl.engines.llamacpp.tiny_gguf import write_tiny_gguf
from unsee.impl.engines.protocol import Assist
from unsee.impl.engines.registry import load_engine
from unsee.impl.engines.speculation import DraftPolicy

pytestmark = pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed")


@pytest.fixture
def engine(engine_factory):
    return engine_factory("llamacpp-tiny", n_ctx=512)


def ids(engine, n, salt=""):
    out = engine.lm.encode(f"<|im_start|>user\n{salt}The quick brown fox jumps over the lazy dog. " * 8)
    return out[:n]


def fresh(engine, *chunks):
    """A new lineage of ``chunks``, each computed when given (``flush``: outside a prefix cache a
    short chunk is otherwise left pending), so that a turn's counters and forwards are its own."""
    h = engine.new_lineage()
    for c in chunks:
        engine.prefill(h, c)
        engine.flush(h)
    return h


def test_q4_1_file_measures_decode_equal_to_prefill_below_a_batch_size(engine):
    # forwards of 64 tokens or more take another kernel here (facts.py): drafts are verified below that
    assert engine.draft_bound == 0.0 and engine.lm.max_forward >= 2
    assert f"decode == prefill bitwise for forwards of up to {engine.lm.max_forward} tokens" in \
        engine.lm.draft_bound_source


def test_exact_kernels_by_default_and_the_facts_key_names_the_kernels(engine):
    # repacked weights and ggml's tiled matmul sum rows their own way above a batch
    # size (model.py load_llamacpp): the facts measured under one setting say nothing of the other
    lm = engine.lm
    assert lm.exact_kernels and "per-row kernels" in lm.draft_bound_source
    assert lm.info["GGML_CPU_TILED_MM"] == os.environ["GGML_CPU_TILED_MM"]
    fields = {k: getattr(lm, k) for k in ("source", "threads", "flash_attn", "info", "row_order")}
    keys = {facts.get_cache_key(SimpleNamespace(**fields, exact_kernels=exact)) for exact in (True, False)}
    tiled = {**lm.info, "GGML_CPU_TILED_MM": "1"}
    keys.add(facts.get_cache_key(SimpleNamespace(**{**fields, "info": tiled}, exact_kernels=True)))
    # Q4_K repacked in decode's order (repack.py) sums rows otherwise than the file's layout
    keys.add(facts.get_cache_key(SimpleNamespace(**{**fields, "row_order": not lm.row_order}, exact_kernels=True)))
    assert len(keys) == 4 and facts.get_cache_key(lm) in keys


def test_a_draft_longer_than_max_forward_is_verified_in_forwards_up_to_it(engine):
    # every forward of the turn stays within max_forward (a longer one takes other kernels), and
    # the turn, longer than that, is committed by its canonical one-chunk prefill
    x = ids(engine, 30)
    ref = fresh(engine, x)
    n = engine.lm.max_forward + 20
    expected = engine.generate(ref, n, stop_ids=())
    drafted = fresh(engine, x)
    before, sizes = engine.counters.snapshot(), []
    with engine.hook_forwards(lambda size, _: sizes.append(size)):
        assert engine.generate(drafted, n, stop_ids=(), assist=Assist(draft=expected)) == expected
    spent = engine.counters - before
    assert spent.draft_accepted_tokens == n and spent.decoded_tokens == 0
    assert max(sizes[:-1]) <= engine.lm.max_forward and sizes[-1] == n  # the last: the canonical prefill
    assert engine.digest(drafted) == engine.digest(ref)


def test_f32_file_turns_drafts_off_with_the_measured_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("UNSEE_CACHE", str(tmp_path))
    path = write_tiny_gguf(tmp_path / "tiny-f32.gguf", quant="f32")
    engine = load_engine(str(path), backend="llamacpp", threads=1, n_ctx=256)
    assert engine.draft_bound is None and engine.lm.max_forward == 0
    assert "decode != prefill" in engine.lm.draft_bound_source and "drafts off" in engine.lm.draft_bound_source
    lin = engine.new_lineage()
    engine.prefill(lin, [1, 2, 3])
    with pytest.raises(ValueError, match="bound"):
        engine.generate(lin, 2, assist=Assist(draft=[1]))


def test_facts_are_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("UNSEE_CACHE", str(tmp_path))
    first = load_engine("llamacpp-tiny", threads=1, n_ctx=256)
    assert (tmp_path / "llamacpp-facts.json").is_file()

    def refuse(*args):
        raise AssertionError("measured again despite the cache")

    monkeypatch.setattr(facts, "measure_decode_facts", refuse)
    monkeypatch.setattr(cost, "measure_costs", refuse)
    again = load_engine("llamacpp-tiny", threads=1, n_ctx=256)
    assert again.draft_bound == first.draft_bound and again.lm.draft_bound_source == first.lm.draft_bound_source
    assert again.draft_policy == first.draft_policy and again.draft_policy.per_token > 0
    # what a first load spent measuring is said once (the demo prints it); a cached load spent none
    assert first.lm.info["measured_at_load_s"] > 0 and "measured_at_load_s" not in again.lm.info


@pytest.mark.parametrize(("policy", "sizes"), [(None, [12]), (DraftPolicy.from_cost(0.5), [3, 5, 4])])
def test_a_draft_accepted_whole_costs_no_decode_in_forwards_the_policy_sizes(engine, policy, sizes):
    # without a policy one forward verifies it all; with one, each forward feeds the decided token and
    # the proposals its credit allows: 2 (opening 2 x 0.5), then 4 (credit 1 + 2 - 1), then the 3 left
    x = ids(engine, 30)
    ref = fresh(engine, x)
    expected = engine.generate(ref, 12, stop_ids=())
    drafted = fresh(engine, x)
    engine.draft_policy, got = policy, []
    before = engine.counters.snapshot()
    with engine.hook_forwards(lambda size, _: got.append(size)):
        assert engine.generate(drafted, 12, stop_ids=(), assist=Assist(draft=expected)) == expected
    spent = engine.counters - before
    assert got == sizes
    assert spent == Counters(forward_calls=len(sizes), prefilled_tokens=12, draft_accepted_tokens=12)
    assert engine.digest(drafted) == engine.digest(ref)
    assert engine.logits(drafted) is None  # a prefill must come before the next turn


def test_prefix_cache_serves_whole_matching_chunks(engine):
    x = ids(engine, 60)
    a = fresh(engine, x[:20], x[20:40], x[40:])
    before = engine.counters.snapshot()
    with engine.prefix_cache():
        b = fresh(engine, x[:20], x[20:40], x[40:50])  # the third chunk differs from a's
    assert engine.counters - before == Counters(forward_calls=1, prefilled_tokens=10, reused_tokens=40)
    assert engine.digest(b) == engine.digest(fresh(engine, x[:20], x[20:40], x[40:50]))
    before = engine.counters.snapshot()
    with engine.prefix_cache():  # another chunking of the same tokens is never served
        fresh(engine, x[:40])
        fresh(engine, x[:10], x[10:20])
    assert (engine.counters - before).reused_tokens == 0
    assert engine.digest(a) == engine.digest(fresh(engine, x[:20], x[20:40], x[40:]))


def test_prefix_cache_only_serves_its_sources(engine):
    x = ids(engine, 30)
    a = fresh(engine, x[:20], x[20:])
    other = fresh(engine, x[:20], x[20:])
    before = engine.counters.snapshot()
    with engine.prefix_cache(sources=[]):
        fresh(engine, x[:20], x[20:])
    assert (engine.counters - before).reused_tokens == 0
    engine.drop(other)
    with engine.prefix_cache(sources=[a]):
        c = fresh(engine, x[:20], x[20:])
    assert (engine.counters - before).reused_tokens == 30
    assert engine.digest(c) == engine.digest(a)


def test_decode_after_a_served_chunk(engine):
    x = ids(engine, 40)
    src = fresh(engine, x[:25], x[25:30])
    g = engine.generate(src, 6, stop_ids=())  # the logits it decoded from are kept
    ref = engine.digest(src)
    before = engine.counters.snapshot()
    with engine.prefix_cache():
        b = fresh(engine, x[:25], x[25:30])
        assert engine.generate(b, 6, stop_ids=()) == g  # decoded, never served
    spent = engine.counters - before
    # the decoded turn is committed as B5 commits it (engine._commit_decoded: its last token
    # fed alone, its other rows are the decode's), not served: B5' does B5's work less what it serves
    assert spent == Counters(forward_calls=6, prefilled_tokens=1, decoded_tokens=6, reused_tokens=30)
    assert engine.digest(b) == ref
    engine.drop(src)
    engine.drop(b)
    before = engine.counters.snapshot()
    with engine.prefix_cache():
        fresh(engine, x[:25], x[25:30])
        d = fresh(engine, x[:25])  # served, but no lineage kept logits at 25: recomputed for the decode
        assert engine.generate(d, 3, stop_ids=()) == fresh_generate(engine, x[:25], 3)
    assert engine.tokens(d)[:25] == x[:25]


def fresh_generate(engine, context, n):
    handle = fresh(engine, context)
    out = engine.generate(handle, n, stop_ids=())
    return out


def test_the_forward_cap_is_needed(engine_factory):
    """Verifying a 120-token draft in one forward (the cap removed: the
    engine passes no ``max_forward`` to the turn) reaches the kernel that
    differs from decoding, and the turn's tokens or KV then differ from the
    reference; with the cap they never do (real prefill-versus-decode
    differences, no noise injected)."""
    engine = engine_factory("llamacpp-tiny", n_ctx=1024)
    cap = engine.lm.max_forward
    differs = {cap: 0, 0: 0}
    try:
        for seed in range(4):
            context = [int(t) for t in np.random.default_rng(seed).integers(0, 256, 30)]
            kw = {"stop_ids": (), "temperature": 0.7 if seed % 2 else 0.0, "seed": seed}
            ref = fresh(engine, context)
            expected = engine.generate(ref, 120, **kw)
            for engine.lm.max_forward in (cap, 0):  # 0: no cap (Turn.max_forward None)
                drafted = fresh(engine, context)
                got = engine.generate(drafted, 120, **kw, assist=Assist(draft=expected))
                differs[engine.lm.max_forward] += got != expected or engine.digest(drafted) != engine.digest(ref)
    finally:
        engine.lm.max_forward = cap
    assert differs[cap] == 0 and differs[0] > 0, differs


def test_a_decoded_turn_commits_without_a_reprefill_up_to_max_forward(engine):
    # every row of a decoded turn came from a forward of at most max_forward tokens, so it
    # is the row the turn's one-chunk prefill writes (facts.py): only the last token is left,
    # pending, and computed (one token) when the digest reads the KV
    x = ids(engine, 30)
    for n, prefilled, pending in ((12, 1, 1), (engine.lm.max_forward + 5, engine.lm.max_forward + 5, 0)):
        h = fresh(engine, x)
        before = engine.counters.snapshot()
        out = engine.generate(h, n, stop_ids=())
        assert (engine.counters - before).prefilled_tokens == prefilled - pending and engine.tokens(h) == x + out
        digest = engine.digest(h)
        spent = engine.counters - before
        ref = fresh(engine, x, out)
        # the bits first: without the max_forward cap (engine._commit_decoded) the longer turn's
        # rows are the decode's, not the 68-token chunk's, and this fails (checked by removing it)
        assert digest == engine.digest(ref)
        assert engine.logits(h).equal(engine.logits(ref))
        assert spent.prefilled_tokens == prefilled
        engine.drop(ref)
        engine.drop(h)


@pytest.mark.parametrize("limit", [0, 1, 3, 7, 40, 63, 96])
def test_the_facts_find_the_limit_from_sampled_sizes(limit):
    # facts.PROBE_SIZES samples the sizes past 16; a bisection between the last equal size and the
    # first that differs finds the limit, at fewer tokens of forwards than trying every size
    tried = []

    def get_diff(size):
        tried.append(size)
        return None if size <= limit else float(size)

    got, diff = facts.compute_equal_limit(facts.PROBE_SIZES, get_diff)
    assert got == (limit if limit >= 2 else 0)
    assert diff == (0.0 if limit >= facts.PROBE_DECODE else float(max(limit, 1) + 1))
    assert sum(tried) < sum(range(2, min(limit + 1, facts.PROBE_DECODE) + 1)) or limit < 17


def test_the_kernels_default_comes_from_the_environment(monkeypatch):
    # UNSEE_LLAMA_KERNELS picks the loader's default; an argument wins; a bad value is named
    from unsee.impl.engines.llamacpp.model import KERNELS_ENV, get_exact_kernels

    monkeypatch.delenv(KERNELS_ENV, raising=False)
    assert get_exact_kernels() is True
    monkeypatch.setenv(KERNELS_ENV, "repacked")
    assert get_exact_kernels() is False and get_exact_kernels(True) is True
    monkeypatch.setenv(KERNELS_ENV, "fast")
    with pytest.raises(ValueError, match="UNSEE_LLAMA_KERNELS='fast'"):
        get_exact_kernels()
