"""Which engines the properties run on: ``UNSEE_ENGINE``.

``UNSEE_ENGINE`` names one engine or several, comma-separated, from
:data:`unsee.impl.engines.protocol.ENGINE_NAMES`: ``tiny`` and ``smollm2`` (transformers),
``llamacpp-tiny`` (llama.cpp over the tiny random GGUF) and ``llamacpp``
(llama.cpp over the embedded SmolLM2 GGUF), ``vllm-tiny`` and ``vllm`` (vLLM,
in its own venv: ``make test-vllm`` runs them on ``vllm-tiny``). Unset, the engine-level
properties run on ``tiny`` and, where llama-cpp-python is installed,
``llamacpp-tiny``; ``prop_impl.py`` runs the episode-level properties on
``tiny`` and ``prop_impl_engines.py`` on the others
(:func:`other_engine_names`).

This is the properties' (and the tests') one place that builds engines for
a test, through :mod:`unsee.impl.engines.registry`: :func:`get_model` loads
a model once per process, name and options; :func:`make_engine` builds a
fresh engine on it for every example, so nothing leaks between examples.
``tests/conftest.py`` and ``properties/conftest.py`` wrap these as fixtures.
A name whose extra is missing fails with the install hint, never skips
silently, when ``UNSEE_ENGINE`` asked for it.
"""

from __future__ import annotations

import functools
import os

from unsee.impl.engines.protocol import Engine
from unsee.impl.engines.registry import ENGINE_NAMES, load_model_for, parse_engine_name
from unsee.impl.engines.registry import make_engine as make_engine_over


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
def get_model(name: str, **options):
    """The loaded model of ``name``, once per process, name and options.

    ``name`` is a one-word engine name (:data:`ENGINE_NAMES`) or another
    transformers model (``tiny-ties``, a path); ``options`` go to the
    backend's loader (``dtype``, ``device``; ``threads``, ``n_ctx``). The
    llama.cpp models run on one thread with a 4,096-token context unless
    ``options`` say otherwise."""
    backend, model = parse_engine_name(name) if name in ENGINE_NAMES else ("transformers", name)
    if backend == "llamacpp":
        options = {"threads": 1, "n_ctx": 4096} | options
    return load_model_for(backend, model, **options)


def make_engine(name: str, kv_budget: int | None = None, **options) -> Engine:
    """A fresh engine of kind ``name`` over its shared model (:func:`get_model`)."""
    return make_engine_over(get_model(name, **options), kv_budget)
