"""The llama.cpp backend: ``engine`` (LlamaCppEngine, load_llamacpp), ``state``
(sequence state blobs as K and V rows) and ``tiny_gguf`` (the tiny random
GGUF). Reaches no transformers."""
