"""Which engine made a stored session, and how to build it again
(docs/persistence.md, "Which engine").

A store's ``meta`` records, besides ``model`` (the loaded model's name) and
``dtype``:

``backend``         the registry backend (:data:`~unsee.impl.engines.registry.BACKENDS`)
``model_ref``       what the registry loads that model from: a name (``tiny``,
                    ``smollm2``) or the path given at creation
``engine_options``  JSON object: the loader options the state's bits depend on
                    (llama.cpp: ``flash_attn``, ``n_ctx``,
                    ``exact_kernels``: absent in stores written before it, which
                    then load with the loader's default; ``row_order``, repacked
                    Q4_K summed in decode's order: absent in stores written
                    before it, which hold the file layout's bits and so load
                    with it off (:data:`LEGACY_LLAMACPP`); ``threads`` and
                    ``batch_threads`` only where the bits depend on them, a model
                    that is not ``thread_invariant``: a store of a thread-invariant
                    engine reopens on the loader's default threads, every core, and
                    one written when every store recorded them reopens on its
                    recorded counts, as before;
                    transformers: ``attn``, the attention implementation, besides
                    ``dtype``; the device is the caller's. A transformers store
                    without ``attn`` was made with ``unsee_eager``, the only one then;
                    vLLM: ``block_size``, ``max_model_len``, ``tensor_parallel_size``,
                    ``pipeline_parallel_size``, see :data:`RECORDED_OPTIONS`)

``unsee forget``, ``show`` and ``verify`` rebuild the engine from these
through :mod:`unsee.impl.engines.registry`. A store written before these keys
existed (every such store was written by the transformers engine, the only
one the store used then) reads as ``backend`` transformers, ``model_ref`` its
``model`` and no options.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from unsee.impl.engines.protocol import Engine
from unsee.impl.engines.registry import BACKENDS, DEFAULT_BACKEND, get_backend_of_model, load_engine, load_model_for
from unsee.impl.store.schema import StoreError

#: The backend of a store that records none (written before the key existed).
LEGACY_BACKEND = DEFAULT_BACKEND
#: Per backend, the loader options recorded because the KV bits depend on
#: them (llama.cpp's thread count, attention kernel and context size).
#: vLLM's digest covers token ids only, but what a reopened session computes depends on:
#: ``block_size`` (a restore is a prefix-cache hit rounded down to it: the forget's cached
#: and recomputed tokens, and which logits a hit serves), ``max_model_len`` (which turns fit),
#: the tensor and pipeline parallel sizes (the cold run's reductions, so the logits' last bits
#: and the near-ties the margin guard recomputes). The executor (``ray``, ``mp``) computes the
#: same bits and is the caller's; salts are not recorded: a reopened session holds no cached
#: block and draws fresh ones (impl/engines/vllm/engine.py).
RECORDED_OPTIONS = {"transformers": ("attn",), "llamacpp": ("threads", "flash_attn", "n_ctx", "exact_kernels",
                                                                  "batch_threads", "row_order"),
                    "vllm": ("block_size", "max_model_len", "tensor_parallel_size", "pipeline_parallel_size")}
#: What a llama.cpp store that records none of these options was written with.
LEGACY_LLAMACPP = {"row_order": False}
#: Loader options a thread-invariant model's bits do not depend on: not recorded for it.
THREAD_OPTIONS = ("threads", "batch_threads")
#: The attention of a transformers store that records none (written before ``--attn`` existed).
LEGACY_ATTN = "unsee_eager"
#: llama.cpp's model names whose loaded name differs from the name to load.
LLAMACPP_LOADED_NAMES = {"tiny-gguf": "tiny"}
#: vLLM's model names whose loaded name differs from the name to load (impl/engines/vllm/models.py).
VLLM_LOADED_NAMES = {"vllm-tiny": "tiny", "vllm-tiny-ties": "tiny-ties"}
#: Per backend, its table of loaded name -> name to load.
LOADED_NAMES = {"llamacpp": LLAMACPP_LOADED_NAMES, "vllm": VLLM_LOADED_NAMES}


@attrs.frozen
class StoredEngine:
    """How to build a stored session's engine: ``backend``, ``model`` (what
    the registry loads) and the recorded loader ``options``."""

    backend: str
    model: str
    options: dict[str, Any] = attrs.field(factory=dict)

    def get_loader_options(self, meta: dict[str, str], device: str = "cpu") -> dict[str, Any]:
        """The registry's loader options: transformers takes ``device`` and the
        stored ``dtype``; vLLM the same and its recorded options; llama.cpp its
        recorded options, on the cpu only."""
        if self.backend == "vllm":
            return {"device": device, "dtype": meta["dtype"], **self.options}
        if self.backend == "llamacpp":
            if device != "cpu":
                raise ValueError(f"the session was made by the llamacpp engine, which runs on the cpu here; "
                                 f"--device {device!r} is not supported")
            return dict(self.options)
        return {"device": device, "dtype": meta["dtype"], "attn": LEGACY_ATTN, **self.options}


def get_backend_of(engine: Engine) -> str:
    """The registry backend of a built engine (as the registry's ``make_engine`` tells them apart)."""
    return get_backend_of_model(engine.lm)


def get_engine_meta(engine: Engine) -> dict[str, str]:
    """The meta entries naming how ``engine`` is built again (module docstring)."""
    backend = get_backend_of(engine)
    lm = engine.lm
    name = str(lm.name)
    model_ref = LOADED_NAMES.get(backend, {}).get(name, name)
    options = {key: getattr(lm, key, None) for key in RECORDED_OPTIONS[backend]
               if key not in THREAD_OPTIONS or not getattr(lm, "thread_invariant", False)}
    return {"backend": backend, "model_ref": model_ref, "engine_options": json.dumps(options, sort_keys=True)}


def read_stored_engine(meta: dict[str, str], path: object = "the store") -> StoredEngine:
    """The :class:`StoredEngine` of a store's ``meta``; a store without the
    keys is a transformers session of its ``model``. A backend this build
    does not know, or options that are not a JSON object, is a StoreError."""
    backend = meta.get("backend", LEGACY_BACKEND)
    if backend not in BACKENDS:
        raise StoreError(f"{path}: the session was made by engine {backend!r}, which this build does not have "
                         f"(it has {', '.join(BACKENDS)})")
    try:
        options = json.loads(meta.get("engine_options", "{}"))
    except ValueError:
        options = None
    if not isinstance(options, dict) or set(options) - set(RECORDED_OPTIONS[backend]):
        raise StoreError(f"{path}: damaged session store (engine_options {meta.get('engine_options')!r} is not a "
                         f"JSON object of {RECORDED_OPTIONS[backend] or 'no'} options)")
    if backend == "llamacpp":
        options = {**LEGACY_LLAMACPP, **options}
    return StoredEngine(backend, meta.get("model_ref", meta["model"]), options)


def check_engine_choice(meta: dict[str, str], engine: str | None, path: object = "the store") -> StoredEngine:
    """The stored engine, after checking ``engine`` (a backend name, or None
    for any) against it: a session continues only on the engine that made it."""
    stored = read_stored_engine(meta, path)
    if engine is not None and engine != stored.backend:
        raise StoreError(f"{path}: the session was made by the {stored.backend} engine; it cannot continue on "
                         f"the {engine} engine")
    return stored


def load_stored_model(meta: dict[str, str], device: str = "cpu", path: object = "the store"):
    """The stored session's model, loaded through the registry from what the store recorded."""
    stored = read_stored_engine(meta, path)
    return load_model_for(stored.backend, stored.model, **stored.get_loader_options(meta, device))


def load_stored_engine(meta: dict[str, str], device: str = "cpu", kv_budget: int | None = None,
                       path: object = "the store") -> Engine:
    """An engine for the stored session, built through the registry from what the store recorded."""
    stored = read_stored_engine(meta, path)
    return load_engine(stored.model, stored.backend, kv_budget=kv_budget,
                       **stored.get_loader_options(meta, device))


__all__ = ["LEGACY_ATTN", "LEGACY_BACKEND", "LEGACY_LLAMACPP", "LLAMACPP_LOADED_NAMES", "LOADED_NAMES", "RECORDED_OPTIONS",
           "THREAD_OPTIONS", "VLLM_LOADED_NAMES", "StoredEngine", "check_engine_choice", "get_backend_of", "get_engine_meta",
           "load_stored_engine", "load_stored_model", "read_stored_engine"]
