"""The lineage book every engine shares: handles, pins, the KV budget's bookkeeping, work counters."""

from __future__ import annotations

import contextlib
import operator
import weakref
from collections.abc import Container, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields, replace

from unsee.impl.engines.protocol import Assist


def as_int(x) -> int | None:
    """x as an int if it is an integer (numpy ints too, not bools or floats)."""
    if isinstance(x, bool):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


class ChunkedLineage:
    """What every engine knows of one lineage, whatever holds its KV: the
    tokens, the logits a decode continues from, the prefill chunks that built
    it (what the prefix cache matches on) and the LRU clock's last access. A
    backend's lineage adds where its KV lives (a cache, parked rows) and
    overrides :meth:`changed` when it caches what it measured of that KV."""

    __slots__ = ("chunk_ends", "chunked", "decode_logits", "last_logits", "last_used", "served_last", "tokens")

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
    live_bytes      those of the live lineages (pinned or current)
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
    current), least recently used first, each with its storages
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
    the storages the engine's :class:`LineageBook` reports."""

    def __init__(self, book: LineageBook, limit: int | None = None):
        self._book = book
        self._pins: weakref.WeakSet[LineagePin] = weakref.WeakSet()
        self._evicted: set[str] = set()
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
        self._book.get_lineage(lineage)
        pin = LineagePin(lineage)
        self._pins.add(pin)
        return pin

    def live_lineages(self) -> set[str]:
        """The pinned lineages and the one the last verb worked on: never evicted."""
        live = {p.lineage for p in list(self._pins)}
        if self._book.working is not None:
            live.add(self._book.working)
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
        before = engine.counters.prefilled_tokens
        engine.prefill(handle, chunk)
        engine.counters.rebuilt_tokens += engine.counters.prefilled_tokens - before
    return handle


def crop(engine, lineage: str, n_tokens: int) -> str:
    """Crop as a fork: a lineage holding the first ``n_tokens`` of
    ``lineage``, which is dropped; returns the new handle."""
    handle = engine.fork(lineage, n_tokens)
    engine.drop(lineage)
    return handle


