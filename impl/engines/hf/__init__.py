"""The transformers backend: ``engine`` (KVEngine), ``generate`` (the lineage as the
decoding turn of ``engines/turn.py`` sees it), ``lineage`` (one cache and its chunk history), ``models`` (load_model)
and ``adapter`` (every transformers call)."""
