"""One llama.cpp lineage: its tokens, its parked KV rows, the logits a decode
continues from, and the prefill chunks that built it (what the prefix cache
matches on); and the view a decoding turn (impl/engines/turn.py) has of it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from unsee.impl.engines.lineage import ChunkedLineage
from unsee.impl.engines.llamacpp.state import KVState


class LlamaLineage(ChunkedLineage):
    """What :class:`~unsee.impl.engines.llamacpp.engine.LlamaCppEngine` knows of one lineage
    (logits as float32 numpy arrays of the vocabulary's size)."""

    __slots__ = ("kv",)

    def __init__(self, tokens: list[int], kv: KVState | None, last_logits: np.ndarray | None):
        super().__init__(tokens, last_logits)
        self.kv = kv  # the parked rows; None while resident and changed since parked

    def storages(self) -> dict:
        """Distinct host buffers held: ``{key: bytes}`` (parked rows and kept logits)."""
        out = self.kv.storages() if self.kv is not None else {}
        for t in list(self.decode_logits.values()) + [self.last_logits]:
            if t is not None:
                out[id(t)] = t.nbytes
        return out


class TurnView:
    """A resident lineage as a decoding turn sees it (:class:`unsee.impl.engines.turn.TurnLineage`):
    ``feed(lin, ids, all_logits)`` runs one forward at the lineage's end and
    appends ``ids``; ``truncate(lin, n)`` crops it. Logits as torch tensors."""

    def __init__(self, lin: LlamaLineage, feed: Callable[[LlamaLineage, list[int], bool], np.ndarray],
                 truncate: Callable[[LlamaLineage, int], None]):
        self._lin, self._feed, self._truncate = lin, feed, truncate

    @property
    def tokens(self) -> list[int]:
        return self._lin.tokens

    @property
    def last_logits(self) -> torch.Tensor | None:
        logits = self._lin.last_logits
        return None if logits is None else torch.from_numpy(logits)

    @last_logits.setter
    def last_logits(self, value: torch.Tensor | None) -> None:
        self._lin.last_logits = None if value is None else value.numpy()

    def truncate(self, n: int) -> None:
        self._truncate(self._lin, n)

    def forward_last(self, ids: list[int]) -> torch.Tensor:
        return torch.from_numpy(self._feed(self._lin, ids, False))

    def forward_all(self, ids: list[int]) -> torch.Tensor:
        return torch.from_numpy(self._feed(self._lin, ids, True))


__all__ = ["LlamaLineage", "TurnView"]
