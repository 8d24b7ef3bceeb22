"""The implementation: an agent runtime that forgets by selective replay, on real engines.

Subsystems, lowest first; a module imports its own subsystem and those below
it, never one above (tests/test_architecture.py reads the imports and checks):

``util/``     text normalisation, the one-operation-at-a-time lock, progress bars
``engines/``  KV caches as lineages behind one protocol; the registry that builds
              every engine; the transformers (``hf/``) and llama.cpp backends
``agent/``    the runtime: state, transition ``F``, Algorithm 1 and the full reset,
              provenance, checkpoints, drafts, prompt rendering, episodes, and the
              extensions it owns (the tool layer, ``agent/tools/``)
``methods/``  the paper's baselines B0-B9, acting through the runtime's public verbs
``store/``    sessions on disk (SQLite): schema, records, crash-atomic forget,
              erasure receipts and their verification
``eval/``     the paper's evaluation: suites, runs, metrics, audits, statistics,
              the report, and the paper's own figures (``eval/paper.py``)
``conform/``  the conformance contract, its harness, episode generator and adapters
``cli/``      the ``unsee`` command: one function per subcommand, one exit-code table

The public API is ``from unsee import ...`` (unsee/__init__.py).
"""
