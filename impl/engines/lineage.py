"""What every engine knows of its lineages, whatever holds their KV: a
lineage's chunk history (:class:`ChunkedLineage`), pins and the KV budget
(:class:`Budget`, its eviction rule :func:`get_evictions`), the prefix cache's
lookup (:func:`find_cached_chunk`), and ``rebuild`` and ``crop`` over any
engine's verbs. The verbs themselves are :class:`unsee.impl.engines.book.LineageBook`'s."""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Collection, Container, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any


def as_int(x) -> int | None:
    """x as an int if it is an integer (numpy ints too, not bools or floats)."""
    if isinstance(x, bool):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def check_prefix_length(verb: str, n_tokens, length: int) -> int:
    """``n_tokens`` as an int in ``[0, length]`` (a lineage's length), or a
    ValueError naming ``verb`` before anything changes."""
    n = as_int(n_tokens)
    if n is None or not 0 <= n <= length:
        raise ValueError(f"{verb}: n_tokens={n_tokens!r} is outside [0, {length}] (the lineage's length)")
    return n


def check_ids(token_ids: Iterable[int], vocab_size: int, allow_empty: bool = False) -> list[int]:
    """``token_ids`` as a list of ints in ``[0, vocab_size)``, or a ValueError naming them. Checked
    on the host: an out-of-range id on CUDA is a device assert that kills the process instead of an
    error we can report."""
    ids = [operator.index(t) for t in token_ids]  # ints only, no floats
    if not ids and not allow_empty:
        raise ValueError("prefill: token_ids is empty; a forward needs at least one token")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prefill: token ids {bad[:5]} outside [0, {vocab_size})")
    return ids


class ChunkedLineage:
    """What every engine knows of one lineage, whatever holds its KV: the
    tokens, the logits a decode continues from, the prefill chunks that built
    it (what the prefix cache matches on) and the LRU clock's last access. A
    backend's lineage adds where its KV lives (a cache, parked rows) and
    overrides :meth:`changed` when it caches what it measured of that KV."""

    __slots__ = ("chunk_ends", "chunked", "decode_logits", "last_logits", "last_used", "pending", "pending_chunks",
                 "served_last", "tokens")

    def __init__(self, tokens: list[int], last_logits):
        self.tokens = tokens  # the ids the KV holds, in order
        self.last_logits = last_logits  # logits after the last prefill, or None
        # The prefill chunks that built the KV, as cumulative end offsets.
        # `chunked` is False once a crop cut a chunk: the tail then is no
        # longer a chunk sequence, and later chunks are not recorded (so the
        # lineage is never wrongly served from or to).
        self.chunk_ends: list[int] = []
        self.chunked = True
        #: position -> the logits a decode started from there (what a served chunk needs)
        self.decode_logits: dict = {}
        self.served_last = False  # the last chunk was served without its logits
        self.last_used = 0  # the engine's clock at the last access (LRU eviction)
        # Tokens after ``tokens`` that the engine has taken but not yet computed, and the chunks
        # (start, end) they close: computed with the next chunk, or before any verb reads the KV,
        # in one forward where that changes no bit (LineageBook._flush)
        self.pending: list[int] = []
        self.pending_chunks: list[tuple[int, int]] = []

    def is_chunk_end(self, start: int) -> bool:
        """Whether ``start`` is where the recorded chunks end (an unbroken record)."""
        return self.chunked and start == (self.chunk_ends[-1] if self.chunk_ends else 0)

    def record_chunk(self, start: int, end: int | None = None) -> None:
        """Record the tokens from ``start`` to ``end`` (default: the last) as one prefill chunk.
        Only on an unbroken record: tokens that some other path appended unrecorded make
        the lineage unservable from there on, never wrongly served."""
        if self.is_chunk_end(start):
            self.chunk_ends.append(len(self.tokens) if end is None else end)
        else:
            self.chunked = False

    def defer(self, ids: list[int], start: int) -> None:
        """Take ``ids`` uncomputed, closing the chunk that opened at ``start`` (pending)."""
        self.pending_chunks.append((start, len(self.tokens) + len(self.pending) + len(ids)))
        self.pending.extend(ids)
        self.last_logits, self.served_last = None, False

    def inherit(self, src: ChunkedLineage, n: int) -> None:
        """Become a fork of ``src``'s first ``n`` tokens: its chunk history up to
        there, and its last logits only where the fork is the whole of ``src``."""
        whole = n == len(src.tokens)
        self.last_logits = src.last_logits if whole else None
        self.copy_history(src, n)
        self.served_last = src.served_last and whole

    def copy_history(self, src: ChunkedLineage, n: int) -> None:
        """Take ``src``'s chunk history and decode logits up to ``n`` tokens."""
        self.chunk_ends = [e for e in src.chunk_ends if e <= n]
        self.chunked = src.chunked and n == (self.chunk_ends[-1] if self.chunk_ends else 0)
        self.decode_logits = {p: t for p, t in src.decode_logits.items() if p <= n}

    def cut(self, n: int) -> None:
        """Forget the chunk history beyond ``n`` tokens (a crop to ``n``)."""
        self.copy_history(self, n)
        self.served_last = False
        self.changed()

    def changed(self) -> None:
        """Note that the KV or the kept logits changed (nothing cached here)."""


