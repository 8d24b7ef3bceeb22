"""The engines' declarations: the support matrix covers every engine and says
what the engines are; every engine module is named in its package's map."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from pathlib import Path

import pytest

from unsee.impl.engines import catalog
from unsee.impl.engines.protocol import PrefixCache, Residue, SpanExcision
from unsee.impl.engines.registry import BACKENDS, load_engine
from unsee.impl.engines.support import (
    BACKEND_TITLES,
    DIGEST_MEANINGS,
    REAL_MODELS,
    get_engine_classes,
    get_model_matrix,
    get_support_matrix,
)

PACKAGES = ("unsee.impl.engines", "unsee.impl.engines.hf", "unsee.impl.engines.llamacpp",
            "unsee.impl.engines.vllm")


def test_the_matrix_has_a_row_per_engine():
    rows = get_support_matrix().splitlines()[2:]
    assert [row.split(" | ")[0].lstrip("| ") for row in rows] == [BACKEND_TITLES[b] for b in BACKENDS]
    for cls in get_engine_classes().values():
        assert cls.DIGEST in DIGEST_MEANINGS and set(cls.SUPPORT) == {"drafts", "kv_budget", "store", "receipts"}


def get_model_cells(model: str, engine: str) -> list[str]:
    row = next(r for r in get_model_matrix().splitlines() if r.startswith(f"| `{model}` | {engine} |"))
    return row.strip("| ").split(" | ")


def test_the_real_models_table_has_a_row_per_model_and_engine(monkeypatch):
    rows = get_model_matrix().splitlines()[2:]
    assert len(rows) == len(REAL_MODELS) * len(BACKENDS) and {"smollm2", "qwen2.5-1.5b", "gemma3-270m"} <= set(REAL_MODELS)
    # a catalogue model's transformers drafts follow its shipped bound and the CPU it holds on
    gemma = catalog.CATALOG["gemma3-270m"]
    assert "shipped bound 0.001; else" in get_model_cells("gemma3-270m", "transformers")[3]
    assert f"a CPU with {gemma.bounds_isa}" in get_model_cells("gemma3-270m", "transformers")[3]
    monkeypatch.setitem(catalog.CATALOG, "gemma3-270m", dataclasses.replace(gemma, bounds={}))
    assert get_model_cells("gemma3-270m", "transformers")[3] == "after `unsee calibrate` (no shipped bound)"
    # what the engine class declares, and vLLM loads no GGUF of the catalogue
    llama = get_engine_classes()["llamacpp"]
    assert get_model_cells("qwen2.5-1.5b", "llama.cpp")[3:] == [
        llama.SUPPORT["drafts"], "yes" if issubclass(llama, PrefixCache) else "no", llama.SUPPORT["store"],
        llama.SUPPORT["receipts"]]
    assert get_model_cells("qwen2.5-1.5b", "vLLM")[2].startswith("no") and get_model_cells("smollm2", "vLLM")[2] != "no"


@pytest.mark.parametrize("name", ["tiny", "llamacpp-tiny"])
def test_a_built_engine_is_what_its_class_declares(name, one_thread):
    if name.startswith("llamacpp"):
        pytest.importorskip("llama_cpp")
    engine = load_engine(name)
    cls = type(engine)
    assert engine.determinism.digest == cls.DIGEST
    for capability in (PrefixCache, SpanExcision, Residue):
        assert isinstance(engine, capability) == issubclass(cls, capability)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_is_named_in_its_packages_map(package):
    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__):
        name = f"``{info.name}/``" if info.ispkg else f"``{info.name}``"
        assert name in pkg.__doc__, f"{package}'s docstring does not name {name}"


def test_the_forget_report_says_what_its_digest_means(lm):
    from unsee.impl.agent.episode import load_episode
    from unsee.impl.agent.runtime import AgentRuntime
    from unsee.impl.engines.registry import make_engine

    episode = load_episode(Path(__file__).resolve().parent.parent / "examples" / "secret_in_tool_result.json")
    runtime = AgentRuntime.start(make_engine(lm), episode.system, episode.settings)
    runtime.run(episode.steps)
    report = runtime.forget(episode.target.source)
    assert report.digest_means == runtime.engine.determinism.digest == "kv"
    assert report.to_json()["digest_means"] == "kv"
