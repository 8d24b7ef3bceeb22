"""The architecture zoo (impl/engines/hf/zoo.py): every family loads by name
through the registry, and our grouped attention gives the bits of the
family's own eager attention (the Llama-code families are grouped, Gemma's
soft-capped eager functions are handed through), sliding layers included."""

from __future__ import annotations

import pytest

from unsee.impl.engines.hf import adapter, attention, zoo
from unsee.impl.engines.registry import ENGINE_NAMES, parse_engine_name
from unsee.properties.engines import get_model, make_engine

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", zoo.ZOO_NAMES)
def test_family_is_an_engine_name(name):
    assert parse_engine_name(name) == ("transformers", name)
    assert name in ENGINE_NAMES
    lm = get_model(name)
    # the CPU default, sdpa, but where the family's class has none (Gemma 2's soft-capped scores): ours
    default = adapter.ATTN_IMPLEMENTATION if name == "tiny-gemma2" else attention.get_default_attn("cpu")
    assert lm.attn == lm.model.config._attn_implementation == default
    assert lm.vocab_size == 259 and lm.encode("<|im_start|>a") == [257, 97]


def test_tiny_llama_is_tiny():
    a, b = make_engine("tiny-llama"), make_engine("tiny")
    handles = []
    for engine in (a, b):
        handles.append(engine.new_lineage())
        engine.prefill(handles[-1], list(range(30)))
    assert a.digest(handles[0]) == b.digest(handles[1])


def test_unknown_family_is_named():
    with pytest.raises(ValueError, match="'tiny-gemma9' is neither a known name"):
        get_model("tiny-gemma9")


def run_turns(name: str) -> tuple:
    engine = make_engine(name, attn="unsee_eager")  # ours, whatever the default: its grouping is the subject
    lin = engine.new_lineage()
    ids = [(11 * i + 5) % 256 for i in range(70)]
    for i in range(0, len(ids), 16):
        engine.prefill(lin, ids[i:i + 16])
    return engine.digest(lin), engine.generate(lin, 10, stop_ids=())


@pytest.mark.parametrize("name", zoo.ZOO_NAMES)
def test_grouped_attention_keeps_the_familys_eager_bits(monkeypatch, name):
    monkeypatch.setattr(adapter, "GROUPED_ATTENTION_FROM", 10**9)  # the family's eager function throughout
    eager = run_turns(name)
    monkeypatch.setattr(adapter, "GROUPED_ATTENTION_FROM", 4)  # grouped from 4 keys (sliding layers too)
    assert run_turns(name) == eager