class EvictedLineageError(KeyError):
    """A lineage the KV budget evicted: its handle is known, its cache is gone."""


class LineagePin:
    """A claim that a live runtime is extending ``lineage``: the KV budget never
    evicts a pinned lineage. The claim lasts as long as this object lives
    (the engine holds it weakly), so a runtime that is dropped, or a replay
    that was abandoned halfway, releases its lineage by itself."""

    __slots__ = ("__weakref__", "lineage")

    def __init__(self, lineage: str):
        self.lineage = lineage

    def __repr__(self) -> str:
        return f"LineagePin({self.lineage!r})"


@dataclass(frozen=True)
class KVMemory:
    """What an engine holds, in bytes of distinct tensor storages (a prefix
    shared by several lineages counts once).

    held_bytes      every resident lineage's KV and kept logits
    live_bytes      those of the live lineages (pinned, or spared: the one the last prefill, generate or new_lineage named)
    unpinned_bytes  held_bytes - live_bytes: what the budget bounds
    """

    held_bytes: int
    live_bytes: int
    unpinned_bytes: int
    lineages: int
    live_lineages: int
    evicted_lineages: int
    cached_tokens: int
    budget: int | None

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def get_evictions(candidates: Sequence[tuple[str, dict]], live_keys: Container, budget: int) -> tuple[list[str], int]:
    """The KV budget's eviction rule over plain data: which lineages to evict,
    in order, and the unpinned bytes then left.

    ``candidates`` are the lineages the budget may evict (neither pinned nor
    spared), least recently used first, each with its storages
    ``{key: bytes}``; ``live_keys`` the storages the live lineages hold. The
    unpinned bytes are those of the distinct storages the candidates hold and
    no live lineage does (a prefix shared by several counts once). A storage
    is freed when the last candidate holding it is evicted, so candidates are
    evicted in order until the unpinned bytes fit ``budget``."""
    holders: dict = {}  # storage -> how many candidates hold it
    sizes: dict = {}
    for _, storages in candidates:
        for key, nbytes in storages.items():
            if key not in live_keys:
                holders[key] = holders.get(key, 0) + 1
                sizes[key] = nbytes
    unpinned = sum(sizes.values())
    evicted: list[str] = []
    for handle, storages in candidates:
        if unpinned <= budget:
            break
        for key in storages:
            if key in holders:
                holders[key] -= 1
                if holders[key] == 0:
                    unpinned -= sizes[key]
        evicted.append(handle)
    return evicted, unpinned


