"""Text embeddings from the model under test, offline: the mean-pooled
last-layer hidden states of the engine's own model over a text read alone.

This is what the distributional audit's embedding distance uses
(impl/eval/distribution.py): no embedding model is downloaded; the vectors
are the model's own representation of what it wrote. Each backend computes
them its own way (:func:`embed_texts` dispatches), without touching any
lineage of the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from unsee.impl.engines.protocol import Engine


def get_embedding_backend(engine: Engine) -> str:
    """``"transformers"`` or ``"llamacpp"``: which embedder fits ``engine``."""
    if getattr(engine.lm, "model", None) is not None:
        return "transformers"
    if hasattr(engine.lm, "n_embd") and hasattr(engine.lm, "new_context"):
        return "llamacpp"
    raise ValueError(f"no offline embedder for an engine of type {type(engine).__name__}")


def embed_texts(engine: Engine, texts: Sequence[str]) -> list[list[float] | None]:
    """One vector per text (None for a text with no tokens): the mean over
    its tokens of the model's last hidden layer, the text read alone."""
    if get_embedding_backend(engine) == "transformers":
        from unsee.impl.engines.hf.hidden import forward_mean_hidden

        model = engine.lm.model
    else:
        from unsee.impl.engines.llamacpp.embed import forward_mean_hidden

        model = engine.lm
    out: list[list[float] | None] = []
    for text in texts:
        ids = engine.lm.encode(text)
        out.append(forward_mean_hidden(model, ids) if ids else None)
    return out


__all__ = ["embed_texts", "get_embedding_backend"]