class LineageBook:
    """The bookkeeping every engine shares, whatever holds its KV: string
    handles to lineages, the lineage the last verb worked on (never evicted
    by that verb's budget), an LRU clock, the KV budget (:class:`Budget`),
    and the verbs that name a lineage (:class:`unsee.impl.engines.protocol.Engine`).

    An engine subclasses it and provides ``new_lineage``, ``fork``, and the
    verbs on the lineage it works on, ``_prefill(ids)`` and ``_generate(...)``,
    and what truly differs between engines:

    ``_lineage_storages(handle)``  the storages ``{key: bytes}`` a lineage holds,
                                   as the budget's memory counts them
    ``_budget_storages(handle)``   the same as the budget counts them (default:
                                   ``_lineage_storages``; an engine may skip
                                   reading out what only a live lineage holds)
    ``_free_lineage(handle)``      release what the engine holds for a lineage
                                   outside this book, before it is dropped or
                                   evicted (default: nothing)

    It also holds the prefix cache (B5', :meth:`prefix_cache`): the engine's
    prefill asks :meth:`_find_served_chunk` inside the block and gives the
    lineage the source's rows its own way.

    Its lineage objects need ``tokens`` and ``last_used`` (and, to be served,
    ``chunk_ends``, ``decode_logits``, ``last_logits`` and ``is_chunk_end``)."""

    def _init_book(self, kv_budget: int | None = None) -> None:
        self._lineages: dict = {}
        self._current: str | None = None  # the lineage the verbs below work on
        self._next_id = 0
        self._clock = 0
        self._serving = False  # inside `prefix_cache()`
        self._cache_sources: tuple[set[str], int] | None = None  # (handles, first new id); None: all
        self.budget = Budget(self, kv_budget)

    # --- the verbs that name their lineage (the Engine protocol)

    def prefill(self, lineage: str, token_ids: Iterable[int]) -> None:
        """Exactly one forward over ``token_ids`` on ``lineage``."""
        self._work_on(lineage)
        self._prefill(token_ids)

    def generate(self, lineage: str, max_new_tokens: int, stop_ids: Iterable[int] | None = None,
                 temperature: float = 0.0, seed: int | None = None, assist: Assist | None = None) -> list[int]:
        """Decode up to ``max_new_tokens`` on ``lineage`` and commit them as
        one canonical chunk (the engine's ``_generate`` has the details)."""
        self._work_on(lineage)
        assist = assist or Assist()
        return self._generate(max_new_tokens, stop_ids, temperature, seed, assist.draft, assist.probe,
                              assist.lookup)

    def tokens(self, lineage: str) -> list[int]:
        """The token ids the lineage's cache holds (a copy)."""
        return list(self._get(lineage).tokens)

    def drop(self, lineage: str) -> None:
        """Free a lineage's cache (or forget an evicted handle)."""
        if self.budget.forget_evicted(lineage):
            return
        self._get(lineage)
        self.release(lineage)

    # --- what the budget reads and does

    @property
    def resident(self) -> dict:
        """handle -> lineage object, of the resident lineages (read only)."""
        return self._lineages

    @property
    def working(self) -> str | None:
        """The lineage the last prefill, generate or new_lineage named (the budget keeps it)."""
        return self._current

    def get_lineage(self, lineage: str):
        """The lineage object of ``lineage`` (touched, for the LRU clock)."""
        return self._get(lineage)

    def get_storages(self, handle: str) -> dict:
        return self._lineage_storages(handle)

    def get_budget_storages(self, handle: str) -> dict:
        return self._budget_storages(handle)

    def release(self, handle: str) -> None:
        """Free ``handle``'s cache and forget it (a drop, or the budget's eviction)."""
        self._free_lineage(handle)
        del self._lineages[handle]
        if self._current == handle:
            self._current = None

    # --- the prefix cache (B5')

    @contextlib.contextmanager
    def prefix_cache(self, sources: Iterable[str] | None = None) -> Iterator[LineageBook]:
        """Serve prefills inside the block from a prefix cache (B5').

        The cache holds the lineages ``sources`` (default: every resident
        one) and every lineage created inside the block, as a serving engine
        caches what it computes. A prefill of chunk ``c`` on a lineage whose
        chunks so far are ``c_1..c_k`` is served by another cached lineage
        whose first ``k + 1`` chunks are ``c_1..c_k, c``, token ids and
        boundaries both: the lineage then holds that lineage's KV of those
        positions (nothing is computed; ``reused_tokens`` counts it). Whole
        chunks of the same chunking only, so the KV is the one a prefill
        would compute, bit for bit (the engine's same-chunking identity).
        Evicted sources are simply not in the cache."""
        previous = self._serving, self._cache_sources
        self._serving = True
        self._cache_sources = None if sources is None else ({h for h in sources if h in self._lineages},
                                                             self._next_id)
        try:
            yield self
        finally:
            self._serving, self._cache_sources = previous

    def _find_served_chunk(self, lin, ids: Sequence[int]):
        """Inside :meth:`prefix_cache`, :func:`find_cached_chunk`'s answer for
        chunk ``ids`` on ``lin`` among the cached lineages, or None (outside the
        block, or ``lin`` is not an unbroken chunk sequence)."""
        if not self._serving or not lin.is_chunk_end(len(lin.tokens)):
            return None
        return find_cached_chunk(self._lineages, lambda handle: is_cache_source(self._cache_sources, handle), lin, ids)

    # --- helpers

    def _work_on(self, lineage: str) -> None:
        """Make ``lineage`` the one the verbs below act on (checked first)."""
        self._get(lineage)
        self._current = lineage

    def _budget_storages(self, handle: str) -> dict:
        return self._lineage_storages(handle)

    def _free_lineage(self, handle: str) -> None:
        """Nothing outside the book to release (an engine whose lineages hold
        more, such as a context, says so here)."""

    def _fresh_handle(self) -> str:
        handle = f"L{self._next_id}"
        self._next_id += 1
        return handle

    def _need_current(self) -> str:
        if self._current is None:
            raise RuntimeError("no lineage to work on: name one")
        return self._current

    def _get(self, lineage: str | None):
        handle = self._need_current() if lineage is None else lineage
        if handle not in self._lineages:
            if self.budget.is_evicted(handle):
                raise EvictedLineageError(
                    f"lineage {handle!r} was evicted by the KV budget ({self.budget.limit} bytes); "
                    "rebuild it by prefill from a checkpoint's manifest")
            raise KeyError(f"unknown lineage {handle!r}; live: {sorted(self._lineages)}")
        self._touch(handle)
        return self._lineages[handle]

    def _touch(self, handle: str) -> None:
        self._clock += 1
        self._lineages[handle].last_used = self._clock

    def _check_prefix_length(self, verb: str, n_tokens, length: int) -> int:
        """``n_tokens`` as an int in ``[0, length]`` (a lineage's length), or a
        ValueError naming ``verb`` before anything changes."""
        n = as_int(n_tokens)
        if n is None or not 0 <= n <= length:
            raise ValueError(f"{verb}: n_tokens={n_tokens!r} is outside [0, {length}] (the lineage's length)")
        return n

    def _check_generate(self, max_new_tokens, temperature: float, seed: int | None, draft,
                        lookup: bool = False) -> int:
        """Check ``generate``'s arguments before anything changes; returns
        ``max_new_tokens`` as an int. A draft or a context lookup needs the
        engine's measured prefill-versus-decode bound (``draft_bound``; None:
        drafts off)."""
        if as_int(max_new_tokens) is None or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an int >= 0")
        if temperature < 0:
            raise ValueError(f"temperature={temperature!r} must be >= 0")
        if temperature > 0 and seed is None:
            raise ValueError(f"temperature={temperature!r} > 0 needs a seed for repeatable sampling")
        if (draft is not None or lookup) and self.draft_bound is None:
            what = "a draft" if draft is not None else "lookup=True"
            raise ValueError(f"generate: {what} needs a measured discrepancy bound, and none is known for "
                             f"{self.lm.name} on {self.lm.device} {self.lm.dtype} (drafts are off there)")
        return int(max_new_tokens)

    def _check_ids(self, token_ids: Iterable[int], allow_empty: bool = False) -> list[int]:
        # Checked on the host: an out-of-range id on CUDA is a device assert
        # that kills the process instead of an error we can report.
        ids = [operator.index(t) for t in token_ids]  # ints only, no floats
        if not ids and not allow_empty:
            raise ValueError("prefill: token_ids is empty; a forward needs at least one token")
        bad = [t for t in ids if not 0 <= t < self.lm.vocab_size]
        if bad:
            raise ValueError(f"prefill: token ids {bad[:5]} outside [0, {self.lm.vocab_size})")
        return ids


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


def is_cache_source(sources, handle: str) -> bool:
    """Whether an active prefix cache may serve from ``handle``: ``sources`` is
    None (every lineage may) or ``(cached handles, first new handle number)``,
    since lineages made after the cache opened may serve too (handles are
    ``"L<n>"`` with ``n`` increasing)."""
    if sources is None:
        return True
    cached, first_new = sources
    return handle in cached or int(handle[1:]) >= first_new