class Budget:
    """The KV budget, a component of an engine (``engine.budget``,
    :class:`unsee.impl.engines.protocol.KVBudget`): the bound, pins, the
    handles it evicted, and the eviction rule (:func:`get_evictions`) over
    the storages the engine's :class:`~unsee.impl.engines.book.LineageBook` reports.

    Besides the pins it spares, for each thread, the lineage its last prefill,
    generate or new_lineage named (:meth:`spare`): its caller is still working
    on it, and no verb's enforcement (its own, or another thread's while the
    engine's loop runs its forward) must take it away."""

    def __init__(self, book, limit: int | None = None):
        self._book = book
        self._pins: weakref.WeakSet[LineagePin] = weakref.WeakSet()
        self._evicted: set[str] = set()
        self._spared: dict[int, str] = {}  # thread -> the lineage it works on (no cursor shared by threads)
        self.limit: int | None = None
        self.peak_unpinned_bytes = 0  # the most unpinned bytes held when a verb returned
        self.evictions = 0
        self.set(limit)

    @property
    def lineages(self) -> tuple[str, ...]:
        """The resident lineages' handles."""
        return tuple(self._book.resident)

    @property
    def evicted(self) -> tuple[str, ...]:
        """Handles the budget evicted (their caches are gone)."""
        return tuple(sorted(self._evicted))

    def is_evicted(self, lineage: str) -> bool:
        return lineage in self._evicted

    def forget_evicted(self, lineage: str) -> bool:
        """Forget an evicted handle; whether it was one."""
        was = lineage in self._evicted
        self._evicted.discard(lineage)
        return was

    def pin(self, lineage: str) -> LineagePin:
        """Mark ``lineage`` live for as long as the returned pin is referenced
        (see :class:`LineagePin`); the budget never evicts it."""
        self._book.touch(lineage)
        pin = LineagePin(lineage)
        self._pins.add(pin)
        return pin

    def spare(self, lineage: str) -> None:
        """Keep ``lineage`` (the one the calling thread's verb works on) until this thread
        spares another or it is released."""
        self._spared[threading.get_ident()] = lineage

    def released(self, lineage: str) -> None:
        """Note that ``lineage`` is gone (dropped or evicted)."""
        for thread in [t for t, h in self._spared.items() if h == lineage]:
            del self._spared[thread]

    def live_lineages(self) -> set[str]:
        """The pinned lineages and every thread's spared one: never evicted."""
        live = {p.lineage for p in list(self._pins)} | set(self._spared.values())
        return live & set(self._book.resident)

    def set(self, limit: int | None) -> None:
        """Bound the bytes held by lineages that are neither pinned nor worked
        on (None: no bound; 0: keep only those), and enforce it now."""
        if limit is not None:
            b = as_int(limit)
            if b is None or b < 0:
                raise ValueError(f"kv_budget={limit!r} must be a number of bytes >= 0, or None for no bound")
            limit = b
        self.limit = limit
        self.enforce()

    def enforce(self) -> None:
        """Evict least-recently-used unpinned lineages until the storages that
        only they hold fit the budget (:func:`get_evictions`). Verbs call it
        when they return, never in the middle of one, so no lineage a verb is
        working on disappears. A pin that dies with its runtime does not call
        it (that can happen at any allocation, through the garbage
        collector); call it after dropping runtimes to release their
        lineages at once."""
        if self.limit is None:
            return
        book = self._book
        live = self.live_lineages()
        live_keys: set = set()
        for handle in live:
            live_keys.update(book.get_budget_storages(handle))
        others = sorted((h for h in book.resident if h not in live), key=lambda h: book.resident[h].last_used)
        evicted, unpinned = get_evictions([(h, book.get_budget_storages(h)) for h in others], live_keys, self.limit)
        for handle in evicted:
            book.release(handle)
            self._evicted.add(handle)
            self.evictions += 1
        self.peak_unpinned_bytes = max(self.peak_unpinned_bytes, unpinned)

    def get_releases(self, owners: Iterable[tuple[Any, Collection[str]]]) -> list:
        """The owners that must let go of their lineages, in order, so that the engine holds at most
        the limit (the one rule of :func:`get_evictions`, by the one LRU clock): ``owners`` are
        holders of pinned lineages the budget cannot release itself (a server's resident
        conversations, each with its runtime's lineages), each ``(key, handles)``; an owner is as
        recently used as its most recently used lineage. The keys of those to release, least
        recently used first; none without a limit. Call it after :meth:`enforce` (the unpinned
        lineages go first); it releases nothing itself: the owner does (its runtime's pins)."""
        if self.limit is None:
            return []
        book = self._book
        owned = {key: [h for h in handles if h in book.resident] for key, handles in owners}
        owned = {key: handles for key, handles in owned.items() if handles}
        taken = {h for handles in owned.values() for h in handles}
        kept: dict = {}
        for handle in book.resident:
            if handle not in taken:
                kept.update(book.get_storages(handle))
        candidates = []
        for key, handles in sorted(owned.items(), key=lambda kv: max(book.resident[h].last_used for h in kv[1])):
            storages: dict = {}
            for handle in handles:
                storages.update(book.get_storages(handle))
            candidates.append((key, storages))
        released, _ = get_evictions(candidates, kept, self.limit - sum(kept.values()))
        return released

    def memory(self) -> KVMemory:
        """What the engine holds now (bytes of distinct storages)."""
        book = self._book
        live = self.live_lineages()
        held: dict = {}
        live_st: dict = {}
        for handle in book.resident:
            st = book.get_storages(handle)
            held.update(st)
            if handle in live:
                live_st.update(st)
        return KVMemory(held_bytes=sum(held.values()), live_bytes=sum(live_st.values()),
                        unpinned_bytes=sum(held.values()) - sum(live_st.values()), lineages=len(book.resident),
                        live_lineages=len(live), evicted_lineages=len(self._evicted),
                        cached_tokens=sum(len(lin.tokens) for lin in book.resident.values()), budget=self.limit)


