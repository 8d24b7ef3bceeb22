"""The transformers KV backend of :class:`~unsee.impl.engines.hf.engine.KVEngine`:
one lineage is a KV cache, the tokens it holds, the logits a decode
continues from, and the prefill chunks that built it (:class:`Lineage`);
:class:`HFKV` is what the lineage book (:mod:`unsee.impl.engines.book`)
asks of those caches. Every transformers call goes through
:mod:`unsee.impl.engines.hf.adapter`."""

from __future__ import annotations

import hashlib
import time
import weakref
from typing import Any

import torch

from unsee.impl.engines.book import ForwardHookList, report_forward
from unsee.impl.engines.hf import adapter
from unsee.impl.engines.lineage import ChunkedLineage


class Lineage(ChunkedLineage):
    """One cache plus what we know about it."""

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


class HFKV:
    """A transformers model's caches as the book's :class:`~unsee.impl.engines.book.KVBackend`.

    A fork holds views of the source's tensors, not copies: either side's
    later prefills, crops or drop leave the other unchanged (copy-on-write;
    :func:`adapter.share_cache_prefix`), so a restore costs the same at any
    context length. Logits are torch tensors already."""

    def __init__(self, model: Any):
        self.model = model
        self.hooks: ForwardHookList = []

    def new(self) -> Lineage:
        return Lineage(adapter.new_cache(self.model), [], None)

    def fork(self, handle: str, src: Lineage, n: int) -> Lineage:
        lin = Lineage(adapter.share_cache_prefix(self.model, src.cache, n), src.tokens[:n], None)
        lin.inherit(src, n)
        return lin

    def storages(self, handle: str, lin: Lineage, full: bool) -> dict:
        """KV and kept logits (:meth:`Lineage.storages`), as memory and the budget both count them."""
        return lin.storages()

    def free(self, handle: str) -> None:
        """Nothing outside the lineage object to release."""

    def forward(self, handle: str, lin: Lineage, ids: list[int], all_logits: bool,
                commit: bool = False) -> torch.Tensor:
        started = time.perf_counter()
        logits = adapter.forward_logits(self.model, ids, lin.cache, 0 if all_logits else 1)
        if not all_logits:
            logits = logits[-1]
        lin.tokens.extend(ids)
        report_forward(self.hooks, len(ids), started, commit)
        return logits

    def truncate(self, handle: str, lin: Lineage, n: int) -> None:
        lin.truncate(n)

    def take_rows(self, handle: str, lin: Lineage, src_handle: str, src: Lineage, n: int) -> None:
        lin.cache = adapter.share_cache_prefix(self.model, src.cache, n)

    def check_room(self, lin: Lineage, ids: list[int]) -> None:
        """Nothing to refuse: a cache grows as it needs."""

    def digest(self, handle: str, lin: Lineage) -> str:
        """sha256 over every layer's key and value tensors (dtype, shape,
        bytes), taken from contiguous CPU copies. Equal digests mean bitwise
        equal KV. Any empty cache has the same digest, however it got empty."""
        h = hashlib.sha256(b"unsee-kv-v1")
        h.update(f"len={adapter.cache_length(lin.cache)};".encode())
        for i, (k, v) in enumerate(adapter.cache_tensors(lin.cache)):
            for tag, t in (("k", k), ("v", v)):
                if t is None or t.numel() == 0:
                    continue  # an unused layer (fresh cache) or emptied by crop(0)
                t = t.detach().to("cpu").contiguous()
                h.update(f"{i}{tag}:{t.dtype}:{tuple(t.shape)};".encode())
                # view as bytes: works for bfloat16, which numpy cannot hold
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def to_torch(self, logits: torch.Tensor | None) -> torch.Tensor | None:
        return logits

    def from_torch(self, logits: torch.Tensor | None) -> torch.Tensor | None:
        return logits


__all__ = ["HFKV", "Lineage"]
