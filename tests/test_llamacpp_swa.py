"""Sliding-window families on the llama.cpp engine: two KV caches, kept whole, cropped exactly.

llama.cpp keeps a model with sliding-window layers in two caches, and its
state writer gives the sliding-window cache's rows of the last ``n_swa``
positions only; the engine asks for full-size caches and reads the other
rows through a second sequence (``LlamaCppEngine._read_swa_rows``), so a
parked lineage holds every position and a prefix of any length continues
as a fresh prefill would. The tiny families' window is
:data:`~unsee.impl.engines.llamacpp.tiny_gguf.TINY_WINDOW` (16) tokens; the
contexts here are 100 tokens and the crops land 80 tokens behind the end.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from unsee.bench.episodes import make_bench_episode
from unsee.impl.engines.lineage import crop
from unsee.impl.engines.llamacpp import engine as llamacpp
from unsee.impl.engines.llamacpp.model import check_exact_layout
from unsee.impl.engines.llamacpp.tiny_gguf import TINY_WINDOW
from unsee.properties.differential import compare_forget_with_reset, engine_scope

pytestmark = pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed")

WINDOWED = ("llamacpp-tiny-gemma2", "llamacpp-tiny-gemma3")


@pytest.fixture(scope="module", params=[(n, fa) for n in WINDOWED for fa in (True, False)],
                ids=lambda p: f"{p[0]}-{'fa' if p[1] else 'vt'}")
def engine(request, engine_factory):
    name, flash_attn = request.param
    return engine_factory(name, n_ctx=4096, flash_attn=flash_attn)


def tokens(n: int, seed: int = 2) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 256, n)]


def test_two_caches_hold_every_position(engine):
    assert engine.lm.n_swa == TINY_WINDOW
    with engine_scope(engine):
        lin = engine.new_lineage()
        engine.prefill(lin, tokens(100))
        state = engine.kv.read_seq()
        assert len(state.caches) == 2
        assert sum(len(c.k) for c in state.caches) == engine.lm.n_layer
        for cache in state.caches:  # the sliding-window cache too, not only its last window
            assert list(cache.positions) == list(range(100))


def test_parked_prefix_beyond_the_window_continues_as_fresh(engine):
    x = tokens(110)
    with engine_scope(engine):
        long = engine.new_lineage()
        for a, b in ((0, 20), (20, 70), (70, 100)):
            engine.prefill(long, x[a:b])
        before = engine.digest(long)
        fresh = engine.new_lineage()  # parks `long`
        engine.prefill(fresh, x[:20])
        engine.prefill(fresh, x[20:30])
        expected = engine.digest(fresh), engine.logits(fresh)
        shared = engine.fork(long, 20)  # 80 tokens behind the end: 5 windows back
        engine.prefill(shared, x[20:30])
        cropped = engine.fork(long)
        cropped = crop(engine, cropped, 20)
        engine.prefill(cropped, x[20:30])
        for handle in (shared, cropped):
            assert engine.digest(handle) == expected[0]
            assert bool((engine.logits(handle) == expected[1]).all())
        assert engine.digest(long) == before


def test_forget_with_drafts_equals_reset_on_an_episode_longer_than_the_window(engine):
    episode = make_bench_episode(3, 8, max_new_tokens=6)
    with engine_scope(engine):
        # drafts asked for wherever the engine has a bound (its cost table alone might turn them off)
        report = compare_forget_with_reset(engine, episode, drafts=True if engine.lm.flash_attn else None)
        assert max(len(engine.tokens(h)) for h in engine.budget.lineages) > 10 * TINY_WINDOW
    if engine.lm.flash_attn:
        assert report.drafts.mode == "verify" and report.draft_accepted_tokens > 0
    else:  # drafts off without flash attention (facts.py says why)
        assert report.drafts.mode == "off"


def test_a_recurrent_model_is_refused_by_name_before_any_work():
    freed = []

    def meta(model, key, buf, size):
        buf.value = b"mamba"
        return 5

    lc = types.SimpleNamespace(llama_model_meta_val_str=meta, llama_model_is_recurrent=lambda m: True,
                               llama_model_is_hybrid=lambda m: False, llama_model_is_diffusion=lambda m: False,
                               llama_model_free=freed.append)
    with pytest.raises(ValueError, match=r"refuses architecture 'mamba'.*recurrent state"):
        check_exact_layout(lc, "model", "x.gguf")
    assert freed == ["model"]


def test_an_unknown_family_is_refused_by_name(engine_factory):
    from unsee.impl.engines.llamacpp.model import resolve_gguf

    with pytest.raises(ValueError, match="tiny-gemma2"):
        resolve_gguf("tiny-mamba")
