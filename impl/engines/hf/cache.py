"""The transformers engine's KV cache: building, measuring, cropping, cloning,
sharing and excising a `DynamicCache`.

Besides adapter.py, this is the one other module that talks to
`transformers` (its cache classes only): a cache layer's storage and
methods moved between releases (4.54+ per-layer objects, 5.x's meaning of
`crop(n)`), so those facts are kept here, and everything above sees only
these functions.

Sliding-window layers are kept whole by :class:`FullWindowLayer`, which
shows the attention exactly what transformers' own windowed layer would, so
every verb works on every layer kind (docs/engines.md, "Model families").

Functions:
    new_cache(model)               -> empty DynamicCache (FullWindowLayer for sliding layers)
    cache_length(cache), crop_cache(cache, keep), excise_cache_span(cache, a, b),
    cache_tensors(cache), clone_cache(cache), share_cache_prefix(model, cache, keep),
    cache_storages(cache), add_storage(out, tensor)
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch
from transformers import DynamicCache
from transformers import __version__ as TRANSFORMERS_VERSION

try:  # transformers 4.54+: per-layer cache objects
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
except ImportError:  # older: no sliding-window support here (new_cache refuses such models)
    DynamicLayer = DynamicSlidingWindowLayer = None


if DynamicLayer is not None:

    class FullWindowLayer(DynamicLayer):
        """A sliding-window layer that keeps every token's keys and values
        and shows the attention exactly what the model's own
        `DynamicSlidingWindowLayer` would.

        The model's own layer keeps only the last ``window - 1`` tokens, so
        it cannot be cropped back past the window's edge, nor cloned, shared
        or excised like a full layer. This one stores the full sequence (it
        is a `DynamicLayer`: `crop` re-slices, `update` appends with
        ``torch.cat``, so `share_cache_prefix` stays safe), and from it
        returns, on every `update`, the same tensor the model's own layer
        returns: the last ``min(past, window - 1)`` cached tokens followed by
        the new ones, as one fresh contiguous tensor, with the same
        ``(kv_length, kv_offset)`` for the mask (`get_mask_sizes`). So every
        forward sees the same operands with the same shapes and the same
        mask as with the model's own cache, and gives the same bits, at any
        length and after any crop (tests/test_window.py checks it against
        the model's own cache and its cache-less forward). The price is
        memory: the full sequence instead of the window (docs/engines.md,
        "Model families").
        """

        is_sliding = True

        def __init__(self, sliding_window: int, **kwargs):
            super().__init__()
            self.sliding_window = int(sliding_window)

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            past = self.get_seq_length()
            start = past - min(past, self.sliding_window - 1)
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
            if start == 0:
                return self.keys, self.values
            # the model's own layer returns cat(its last window - 1 tokens, new): a fresh contiguous tensor
            return self.keys[..., start:, :].contiguous(), self.values[..., start:, :].contiguous()

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            """``(kv_length, kv_offset)`` as `DynamicSlidingWindowLayer` gives them
            after ``get_seq_length()`` tokens."""
            past = self.get_seq_length()
            return min(past, self.sliding_window - 1) + query_length, max(past - self.sliding_window + 1, 0)

else:
    FullWindowLayer = None


def new_cache(model) -> DynamicCache:
    """An empty DynamicCache for `model`, every layer of which can be cropped,
    cloned, shared and excised exactly.

    With the config, 5.x pre-builds one layer object per model layer of the
    right kind. A full-attention layer (`DynamicLayer`) is kept; a
    sliding-window one (`DynamicSlidingWindowLayer`, which drops tokens past
    the window) is replaced by a :class:`FullWindowLayer` of the same window.
    Any other kind (linear attention, compressed or indexed layers, ...) is
    refused with a ValueError naming it, as is a sliding-window model on a
    transformers without per-layer caches.
    """
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # older 4.x: no config argument
        cache = DynamicCache()
    layers = getattr(cache, "layers", None)
    if layers is None or FullWindowLayer is None:
        if getattr(model.config, "sliding_window", None) is not None:
            raise ValueError(f"model {type(model).__name__} uses sliding-window attention, which needs "
                             f"transformers 4.56+ here (this is {TRANSFORMERS_VERSION})")
        return cache
    for i, layer in enumerate(layers):
        if type(layer) is DynamicSlidingWindowLayer:
            layers[i] = FullWindowLayer(layer.sliding_window)
        elif type(layer) is not DynamicLayer:
            raise ValueError(f"model {type(model).__name__}: layer {i} has a {type(layer).__name__} cache, "
                             "which cannot be cropped exactly; only full and sliding-window attention can")
    return cache


def cache_length(cache) -> int:
    """Number of tokens held by the cache."""
    return int(cache.get_seq_length())


def crop_cache(cache, keep: int) -> None:
    """Keep the first `keep` tokens of the cache, in place.

    `crop(n)` with n > 0 meant "keep n" in 4.x and is an error in 5.x; a
    negative n means "remove |n|" in both. So always pass the negative count.
    """
    cur = cache_length(cache)
    if not 0 <= keep <= cur:
        raise ValueError(f"crop_cache: keep={keep} outside [0, {cur}]")
    if keep == cur:
        return
    with torch.inference_mode():
        cache.crop(keep - cur)
    got = cache_length(cache)
    if got != keep:  # guard against a future change of meaning
        raise RuntimeError(f"transformers {TRANSFORMERS_VERSION}: crop left {got} tokens, wanted {keep}")


def excise_cache_span(cache, start: int, end: int) -> None:
    """Remove positions ``[start, end)`` from every layer of the cache, in
    place, keeping the suffix's keys and values as they are (span-only
    excision, the paper's Table 4 ablation). The suffix keys keep the rotary
    positions they were computed at, and the next token is placed at the new,
    shorter length: the misplacement the ablation measures.

    Each layer gets new tensors (``torch.cat``), never a write into the old
    ones, so a cache sharing a prefix with this one (``share_cache_prefix``)
    is left alone.
    """
    cur = cache_length(cache)
    if not 0 <= start <= end <= cur:
        raise ValueError(f"excise_cache_span: [{start}, {end}) is not inside [0, {cur}]")
    if start == end:
        return
    if not hasattr(cache, "layers"):
        raise NotImplementedError(f"transformers {TRANSFORMERS_VERSION}: excision needs a per-layer cache")
    with torch.inference_mode():
        for layer in cache.layers:
            if not getattr(layer, "is_initialized", False) or layer.keys is None:
                continue
            layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys[..., end:, :]], dim=-2)
            layer.values = torch.cat([layer.values[..., :start, :], layer.values[..., end:, :]], dim=-2)
    got = cache_length(cache)
    if got != cur - (end - start):
        raise RuntimeError(f"transformers {TRANSFORMERS_VERSION}: excision left {got} tokens, "
                           f"wanted {cur - (end - start)}")


def cache_tensors(cache) -> Iterator[tuple[torch.Tensor | None, torch.Tensor | None]]:
    """Yield (keys, values) per layer, each [batch, kv_heads, seq, head_dim].

    5.x (and 4.56+): `cache.layers[i].keys/.values` (None before first use).
    Older 4.x: parallel lists `cache.key_cache` / `cache.value_cache`.
    """
    if hasattr(cache, "layers"):
        for layer in cache.layers:
            yield getattr(layer, "keys", None), getattr(layer, "values", None)
    else:
        yield from zip(cache.key_cache, cache.value_cache)


def clone_cache(cache):
    """An independent deep copy (new tensor storage) of the cache."""
    with torch.inference_mode():
        return copy.deepcopy(cache)


def share_cache_prefix(model, cache, keep: int):
    """A new cache holding the first `keep` tokens of `cache` *without copying
    them*: each layer of the new cache holds slices (views) of the source's
    key and value tensors.

    Why sharing is safe on the supported versions (checked in the transformers
    5.23 source, cache_utils.py): `DynamicLayer.update` appends with
    `self.keys = torch.cat([self.keys, key_states], dim=-2)`, which allocates
    new storage and never writes into the old tensors; `DynamicLayer.crop`
    re-slices (`self.keys = self.keys[..., :-n, :]`), which writes nothing;
    the attention reads the tensors `update` returns and writes nothing back.
    So extending, cropping or dropping either cache leaves the other's bytes
    alone. The in-place writers of a layer (`reset` on an initialised
    non-dynamic layer, `StaticLayer.update`'s `index_copy_`) belong to cache
    kinds `new_cache` never builds; its sliding-window layers are
    `FullWindowLayer`s, `DynamicLayer`s in all of this.
    Where the cache has no per-layer objects (transformers older than 4.54)
    this falls back to a deep copy and crop, which is correct, only slower.
    """
    cur = cache_length(cache)
    if not 0 <= keep <= cur:
        raise ValueError(f"share_cache_prefix: keep={keep} outside [0, {cur}]")
    if not hasattr(cache, "layers"):
        out = clone_cache(cache)
        crop_cache(out, keep)
        return out
    out = new_cache(model)
    if len(out.layers) != len(cache.layers):  # a cache built without config grows its layers lazily
        out = copy.copy(cache)
        out.layers = [copy.copy(layer) for layer in cache.layers]
    for dst, src in zip(out.layers, cache.layers):
        if type(dst) is not type(src):
            raise TypeError(f"share_cache_prefix: layer kinds differ ({type(dst).__name__} vs {type(src).__name__})")
        if not getattr(src, "is_initialized", False) or src.keys is None:
            continue  # an unused layer stays empty
        # every attribute (dtype, device, is_initialized, ...) as the source has it, then the slices
        dst.__dict__.update(src.__dict__)
        dst.keys = src.keys[..., :keep, :]
        dst.values = src.values[..., :keep, :]
    if cache_length(out) != keep:
        raise RuntimeError(f"transformers {TRANSFORMERS_VERSION}: shared prefix holds {cache_length(out)} tokens, "
                           f"wanted {keep}")
    return out


def cache_storages(cache) -> dict[tuple[str, int], int]:
    """The distinct tensor storages a cache holds: ``{(device, address): bytes}``.

    A view keeps its whole storage alive, so this counts storages, not the
    bytes of the (possibly sliced) tensors: two caches sharing a prefix
    report the same storage once it is merged with the other's."""
    out: dict[tuple[str, int], int] = {}
    for k, v in cache_tensors(cache):
        for t in (k, v):
            if t is not None:
                add_storage(out, t)
    return out


def add_storage(out: dict[tuple[str, int], int], t: torch.Tensor) -> None:
    """Record ``t``'s storage in ``out`` (see :func:`cache_storages`)."""
    storage = t.untyped_storage()
    if storage.nbytes():
        out[(str(t.device), storage.data_ptr())] = storage.nbytes()
