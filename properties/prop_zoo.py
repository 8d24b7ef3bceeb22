"""The architecture zoo (impl/engines/hf/zoo.py) on the transformers engine:
every family runs the engine-verb properties and forget == reset.

================================  ===================================================================
test                              checks (the family is in every id: ``[tiny-gemma3-...]``)
================================  ===================================================================
engine_verbs_on_family            each property of ``prop_engine_verbs.py`` on the family's engine
forget_equals_reset_on_family     forget with drafts and context guesses == full reset (digest and
                                  every token id), greedy and seeded sampling; drafts verified
                                  under the family's measured bound (the row of its attention:
                                  SDPA_DRAFT_BOUNDS, or DRAFT_BOUNDS for ours)
forget_under_budget_on_family     the same under drawn KV budgets (evictions, rebuilds), windowed
                                  families only (their lineages hold the full sequence)
refused_family_fails_first        a family in ``zoo.REFUSED`` fails by name, with the reason,
                                  before any model is built
================================  ===================================================================

Every episode is longer than the zoo's 8-token windows (the ChatML framing
alone is longer), so every forget crops and replays across a window's edge.

Budget: ``ci`` runs :func:`zoo_settings` examples (a sixth of the profile's,
10) of forget == reset per family and the verbs at their own scaled counts;
``nightly`` half the profile's, 1,000 per family. ``UNSEE_ZOO`` picks
families (comma-separated), default all.
"""

from __future__ import annotations

import functools
import os

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from unsee.impl.conform.episodes import episodes, get_coverage_labels
from unsee.impl.engines.hf import models, zoo
from unsee.properties import prop_engine_verbs as verbs
from unsee.properties.differential import (
    compare_forget_with_reset,
    compare_forget_with_reset_under_budget,
    engine_scope,
)
from unsee.properties.engines import make_engine

pytestmark = pytest.mark.usefixtures("one_thread")


def zoo_families() -> list[str]:
    """The families to run: ``UNSEE_ZOO`` (comma-separated), else all of :data:`zoo.ZOO_NAMES`."""
    raw = os.environ.get("UNSEE_ZOO", "").strip()
    names = [n.strip() for n in raw.split(",") if n.strip()] or list(zoo.ZOO_NAMES)
    bad = [n for n in names if n not in zoo.ZOO_NAMES]
    if bad:
        raise ValueError(f"UNSEE_ZOO={raw!r}: {bad} not among {zoo.ZOO_NAMES}")
    return names


WINDOWED = [n for n in zoo_families() if "sliding_window" in getattr(zoo.ZOO.get(n), "config", {})]
per_family = pytest.mark.parametrize("family", zoo_families())
VERBS = [verbs.test_crop_then_continue, verbs.test_clone_is_independent, verbs.test_generate_follows_the_rule,
         verbs.test_drop_frees_the_lineage, verbs.test_digest_sees_every_position]
per_verb = pytest.mark.parametrize("verb", VERBS, ids=[v.__name__.removeprefix("test_") for v in VERBS])


def zoo_settings() -> settings:
    """A sixth of the profile's examples (ci: 10), half of them from 1,000 on (nightly: 1,000)."""
    total = settings().max_examples
    return settings(max_examples=max(1, total // 2 if total >= 2000 else total // 6))


@functools.cache
def get_engine(name: str):
    """One engine per name for the module (a family, or its llama.cpp engine)."""
    return make_engine(name)


@per_family
@per_verb
def test_engine_verbs_on_family(family, verb):
    verb(engine_name=family)


drafted_episodes = functools.partial(episodes, min_steps=2, max_steps=6, max_new_tokens=(2, 8))


@per_family
@given(episode=drafted_episodes())
@zoo_settings()
def test_forget_equals_reset_on_family(family, episode):
    engine = get_engine(family)
    assert engine.draft_bound and engine.draft_bound > 0, f"{family}: no measured draft bound ({engine.draft_bound_source})"
    with engine_scope(engine):
        report = compare_forget_with_reset(engine, episode, drafts=True)
        assert report.drafts.mode == "verify"
        event("sampled" if episode.settings.temperature > 0 else "greedy")
        event(f"draft tokens accepted: {report.draft_accepted_tokens > 0}")
        event(f"context guesses accepted: {report.drafts.totals['lookup_accepted'] > 0}")


@pytest.mark.parametrize("family", WINDOWED)
@given(episode=episodes(), budget=st.one_of(st.just(0), st.integers(0, 200_000)))
@zoo_settings()
def test_forget_under_budget_on_family(family, episode, budget):
    for label in get_coverage_labels(episode):
        event(label)
    report = compare_forget_with_reset_under_budget(make_engine(family, kv_budget=budget), episode)
    event("forget rebuilt an evicted lineage" if report.rebuilt_tokens else "no rebuild")


def test_refused_family_fails_first(monkeypatch):
    built = []
    monkeypatch.setitem(zoo.REFUSED, "tiny-odd", "its experts are picked by a random router (for the test)")
    monkeypatch.setattr(models.adapter, "build_tiny_model", lambda *a, **k: built.append(a))
    monkeypatch.setattr(models.adapter, "build_tiny_llama", lambda *a, **k: built.append(a))
    with pytest.raises(ValueError, match=r"model family 'tiny-odd' is refused: its experts are picked"):
        models.load_model("tiny-odd")
    assert built == []
