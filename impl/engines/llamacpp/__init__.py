"""The llama.cpp backend (reaches no transformers):

``engine``     LlamaCppEngine, the Engine verbs over one llama.cpp context
``lineage``    one lineage (tokens, parked rows, chunk history) and a decoding turn's view of it
``model``      load_llamacpp, LlamaCppModel: the GGUF, its context options, its measured facts
``facts``      whether decode equals prefill bit for bit, measured at load and cached
``cost``       what one more token in a forward costs in decode steps (the draft policy's
               ``per_token``), measured at load and cached beside the facts
``state``      sequence state blobs as K and V rows by position
``embed``      mean-pooled hidden states (the distributional audit's embedding)
``tiny_gguf``  the tiny random GGUFs
"""
