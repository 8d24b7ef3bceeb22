"""The README's support matrix, generated from what each engine declares.

Each engine class declares ``DIGEST`` (what equal digests mean: ``"kv"`` or
``"tokens"``, :attr:`~unsee.impl.engines.protocol.Determinism.digest`) and
``SUPPORT`` (a few words per column that no type can say: drafts, the KV
budget, the store, receipts). The optional capabilities (prefix cache, span
excision, residue report) are read from the class itself, as the runtime
checks them: whether it implements the capability protocol.
"""

from __future__ import annotations

import importlib

from unsee.impl.engines.protocol import PrefixCache, Residue, SpanExcision
from unsee.impl.engines.registry import BACKENDS, MODEL_TYPES

#: the matrix's columns, in order
COLUMNS = ("engine", "digest means", "drafts and guesses", "prefix cache (B5')", "span excision",
           "residue report", "KV budget", "store", "receipts and `verify`")

#: the words for each digest meaning
DIGEST_MEANINGS = {"kv": "bitwise equal K and V by position",
                   "tokens": "equal token ids; every decision after them within a measured bound (the cold-run guard)"}

#: the backends' names as the README writes them
BACKEND_TITLES = {"transformers": "transformers", "llamacpp": "llama.cpp", "vllm": "vLLM"}


def get_engine_classes() -> dict[str, type]:
    """backend -> engine class, for every backend of the registry (importing
    an engine module imports no backend library)."""
    classes = {row[0]: getattr(importlib.import_module(row[3]), row[4]) for row in MODEL_TYPES}
    return {backend: classes[backend] for backend in BACKENDS}


def get_support_row(backend: str, engine_class: type) -> dict[str, str]:
    """One row of the matrix: the engine's declared words and its capabilities."""
    declared = engine_class.SUPPORT

    def has(capability: type) -> str:
        return "yes" if issubclass(engine_class, capability) else "no"

    return {"engine": BACKEND_TITLES.get(backend, backend), "digest means": DIGEST_MEANINGS[engine_class.DIGEST],
            "drafts and guesses": declared["drafts"], "prefix cache (B5')": has(PrefixCache),
            "span excision": has(SpanExcision), "residue report": has(Residue), "KV budget": declared["kv_budget"],
            "store": declared["store"], "receipts and `verify`": declared["receipts"]}


def get_support_matrix() -> str:
    """The README's support matrix, a Markdown table, one row per engine."""
    rows = [get_support_row(backend, cls) for backend, cls in get_engine_classes().items()]
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row[c] for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines) + "\n"


__all__ = ["BACKEND_TITLES", "COLUMNS", "DIGEST_MEANINGS", "get_engine_classes", "get_support_matrix",
           "get_support_row"]
