"""Engines: KV caches as lineages, behind one protocol, on three backends.

An engine holds lineages (string handles to KV caches) over one loaded model,
and offers the verbs the agent runtime replays with (prefill, generate,
crop, share_prefix, clone, drop, digest, logits), a KV budget with pins, and
a prefix cache. Everything above this package is typed against
:class:`protocol.Engine` and builds engines through :mod:`registry`.

The map:

``protocol``   the :class:`~protocol.Engine` protocol, :class:`~protocol.Determinism`
               (what an engine guarantees bit for bit) and ``ModelInfo``
``registry``   the one way to build an engine: ``load_engine(model, backend,
               kv_budget, **options)``, ``make_engine(lm)``, ``load_model_for``,
               the one-word names of ``UNSEE_ENGINE`` (``ENGINE_NAMES``)
``lineage``    what every engine shares: :class:`~lineage.LineageBook` (handles,
               the current lineage, pins, LRU clock, the KV budget's eviction,
               written once), :class:`~lineage.Counters`, :class:`~lineage.KVMemory`
``decoding``   the decoding rule every engine applies (greedy or the seeded
               exponential race), the drafts' measured bounds and thresholds,
               and context lookup
``files``      model files that need no transformers: the byte tokenizer, the
               cache folder, the embedded SmolLM2 GGUF
``hf/``        the transformers backend: ``engine`` (:class:`KVEngine`),
               ``generate`` (one decoding turn: drafts, probe, lookup),
               ``lineage`` (one cache and its chunk history), ``models``
               (``load_model``), ``adapter`` (every transformers call)
``llamacpp/``  the llama.cpp backend: ``engine`` (:class:`LlamaCppEngine`,
               ``load_llamacpp``), ``state`` (sequence state blobs as K and V
               rows, :class:`SeqKV`), ``tiny_gguf`` (the tiny random GGUF);
               reaches no transformers
``vllm/``      the vLLM backend (the extra ``unsee[vllm]``): ``engine`` (:class:`VllmEngine`:
               lineages as tokens and a cache salt, the cold-run margin guard,
               the residue report), ``models`` (``load_vllm``), ``adapter`` (every vLLM call)

This package imports nothing on import (no torch): import the module you need,
or use :func:`registry.load_engine`, which imports a backend only when asked
for it.
"""
