"""One transformers lineage: a KV cache, the tokens it holds, the logits a
decode continues from, and the prefill chunks that built it (what the prefix
cache matches on)."""

from __future__ import annotations

import weakref

import torch

from unsee.impl.engines.hf import adapter


class Lineage:
    """One cache plus what we know about it (:class:`~unsee.impl.engines.hf.engine.KVEngine`'s)."""

    __slots__ = (
        "_storages",
        "cache",
        "chunk_ends",
        "chunked",
        "decode_logits",
        "last_logits",
        "last_used",
        "served_last",
        "tokens",
    )

    def __init__(self, cache, tokens: list[int], last_logits: torch.Tensor | None):
        self.cache = cache
        self.tokens = tokens  # the ids the cache holds, in order
        self.last_logits = last_logits  # logits after the last prefill, or None
        # The prefill chunks that built the cache, as cumulative end offsets.
        # `chunked` is False once a crop cut a chunk: the tail then is no
        # longer a chunk sequence, and later chunks are not recorded.
        self.chunk_ends: list[int] = []
        self.chunked = True
        # position -> the logits a decode started from there (what a served
        # chunk needs to be decoded from; see KVEngine.prefix_cache)
        self.decode_logits: dict[int, torch.Tensor] = {}
        self.served_last = False  # the last chunk was served without its logits
        self.last_used = 0  # the engine's clock at the last access (LRU eviction)
        self._storages: tuple | None = None  # (weakref, key, storages): see storages()

    def is_chunk_end(self, start: int) -> bool:
        """Whether ``start`` is where the recorded chunks end (an unbroken record)."""
        return self.chunked and start == (self.chunk_ends[-1] if self.chunk_ends else 0)

    def record_chunk(self, start: int) -> None:
        """Record the tokens from ``start`` on as one prefill chunk. Only on an
        unbroken record: tokens that some other path appended unrecorded make
        the lineage unservable from there on, never wrongly served."""
        if self.is_chunk_end(start):
            self.chunk_ends.append(len(self.tokens))
        else:
            self.chunked = False

    def copy_history(self, src: Lineage, n: int) -> None:
        """Take ``src``'s chunk history and decode logits up to ``n`` tokens."""
        self.chunk_ends = [e for e in src.chunk_ends if e <= n]
        self.chunked = src.chunked and n == (self.chunk_ends[-1] if self.chunk_ends else 0)
        self.decode_logits = {p: t for p, t in src.decode_logits.items() if p <= n}

    def cut(self, n: int) -> None:
        """Forget the chunk history beyond ``n`` tokens (a crop to ``n``)."""
        ends = [e for e in self.chunk_ends if e <= n]
        if n != (ends[-1] if ends else 0):
            self.chunked = False
        self.chunk_ends = ends
        self.decode_logits = {p: t for p, t in self.decode_logits.items() if p <= n}
        self.served_last = False
        self._storages = None

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
