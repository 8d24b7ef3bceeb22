"""The transformers backend:

``engine``       KVEngine: the lineage book's verbs over transformers KV caches, with excise and a deep copy
``kv``           one cache and its chunk history (``Lineage``), and the book's backend over them (``HFKV``)
``models``       load_model: names, folders, GGUFs (dequantised, cached), the tiny models
``adapter``      every transformers call but the cache's
``cache``        the KV cache itself: build, measure, crop, share, excise a ``DynamicCache``
``attention``    the attention implementations and their measured bitwise facts
``discrepancy``  the prefill-versus-decode logit discrepancy that bounds drafts, measured
``hidden``       mean-pooled hidden states (the distributional audit's embedding)
``tokenizer``    the tokenizer part of a loaded model (also vLLM's)
``zoo``          tiny random models of other transformers families
"""