def rebuild(engine, chunks: Iterable[Sequence[int]]) -> str:
    """A new lineage of ``engine`` holding ``chunks``, one prefill each:
    re-creating a cache that was evicted or never in memory (a reopened
    session). Counted as prefilled and as ``rebuilt_tokens``."""
    handle = engine.new_lineage()
    for chunk in chunks:
        chunk = list(chunk)
        before = engine.counters.reused_tokens
        engine.prefill(handle, chunk)  # served, or computed now or with a later chunk: rebuilt
        engine.counters.rebuilt_tokens += len(chunk) - (engine.counters.reused_tokens - before)
    return handle


def crop(engine, lineage: str, n_tokens: int) -> str:
    """Crop as a fork: a lineage holding the first ``n_tokens`` of
    ``lineage``, which is dropped; returns the new handle."""
    handle = engine.fork(lineage, n_tokens)
    engine.drop(lineage)
    return handle


def find_cached_chunk(lineages, is_cached, lin, ids: Sequence[int]):
    """The prefix cache's lookup (B5'): ``(handle, source, logits)`` of a
    cached lineage other than ``lin`` whose chunks begin with ``lin``'s and
    whose next chunk is ``ids``, or None. ``lineages`` maps handles to
    lineages with ``tokens``, ``chunk_ends``, ``decode_logits`` and
    ``last_logits``; ``is_cached(handle)`` says whether one may serve.

    Logits are only kept where a decode started (or after a lineage's last
    prefill), so a source that kept the logits after the chunk is preferred;
    without them the next verb is usually a prefill, which needs none, and a
    generate recomputes this one chunk (``logits`` None)."""
    start = len(lin.tokens)
    end, k = start + len(ids), len(lin.chunk_ends)
    found = None
    for handle, src in lineages.items():
        if (src is lin or not is_cached(handle) or len(src.chunk_ends) <= k or src.chunk_ends[k] != end
                or src.chunk_ends[:k] != lin.chunk_ends or src.tokens[start:end] != ids
                or src.tokens[:start] != lin.tokens):
            continue
        logits = src.decode_logits.get(end)
        if logits is None and len(src.tokens) == end:
            logits = src.last_logits
        if found is None or logits is not None:
            found = (handle, src, logits)
        if logits is not None:
            break
    return found


def take_served_chunk(lin, src, ids: Sequence[int], logits) -> None:
    """Record on ``lin`` the chunk ``ids`` that :func:`find_cached_chunk` found on
    ``src`` (the caller has already given ``lin`` the source's cache rows): the
    tokens, the chunk's end, the decode logits ``src`` kept inside the chunk, and
    the logits after it (None: ``served_last``, a decode recomputes the chunk)."""
    start = len(lin.tokens)
    end = start + len(ids)
    lin.tokens.extend(ids)
    lin.chunk_ends.append(end)
    lin.decode_logits.update({q: t for q, t in src.decode_logits.items() if start < q <= end})
    lin.last_logits = logits
    lin.served_last = logits is None


def is_cache_source(sources: set[str] | None, handle: str) -> bool:
    """Whether an active prefix cache may serve from ``handle``: ``sources`` is
    None (every lineage may) or the handles it holds (those named when it
    opened, and those its thread made inside it since)."""
    return sources is None or handle in sources

