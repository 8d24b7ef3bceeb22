"""The llama.cpp backend (reaches no transformers):

``engine``     LlamaCppEngine: the lineage book's verbs over one llama.cpp context
``rows``       one lineage (tokens, parked rows, chunk history), and the book's backend
               over the context (``LlamaRows``: residency, parking, the digest)
``model``      load_llamacpp, LlamaCppModel: the GGUF, its context options, its measured facts
``facts``      whether decode equals prefill bit for bit, measured at load and cached
``kernels``    the switches of the library's build: a lone decode row whole on one thread (one
               thread's bits on every core), repacked Q4_K in decode's order; the build into the
               venv, whether the library has them
``repack``     the patch that sums a repacked Q4_K batch's rows in the one-row kernel's order
``cost``       what one more token in a forward costs in decode steps (the draft policy's
               ``per_token``), measured at load and cached beside the facts
``state``      sequence state blobs as K and V rows by position
``embed``      mean-pooled hidden states (the distributional audit's embedding)
``tiny_gguf``  the tiny random GGUFs
"""
