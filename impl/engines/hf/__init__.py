"""The transformers backend: ``engine`` (KVEngine), ``generate`` (one decoding
turn), ``lineage`` (one cache and its chunk history), ``models`` (load_model)
and ``adapter`` (every transformers call)."""
