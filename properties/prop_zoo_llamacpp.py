"""The architecture zoo on the llama.cpp engine: every zoo family that
llama.cpp runs, as a tiny random GGUF, runs the engine-verb properties and
forget == reset, as ``prop_zoo.py`` runs them on transformers.

================================  ===================================================================
test                              checks (the engine is in every id: ``[llamacpp-tiny-phi3-...]``)
================================  ===================================================================
engine_verbs_on_gguf_family       each property of ``prop_engine_verbs.py`` on the family's engine
forget_equals_reset_on_gguf_      forget with drafts and context guesses == full reset (digest and
family                            every token id), greedy and seeded sampling; drafts verified at
                                  the bound the engine measured at load (0: decode == prefill)
every_zoo_family_is_placed        each zoo family has a tiny GGUF or a reason why not
================================  ===================================================================

The families (``tiny_gguf.ZOO_FAMILIES``): llama, qwen2, qwen3, gemma2 and
gemma3 (16-token windows, two KV caches), phi3 (fused projections; llama.cpp
turns its window off) and qwen2moe (4 experts, top 2, a shared expert).
``tiny-mistral`` has none (``tiny_gguf.NOT_ON_LLAMACPP``). ``UNSEE_ZOO``
picks zoo families as for ``prop_zoo.py``; those without a GGUF are left out.

Budget: ``prop_zoo.zoo_settings``, as the transformers zoo (``ci``: 10
examples of forget == reset per family, the verbs at their own scaled
counts; ``nightly``: 1,000). Skipped where llama-cpp-python is not installed.
"""

from __future__ import annotations

import pytest
from hypothesis import event, given

from unsee.impl.engines.hf import zoo
from unsee.impl.engines.llamacpp.tiny_gguf import NOT_ON_LLAMACPP, ZOO_FAMILIES, get_engine_name
from unsee.properties.differential import compare_forget_with_reset, engine_scope
from unsee.properties.engines import llamacpp_available
from unsee.properties.prop_zoo import drafted_episodes, get_engine, per_verb, zoo_families, zoo_settings

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not llamacpp_available(), reason="llama-cpp-python is not installed")]

#: the llama.cpp engines of the picked zoo families that have a tiny GGUF
ENGINES = [get_engine_name(ZOO_FAMILIES[n]) for n in zoo_families() if n in ZOO_FAMILIES]
per_engine = pytest.mark.parametrize("engine_name", ENGINES)


@per_engine
@per_verb
def test_engine_verbs_on_gguf_family(engine_name, verb):
    verb(engine_name=engine_name)


@per_engine
@given(episode=drafted_episodes())
@zoo_settings()
def test_forget_equals_reset_on_gguf_family(engine_name, episode):
    engine = get_engine(engine_name)
    assert engine.draft_bound == 0.0, f"{engine_name}: {engine.draft_bound_source}"
    with engine_scope(engine):
        report = compare_forget_with_reset(engine, episode, drafts=True)
    assert report.drafts.mode == "verify"
    assert "decode == prefill" in report.drafts.bound_source
    event("sampled" if episode.settings.temperature > 0 else "greedy")
    event(f"draft tokens accepted: {report.draft_accepted_tokens > 0}")
    event(f"context guesses accepted: {report.drafts.totals['lookup_accepted'] > 0}")


def test_every_zoo_family_is_placed():
    placed = set(ZOO_FAMILIES) | set(NOT_ON_LLAMACPP)
    assert placed == set(zoo.ZOO_NAMES), "each zoo family needs a tiny GGUF or a reason in NOT_ON_LLAMACPP"
    assert not set(ZOO_FAMILIES) & set(NOT_ON_LLAMACPP)
