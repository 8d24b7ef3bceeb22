"""Properties of the episode generators (impl/conform/episodes.py).

===================================  =============================================================
test                                 checks
===================================  =============================================================
generated_episodes_round_trip        every generated episode (any secrets, framed or not, with or
                                     without labels) is a valid file: parse(to_json(e)) == e
rare_secrets_are_the_targets_alone   with ``rare_secrets``, no other item's text holds any
                                     normalised variant of the target's value
indep_is_exact                       an indep episode has exactly ``indep`` of its post-target
                                     model turns labelled, none before, and labelled work never
                                     holds the target's value
forget_equals_reset_on_indep         (tiny model) forget == full reset on indep episodes
===================================  =============================================================
"""

from __future__ import annotations

import functools
import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from unsee.impl.agent.episode import MODEL_TURN_KINDS, Episode, episode_to_json, parse_episode
from unsee.impl.conform.episodes import (
    INDEP_LEVELS,
    TARGET,
    episode_jsons,
    get_indep,
    get_tau,
    indep_episode_jsons,
    indep_episodes,
    rare_secrets,
    scaled,
    secrets,
)
from unsee.impl.engines.hf.engine import KVEngine
from unsee.impl.util.text import get_variants, normalize
from unsee.properties.differential import compare_forget_with_reset, engine_scope
from unsee.properties.engines import make_engine


@given(raw=st.one_of(episode_jsons(secrets=secrets() | rare_secrets(), framed=True), episode_jsons(),
                     indep_episode_jsons()))
def test_generated_episodes_round_trip(raw):
    episode = parse_episode(raw)
    assert parse_episode(json.loads(json.dumps(episode_to_json(episode)))) == episode
    assert episode.target.source == TARGET
    target = [i for s in episode.steps for i in s.items if i.source == TARGET]
    assert len(target) == 1 and episode.target.value in target[0].text


@given(raw=episode_jsons(secrets=rare_secrets(), framed=True))
def test_rare_secrets_are_the_targets_alone(raw):
    episode = parse_episode(raw)
    variants = get_variants(episode.target.value)
    for step in episode.steps:
        for item in step.items:
            if item.source != TARGET:
                assert not any(v in normalize(item.text) for v in variants), (item, variants)


@given(data=st.data(), indep=st.sampled_from(INDEP_LEVELS))
def test_indep_is_exact(data, indep):
    episode = data.draw(indep_episodes(indep), label="episode")
    tau = get_tau(episode)
    after = [s for s in episode.steps[tau:]]
    assert all(s.kind in MODEL_TURN_KINDS for s in after) and len(after) % 4 == 0
    assert get_indep(episode) == indep
    assert sum(s.independent for s in after) == indep * len(after)
    assert not any(s.independent for s in episode.steps[:tau])
    for step in after:
        if step.independent:
            assert all(normalize(episode.target.value) not in normalize(i.text) for i in step.items)


#: One torch thread for the model calls (the properties' convention, properties/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def tiny_engine() -> KVEngine:
    return make_engine("tiny")


ALL_INDEPENDENT = parse_episode({
    "format": "unsee.episode", "version": 2, "system": "Be brief.",
    "settings": {"max_new_tokens": 3, "checkpoint_policy": "before_injection"},
    "steps": [{"id": "t1", "kind": "tool", "fields": [{"source": TARGET, "text": "4417 Elm"}]},
              {"id": "t2", "kind": "tool", "tool": "poll", "fields": [{"source": "t2.0", "text": "status ok"}],
               "independent": True},
              {"id": "t3", "kind": "compact"},
              {"id": "t4", "kind": "user", "text": "Count to five.", "independent": True},
              {"id": "t5", "kind": "plan", "tool": "pay", "text": "Name a blue flower.", "independent": True}],
    "target": {"source": TARGET, "value": "4417 Elm"}})


@given(episode=indep_episodes(groups=(1, 1), max_new_tokens=(2, 3)))
@example(episode=ALL_INDEPENDENT)
@scaled(6)
def test_forget_equals_reset_on_indep(episode: Episode):
    """The indep episodes run: the labels change nothing about the exact forget."""
    engine = tiny_engine()
    with engine_scope(engine):
        compare_forget_with_reset(engine, episode)
