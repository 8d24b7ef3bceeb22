"""The conformance contract's name and version, the fields an answer may
hold, and the reference it is checked against.

docs/conformance.schema.json is the contract's one source; :data:`FIELDS`
is what the harness reads of it, and tests/test_conform_contract.py checks
that the two agree field for field. Pure Python: no torch, no runtime import.
"""

from __future__ import annotations

import difflib
from typing import Any

#: The contract's name and version (docs/conformance.md); a result names both.
CONTRACT = "unsee.conformance"

#: Version 2 refuses a field it does not define (version 1 ignored one, so a
#: misplaced ``kept`` turned the residue check off without a word).
CONTRACT_VERSION = 2

#: What an older version meant, for the message that refuses it.
RETIRED_VERSIONS = {1: "version 1 ignored fields it did not define, so a misplaced field turned a check off; "
                       "version 2 refuses them: answer version 2 with only the fields docs/conformance.schema.json "
                       "defines"}

#: Every object of an answer by its path (``[]``: each element of a list), and
#: the fields it may hold; ``turns`` objects map step ids and are not listed.
FIELDS: dict[str, tuple[str, ...]] = {
    "": ("contract", "version", "implementation", "run", "forget", "reset"),
    "implementation": ("name", "engine", "model"),
    "run": ("T", "turns", "digest", "checkpoints", "kept", "effects"),
    "run.kept[]": ("name", "text", "base64"),
    "forget": ("source", "tau", "boundary", "invocations", "digest_before", "digest_after", "turns", "kept",
               "effects", "reopened", "again"),
    "forget.kept[]": ("name", "text", "base64"),
    "forget.reopened": ("digest", "turns"),
    "forget.again": ("digest_after", "turns"),
    "reset": ("invocations", "digest_before", "digest_after", "turns"),
}

#: The engine name under which an implementation declares our transformers
#: runtime; with a model we can load (:data:`REFERENCE_MODELS`) the harness
#: compares its tokens with our own run.
REFERENCE_ENGINE = "unsee-transformers"

REFERENCE_MODELS = ("tiny", "smollm2")


def make_answer(name: str, engine: str, model: str, run: dict) -> dict:
    """An adapter's answer as the contract frames it: its name and version, the
    implementation that ran and the run's fields (a forget's are added to it)."""
    return {"contract": CONTRACT, "version": CONTRACT_VERSION,
            "implementation": {"name": name, "engine": engine, "model": model}, "run": run}


def find_undefined_fields(raw: Any, path: str = "", where: str = "") -> list[tuple[str, str, str]]:
    """Every field of ``raw`` that the contract does not define, in answer
    order, as ``(path, where, field)``: ``path`` in :data:`FIELDS`' notation,
    ``where`` with list indices (``forget.kept[2]``). Objects of the wrong type
    are left to the type checks."""
    if not isinstance(raw, dict) or path not in FIELDS:
        return []
    out = [(path, where, key) for key in raw if key not in FIELDS[path]]
    for key, value in raw.items():
        child, child_where = (f"{path}.{key}", f"{where}.{key}") if path else (key, key)
        if isinstance(value, list) and f"{child}[]" in FIELDS:
            for i, element in enumerate(value):
                out += find_undefined_fields(element, f"{child}[]", f"{child_where}[{i}]")
        elif key in FIELDS[path]:
            out += find_undefined_fields(value, child, child_where)
    return out


def describe_undefined_field(path: str, where: str, field: str) -> str:
    """Why ``field`` at ``where`` (an object at ``path``) is refused, with the
    field it was probably meant to be: the same name where the contract reads
    it, else a close spelling, else the fields that object may hold."""
    at = f"`{field}` at " + ("the top level" if not where else f"`{where}`")
    homes = [p for p, names in FIELDS.items() if field in names and p != path]
    if homes:
        reads = " and ".join(f"`{p.replace('[]', '')}.{field}`" if p else f"`{field}`" for p in homes)
        return f"{at}: the contract reads {reads}"
    close = difflib.get_close_matches(field, FIELDS[path], n=1)
    if close:
        return f"{at}: the contract defines no such field; did you mean `{close[0]}`?"
    return f"{at}: the contract defines no such field (it defines {', '.join(FIELDS[path])})"


__all__ = ["CONTRACT", "CONTRACT_VERSION", "FIELDS", "REFERENCE_ENGINE", "REFERENCE_MODELS", "RETIRED_VERSIONS",
           "describe_undefined_field", "find_undefined_fields", "make_answer"]
