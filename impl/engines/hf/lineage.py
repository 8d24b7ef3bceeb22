"""One transformers lineage: a KV cache, the tokens it holds, the logits a
decode continues from, and the prefill chunks that built it (what the prefix
cache matches on)."""

from __future__ import annotations

import weakref

import torch

from unsee.impl.engines.hf import adapter
from unsee.impl.engines.lineage import ChunkedLineage


class Lineage(ChunkedLineage):
    """One cache plus what we know about it (:class:`~unsee.impl.engines.hf.engine.KVEngine`'s)."""

    __slots__ = ("_storages", "cache")

    def __init__(self, cache, tokens: list[int], last_logits: torch.Tensor | None):
        super().__init__(tokens, last_logits)
        self.cache = cache
        self._storages: tuple | None = None  # (weakref, key, storages): see storages()

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens of the cache (a step inside a verb: the
        chunk history and logits are the verb's to settle)."""
        adapter.crop_cache(self.cache, n)
        del self.tokens[n:]

    def changed(self) -> None:
        """Note that the cache or the kept logits changed (see :meth:`storages`)."""
        self._storages = None

    def storages(self) -> dict:
        """Distinct storages held (KV and kept logits): ``{(device, address): bytes}``.

        Cached, keyed on the identity of the first layer's key tensor: every
        change to a cache (a prefill, a decode step, a crop) replaces every
        layer's tensors, so the same tensor object means the same storages."""
        first = next(iter(adapter.cache_tensors(self.cache)), (None, None))[0]
        key = (len(self.tokens), len(self.decode_logits), id(self.last_logits))
        if self._storages is not None:
            ref, old_key, out = self._storages
            if old_key == key and ref is not None and ref() is first:
                return out
        out = adapter.cache_storages(self.cache)
        for t in list(self.decode_logits.values()) + [self.last_logits]:
            if t is not None:
                adapter.add_storage(out, t)
        self._storages = (weakref.ref(first) if first is not None else None, key, out)
        return out
