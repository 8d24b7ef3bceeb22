"""Differential properties of the engine's services on the tiny model.

=====================================  ==========================================================
test                                   checks
=====================================  ==========================================================
splice_equals_counterfactual_under_    forget == full reset (digest, every generated token,
kv_budget                              invocations) on an engine with any KV budget, 0 included;
                                       the engine never held more unpinned bytes than the budget
reset_prefix_cache_equals_reset        B5' (reset served by the prefix cache) == B5: digest,
                                       tokens, transitions, decoded tokens; B5' prefills no more,
                                       and prefilled + reused == B5's prefilled
=====================================  ==========================================================

Episodes come from ``impl/conform/episodes.py``; each example builds its own
engine (the model is loaded once), so budgets and evictions never leak
between examples.
"""

from __future__ import annotations

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from unsee.impl.agent.episode import parse_episode
from unsee.impl.conform.episodes import episodes, get_coverage_labels, scaled
from unsee.properties.differential import (
    compare_forget_with_reset_under_budget,
    compare_prefix_cache_reset_with_reset,
)
from unsee.properties.engines import make_engine

#: An upper end for drawn budgets: about the KV of 400 tokens of the tiny
#: model (2 layers x K,V x 2 heads x 16 dims x 4 bytes = 512 bytes a token),
#: so drawn budgets range from "keep only live caches" to "keep most".
MAX_BUDGET = 200_000


pytestmark = pytest.mark.usefixtures("one_thread")


def kv_budgets() -> st.SearchStrategy[int | None]:
    """A KV budget in bytes: 0 (only live caches; shrinks there), any size up
    to :data:`MAX_BUDGET`, or None (no bound)."""
    return st.one_of(st.just(0), st.integers(0, MAX_BUDGET), st.none())


def episode_of(raw: dict):
    return parse_episode({"format": "unsee.episode", "version": 1, **raw})


#: The target enters before two compactions: under budget 0 its checkpoint
#: lineage is evicted and the forget rebuilds it from the manifest.
BEFORE_TWO_COMPACTIONS = episode_of({
    "system": "Be brief.", "settings": {"max_new_tokens": 3, "checkpoint_policy": "every_turn"},
    "steps": [{"id": "t1", "kind": "user", "text": "Bob 7"},
              {"id": "t2", "kind": "tool", "fields": [{"source": "secret", "text": "4417 Elm"}]},
              {"id": "t3", "kind": "compact"}, {"id": "t4", "kind": "user", "text": "tea"},
              {"id": "t5", "kind": "session"}, {"id": "t6", "kind": "user", "text": "call Ana"}],
    "target": {"source": "secret", "value": "4417 Elm"}})


@given(episode=episodes(), budget=kv_budgets())
@example(episode=BEFORE_TWO_COMPACTIONS, budget=0)
@scaled(3)
def test_splice_equals_counterfactual_under_kv_budget(episode, budget):
    for label in get_coverage_labels(episode):
        event(label)
    engine = make_engine("tiny", kv_budget=budget)
    report = compare_forget_with_reset_under_budget(engine, episode)
    event("budget=0" if budget == 0 else ("no budget" if budget is None else "budget>0"))
    event("forget rebuilt an evicted lineage" if report.rebuilt_tokens else "no rebuild")


@given(episode=episodes(), budget=st.one_of(st.none(), kv_budgets()))
@example(episode=BEFORE_TWO_COMPACTIONS, budget=None)
@scaled(3)
def test_reset_prefix_cache_equals_reset(episode, budget):
    for label in get_coverage_labels(episode):
        event(label)
    engine = make_engine("tiny", kv_budget=budget)
    result = compare_prefix_cache_reset_with_reset(engine, episode)
    event("B5' reused tokens" if result.reused_tokens else "B5' reused nothing")
