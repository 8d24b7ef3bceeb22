"""One llama.cpp lineage: its tokens, its parked KV rows, the logits a decode
continues from, and the prefill chunks that built it (what the prefix cache
matches on); and the view a decoding turn (impl/engines/turn.py) has of it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from unsee.impl.engines.llamacpp.state import KVState


class LlamaLineage:
    """What :class:`~unsee.impl.engines.llamacpp.engine.LlamaCppEngine` knows of one lineage."""

    __slots__ = (
        "chunk_ends",
        "chunked",
        "decode_logits",
        "kv",
        "last_logits",
        "last_used",
        "served_last",
        "tokens",
    )

    def __init__(self, tokens: list[int], kv: KVState | None, last_logits: np.ndarray | None):
        self.tokens = tokens
        self.kv = kv  # the parked rows; None while resident and changed since parked
        self.last_logits = last_logits  # float32 (vocab,), or None
        self.last_used = 0
        # The prefill chunks that built the KV, as cumulative end offsets;
        # `chunked` is False once a crop cut a chunk (later chunks are then
        # not recorded, so the lineage is never wrongly served from or to).
        self.chunk_ends: list[int] = []
        self.chunked = True
        #: position -> the logits a decode started from there (what a served chunk needs)
        self.decode_logits: dict[int, np.ndarray] = {}
        self.served_last = False  # the last chunk was served without its logits

    def is_chunk_end(self, start: int) -> bool:
        """Whether ``start`` is where the recorded chunks end (an unbroken record)."""
        return self.chunked and start == (self.chunk_ends[-1] if self.chunk_ends else 0)

    def record_chunk(self, start: int) -> None:
        """Record the tokens from ``start`` on as one prefill chunk (on an unbroken record only)."""
        if self.is_chunk_end(start):
            self.chunk_ends.append(len(self.tokens))
        else:
            self.chunked = False

    def copy_history(self, src: LlamaLineage, n: int) -> None:
        """Take ``src``'s chunk history and decode logits up to ``n`` tokens."""
        self.chunk_ends = [e for e in src.chunk_ends if e <= n]
        self.chunked = src.chunked and n == (self.chunk_ends[-1] if self.chunk_ends else 0)
        self.decode_logits = {p: t for p, t in src.decode_logits.items() if p <= n}

    def cut(self, n: int) -> None:
        """Forget the chunk history beyond ``n`` tokens (a crop to ``n``)."""
        self.copy_history(self, n)
        self.served_last = False

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
