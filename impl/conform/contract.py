"""The conformance contract's name and version, and the reference it is checked against."""

from __future__ import annotations

#: The contract's name and version (docs/conformance.md); a result names both.
CONTRACT = "unsee.conformance"

CONTRACT_VERSION = 1

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
