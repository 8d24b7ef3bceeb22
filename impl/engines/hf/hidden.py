"""Mean-pooled hidden states of a transformers model: the offline text
embedding of the distributional audit (impl/eval/distribution.py).

A model forward with ``output_hidden_states``; it lives beside
:mod:`~unsee.impl.engines.hf.adapter` rather than in it only because that
module is at the line limit, and it touches no cache (``use_cache=False``),
so no engine state changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def forward_mean_hidden(model, token_ids: Sequence[int]) -> list[float]:
    """The mean over positions of the last layer's hidden states (after the
    model's final norm) of ``token_ids`` read alone, with no context: one
    vector of the model's hidden size, in float32."""
    if not token_ids:
        raise ValueError("cannot embed an empty token sequence")
    device = model.get_input_embeddings().weight.device
    with torch.inference_mode():
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        return out.hidden_states[-1][0].float().mean(0).tolist()


__all__ = ["forward_mean_hidden"]
