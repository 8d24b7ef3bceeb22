"""Mean-pooled last-layer hidden states of a llama.cpp model: the offline
text embedding of the distributional audit on the llama.cpp engine (the
transformers twin is impl/engines/hf/hidden.py).

A context of its own, made with llama.cpp's mean pooling and freed after the
call, so no lineage of the engine changes.
"""

from __future__ import annotations

from collections.abc import Sequence


def forward_mean_hidden(lm, token_ids: Sequence[int]) -> list[float]:
    """The mean over positions of the last layer's hidden states (after the
    final norm) of ``token_ids`` read alone: one vector of ``lm.n_embd``
    floats. ``lm``: a :class:`~unsee.impl.engines.llamacpp.engine.LlamaCppModel`."""
    import llama_cpp as lc

    ids = list(token_ids)
    if not ids:
        raise ValueError("cannot embed an empty token sequence")
    if len(ids) > lm.n_ctx:
        raise ValueError(f"cannot embed {len(ids)} tokens in a context of {lm.n_ctx}")
    ctx = lm.new_context(embeddings=True)
    batch = lc.llama_batch_init(len(ids), 0, 1)
    try:
        for i, tok in enumerate(ids):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, 1
        batch.n_tokens = len(ids)
        rc = lc.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} embedding {len(ids)} tokens")
        ptr = lc.llama_get_embeddings_seq(ctx, 0)
        if not ptr:
            raise RuntimeError("llama.cpp returned no pooled embedding")
        return [float(ptr[i]) for i in range(lm.n_embd)]
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)


__all__ = ["forward_mean_hidden"]
