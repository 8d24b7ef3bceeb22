"""One turn of :meth:`KVEngine.generate <unsee.impl.engines.hf.engine.KVEngine.generate>`:
the transformers lineage as the engine-independent turn procedure sees it.

The procedure itself (check the draft's first token, verify, probe, decode
with context guesses, the guard, the fall-back to the reference) is
:mod:`unsee.impl.engines.turn`, which the llama.cpp engine decodes through
too; here it reaches the model through :class:`HFTurnLineage`'s two
forwards on the lineage's cache.
"""

from __future__ import annotations

from typing import Any

import torch

from unsee.impl.engines.hf import adapter
from unsee.impl.engines.hf.lineage import Lineage


class HFTurnLineage:
    """A transformers lineage as :class:`unsee.impl.engines.turn.TurnLineage`:
    its tokens, last logits and crop are the lineage's own; a forward feeds
    ids through the adapter on its cache and appends them to its tokens."""

    __slots__ = ("lin", "model")

    def __init__(self, model: Any, lin: Lineage):
        self.model, self.lin = model, lin

    @property
    def tokens(self) -> list[int]:
        return self.lin.tokens

    @property
    def last_logits(self) -> torch.Tensor | None:
        return self.lin.last_logits

    @last_logits.setter
    def last_logits(self, logits: torch.Tensor | None) -> None:
        self.lin.last_logits = logits

    def truncate(self, n: int) -> None:
        self.lin.truncate(n)

    def forward_last(self, ids: list[int]) -> torch.Tensor:
        logits = adapter.forward_last_logits(self.model, ids, self.lin.cache)
        self.lin.tokens.extend(ids)
        return logits

    def forward_all(self, ids: list[int]) -> torch.Tensor:
        logits = adapter.forward_all_logits(self.model, ids, self.lin.cache)
        self.lin.tokens.extend(ids)
        return logits


__all__ = ["HFTurnLineage"]
