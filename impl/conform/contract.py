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
