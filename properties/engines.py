"""Which engines the properties run on: ``UNSEE_ENGINE``.

``UNSEE_ENGINE`` names one engine or several, comma-separated, from
:data:`unsee.impl.engines.protocol.ENGINE_NAMES`: ``tiny`` and ``smollm2`` (transformers),
``llamacpp-tiny`` (llama.cpp over the tiny random GGUF) and ``llamacpp``
(llama.cpp over the embedded SmolLM2 GGUF). Unset, the engine-level
properties run on ``tiny`` and, where llama-cpp-python is installed,
``llamacpp-tiny``; ``prop_impl.py`` runs the episode-level properties on
``tiny`` and ``prop_impl_engines.py`` on the others
(:func:`other_engine_names`).

Models are loaded once per process and name; :func:`make_engine` builds a
fresh engine on one for every example, so nothing leaks between examples.
A name whose extra is missing fails with the install hint, never skips
silently, when ``UNSEE_ENGINE`` asked for it.
"""

from __future__ import annotations

import functools
import os

from unsee.impl.engines.protocol import Engine
from unsee.impl.engines.registry import ENGINE_NAMES


def _requested() -> list[str] | None:
    raw = os.environ.get("UNSEE_ENGINE", "").strip()
    if not raw:
        return None
    names = [n.strip() for n in raw.split(",") if n.strip()]
    bad = [n for n in names if n not in ENGINE_NAMES]
    if bad:
        raise ValueError(f"UNSEE_ENGINE={raw!r}: {bad} not among {ENGINE_NAMES}")
    return names


def llamacpp_available() -> bool:
    from unsee.impl.engines.llamacpp.engine import available

    return available()


def verb_engine_names() -> list[str]:
    """Engines the engine-level (verb) properties run on."""
    requested = _requested()
    if requested is not None:
        return requested
    return ["tiny"] + (["llamacpp-tiny"] if llamacpp_available() else [])


def other_engine_names() -> list[str]:
    """Engines ``prop_impl_engines.py`` runs the episode-level properties on
    (``prop_impl.py`` covers ``tiny``): those ``UNSEE_ENGINE`` names but
    ``tiny``, else ``llamacpp-tiny`` where installed, else none."""
    requested = _requested()
    if requested is not None:
        return [n for n in requested if n != "tiny"]
    return ["llamacpp-tiny"] if llamacpp_available() else []


@functools.cache
def _model(name: str):
    if name.startswith("llamacpp"):
        from unsee.impl.engines.llamacpp.engine import load_llamacpp

        return load_llamacpp("tiny" if name == "llamacpp-tiny" else "smollm2", threads=1, n_ctx=4096)
    from unsee.impl.engines.hf.models import load_model

    return load_model(name)


def make_engine(name: str, kv_budget: int | None = None) -> Engine:
    """A fresh engine of kind ``name`` (the model is loaded once)."""
    if name.startswith("llamacpp"):
        from unsee.impl.engines.llamacpp.engine import LlamaCppEngine

        return LlamaCppEngine(_model(name), kv_budget=kv_budget)
    from unsee.impl.engines.hf.engine import KVEngine

    return KVEngine(_model(name), kv_budget=kv_budget)
