"""The README's support matrix, generated from what each engine declares.

Each engine class declares ``DIGEST`` (what equal digests mean: ``"kv"`` or
``"tokens"``, :attr:`~unsee.impl.engines.protocol.Determinism.digest`) and
``SUPPORT`` (a few words per column that no type can say: drafts, the KV
budget, the store, receipts). The optional capabilities (prefix cache, span
excision, residue report) are read from the class itself, as the runtime
checks them: whether it implements the capability protocol.

The real models (SmolLM2, bundled, and the catalogue's, impl/engines/catalog.py)
get a second table, a row per model and engine: whether it loads there, and
then its drafts (a shipped bound where one is, with the CPU it holds on), the
prefix cache, the store and receipts, read from the same declarations.
"""

from __future__ import annotations

import importlib

from unsee.impl.engines.catalog import CATALOG, get_entry
from unsee.impl.engines.decoding import get_draft_bound_row
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


#: the real models' table: its columns, the models (SmolLM2 is bundled, the rest fetched by name)
MODEL_COLUMNS = ("model", "engine", "loads", "drafts", "prefix cache (B5')", "store", "receipts and `verify`")
REAL_MODELS = ("smollm2", *CATALOG)
#: the configuration a shipped transformers bound is read for: the CPU's default, fp32 with sdpa
#: (hf/attention.py's DEFAULT_ATTN; not imported, since it would import torch)
TRANSFORMERS_DEFAULT = ("cpu", "float32", "sdpa")
#: backend -> the models it loads, where not every real model (vLLM takes an HF folder, not a GGUF:
#: SmolLM2's is dequantised for it, impl/engines/vllm/models.py)
LOADS = {"vllm": ("smollm2",)}


def get_model_drafts(backend: str, engine_class: type, name: str) -> str:
    """The drafts cell of a real model on an engine: on transformers, the bound it ships (by
    the configuration's shipped row, or the catalogue's with the CPU it holds on), else the
    engine's own words (llama.cpp measures at load; vLLM has none)."""
    if backend != "transformers":
        return engine_class.SUPPORT["drafts"]
    device, dtype, attn = TRANSFORMERS_DEFAULT
    row = get_draft_bound_row(name, device, dtype, attn)
    if row is not None:
        # the shipped rows (decoding.py) carry no instruction-set key, unlike the catalogue's
        return (f"yes on the CPU, {dtype} {attn}: shipped bound {row[0]:g} (measured on one CPU, applied on any); "
                "else after `unsee calibrate`")
    entry = get_entry(name)
    shipped = entry.bounds.get(TRANSFORMERS_DEFAULT) if entry is not None else None
    if shipped is not None:
        return (f"yes on a CPU with {entry.bounds_isa}, {dtype} {attn}: shipped bound {shipped[0]:g}; "
                "else after `unsee calibrate`")
    return "after `unsee calibrate` (no shipped bound)"


def get_model_row(backend: str, engine_class: type, name: str) -> dict[str, str]:
    """One row of the real models' table."""
    row = {"model": f"`{name}`", "engine": BACKEND_TITLES.get(backend, backend)}
    if name not in LOADS.get(backend, REAL_MODELS):
        return row | {"loads": "no: vLLM takes an HF folder, not a GGUF"} | dict.fromkeys(MODEL_COLUMNS[3:], "-")
    how = "the GGUF dequantised (fp32 or bf16)" if backend == "transformers" else "yes"
    return row | {"loads": how if backend != "vllm" else "yes (the GGUF dequantised to an HF folder)",
                  "drafts": get_model_drafts(backend, engine_class, name),
                  "prefix cache (B5')": "yes" if issubclass(engine_class, PrefixCache) else "no",
                  "store": engine_class.SUPPORT["store"], "receipts and `verify`": engine_class.SUPPORT["receipts"]}


def get_model_matrix() -> str:
    """The README's real models' table, a Markdown table, one row per model and engine."""
    classes = get_engine_classes()
    rows = [get_model_row(backend, cls, name) for name in REAL_MODELS for backend, cls in classes.items()]
    lines = ["| " + " | ".join(MODEL_COLUMNS) + " |", "|" + "---|" * len(MODEL_COLUMNS)]
    lines += ["| " + " | ".join(row[c] for c in MODEL_COLUMNS) + " |" for row in rows]
    return "\n".join(lines) + "\n"


__all__ = ["BACKEND_TITLES", "COLUMNS", "DIGEST_MEANINGS", "LOADS", "MODEL_COLUMNS", "REAL_MODELS",
           "TRANSFORMERS_DEFAULT", "get_engine_classes", "get_model_drafts", "get_model_matrix", "get_model_row",
           "get_support_matrix", "get_support_row"]
