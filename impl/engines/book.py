"""The lineage book: the verbs of :class:`unsee.impl.engines.protocol.Engine`
written once, over a KV backend that each engine supplies.

The book keeps string handles to lineage objects, an LRU clock, the KV
budget (:class:`~unsee.impl.engines.lineage.Budget`) and the prefix cache
(B5'). What differs between engines is where a lineage's KV lives and how a
forward reaches the model: that is the engine's backend (``engine.kv``), a
small object with no verbs of its own (:class:`LineageStore`, and for an
engine that computes its own KV, :class:`KVBackend`):

* transformers: :class:`unsee.impl.engines.hf.kv.HFKV` (a cache per lineage);
* llama.cpp: :class:`unsee.impl.engines.llamacpp.rows.LlamaRows` (one
  resident sequence, the others parked as rows);
* vLLM: its lineages are token ids and a salt; it answers prefill and
  generate with requests of its own.

Every verb and every step names the lineage it works on. The budget spares
the lineage the last prefill, generate or new_lineage named (its caller is
still working on it); nothing else remembers it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

import torch

from unsee.impl.engines.counts import Counters
from unsee.impl.engines.decoding import PLAIN, Rule
from unsee.impl.engines.lineage import (
    Budget,
    EvictedLineageError,
    as_int,
    check_ids,
    check_prefix_length,
    find_cached_chunk,
    is_cache_source,
    take_served_chunk,
)
from unsee.impl.engines.protocol import Assist
from unsee.impl.engines.scheduler import Scheduler, StepRequest, get_requester
from unsee.impl.engines.speculation import DraftPolicy
from unsee.impl.engines.turn import Turn, decode_guarded, decode_reference, speculate
from unsee.impl.util.ids import compute_lineage_handle

#: ``on_forward(n_tokens, started)``: a hook on every model forward (``started``: its ``time.perf_counter()``)
OnForward = Callable[[int, float], None]
#: the hooks a backend reports its forwards to: ``(on_forward, on_commit or None, thread)``; a hook
#: hears the forwards of the thread that added it only (a server interleaves other requests'
#: forwards), or every thread's where ``thread`` is None
ForwardHookList = list[tuple[OnForward, "OnForward | None", int | None]]


def report_forward(hooks: ForwardHookList, n_tokens: int, started: float, commit: bool,
                   thread: int | None = None) -> None:
    """Tell the hooks of the thread the forward was computed for (``thread``, else
    :func:`~unsee.impl.engines.scheduler.get_requester`) that a forward of ``n_tokens`` ended (a
    backend calls it after its forward; ``commit``: the forward commits a decoded turn)."""
    me = thread or get_requester()
    for on_forward, on_commit, listener in list(hooks):
        if listener is None or listener == me:
            (on_commit if commit and on_commit is not None else on_forward)(n_tokens, started)


@runtime_checkable
class LineageStore(Protocol):
    """Where an engine's lineages live: a new one, a fork, what one holds, its release."""

    def new(self) -> Any:
        """A new empty lineage object."""

    def fork(self, handle: str, src: Any, n: int) -> Any:
        """A new lineage object holding the first ``n`` tokens of ``src`` (lineage ``handle``)."""

    def storages(self, handle: str, lin: Any, full: bool) -> dict:
        """The storages ``{key: bytes}`` ``lin`` holds; ``full``: as memory
        counts them, else as the budget does (it may skip what only a spared
        lineage holds)."""

    def free(self, handle: str) -> None:
        """Release what the backend holds for ``handle`` outside its lineage object."""


@runtime_checkable
class KVBackend(LineageStore, Protocol):
    """A backend that computes its own KV (transformers, llama.cpp): its
    lineages are :class:`~unsee.impl.engines.lineage.ChunkedLineage` objects.
    It reports each forward to ``hooks`` (:func:`report_forward`): the book's
    :meth:`~LineageBook.hook_forwards` adds to them."""

    hooks: ForwardHookList

    def forward(self, handle: str, lin: Any, ids: list[int], all_logits: bool, commit: bool = False) -> Any:
        """One forward over ``ids`` at the lineage's end, appending them to
        ``lin.tokens``: the logits after the last (or after each, (n, vocab));
        reported to ``hooks`` (``commit``: it commits a decoded turn)."""

    def truncate(self, handle: str, lin: Any, n: int) -> None:
        """Keep the first ``n`` tokens and their KV (a step: the history is the caller's)."""

    def take_rows(self, handle: str, lin: Any, src_handle: str, src: Any, n: int) -> None:
        """Give ``lin`` the KV of ``src``'s first ``n`` positions (shared where it can be)."""

    def check_room(self, lin: Any, ids: list[int]) -> None:
        """Refuse a prefill the backend cannot hold (a ValueError), or nothing."""

    def digest(self, handle: str, lin: Any) -> str:
        """sha256 of the lineage's KV by position."""

    def to_torch(self, logits: Any) -> torch.Tensor | None:
        """The backend's logits as a float32 CPU torch tensor (shared, not copied)."""

    def from_torch(self, logits: torch.Tensor | None) -> Any:
        """A torch tensor back as the backend's logits."""


class TurnLineage:
    """A lineage as a decoding turn sees it
    (:class:`unsee.impl.engines.turn.TurnLineage`): its tokens and last logits
    (torch), a crop, and two forwards of its backend, each a job of the engine's loop
    (:class:`~unsee.impl.engines.scheduler.Scheduler`) that lets go of the session while it
    runs: a one-token forward is a decode step, batched with other threads' ready steps."""

    __slots__ = ("handle", "kv", "lin", "loop")

    def __init__(self, kv: KVBackend, handle: str, lin: Any, loop: Scheduler):
        self.kv, self.handle, self.lin, self.loop = kv, handle, lin, loop

    @property
    def tokens(self) -> list[int]:
        return self.lin.tokens

    @property
    def last_logits(self) -> torch.Tensor | None:
        return self.kv.to_torch(self.lin.last_logits)

    @last_logits.setter
    def last_logits(self, logits: torch.Tensor | None) -> None:
        self.lin.last_logits = self.kv.from_torch(logits)

    def truncate(self, n: int) -> None:
        self.kv.truncate(self.handle, self.lin, n)

    def forward_last(self, ids: list[int]) -> torch.Tensor:
        step = StepRequest(self.handle, self.lin, ids[0], threading.get_ident()) if len(ids) == 1 else None
        return self.kv.to_torch(self.loop.run(self.kv.forward, self.handle, self.lin, ids, False,
                                              release=True, step=step))

    def forward_all(self, ids: list[int]) -> torch.Tensor:
        if len(ids) == 1:  # a decode step (batchable), its logits as a row
            return self.forward_last(ids)[None]
        return self.kv.to_torch(self.loop.run(self.kv.forward, self.handle, self.lin, ids, True, release=True))


class LineageBook:
    """The verbs that name a lineage, over ``self.kv`` (the module docstring).
    An engine is a book plus its backend, its model (``lm``), its
    :class:`~unsee.impl.engines.protocol.Determinism`, its draft settings
    (``draft_bound``, ``draft_policy``, ``max_forward``: the longest forward
    whose rows equal decoding's, or None) and any verbs of its own."""

    lm: Any
    draft_bound: float | None
    draft_policy: DraftPolicy | None
    max_forward: int | None = None

    def __init__(self, kv: LineageStore, kv_budget: int | None = None,
                 batch: Callable[[list], list] | None = None, batch_limit: int = 1):
        self.kv = kv
        #: the loop that runs every forward (``batch``: the backend's forward of several lineages'
        #: decode steps, at most ``batch_limit`` of them; impl/engines/scheduler.py)
        self.scheduler = Scheduler(batch, batch_limit)
        # Per thread: a server interleaves requests' forwards (impl/engines/scheduler.py), and a span
        # measured in one thread (a turn, a forget) must count that thread's work and cache only.
        self._local = threading.local()
        self._lineages: dict = {}
        self._next_id = 0
        self._clock = 0
        self.budget = Budget(self, kv_budget)

    @property
    def counters(self) -> Counters:
        """The work this thread asked of the engine (:class:`~unsee.impl.engines.counts.Counters`)."""
        local = self._local.__dict__
        if "counters" not in local:
            local["counters"] = Counters()
        return local["counters"]

    @property
    def _serving(self) -> bool:
        """Whether this thread is inside :meth:`prefix_cache`."""
        return self._local.__dict__.get("serving", False)

    @property
    def _cache_sources(self) -> set[str] | None:
        """This thread's prefix cache sources (None: every lineage): those named when it opened
        and the lineages this thread made inside it (:meth:`_fresh_handle`), never another
        thread's, so a server's chat cache never serves from a conversation made meanwhile."""
        stack = self._local.__dict__.get("sources", [])
        return stack[-1] if stack else None

    # --- lineages

    def new_lineage(self) -> str:
        """A new empty lineage (spared by the budget until another verb names another)."""
        handle = self._fresh_handle()
        self._lineages[handle] = self.kv.new()
        self.budget.spare(handle)
        self._touch(handle)
        return handle

    def fork(self, lineage: str, n_tokens: int | None = None) -> str:
        """A new lineage holding the first ``n_tokens`` (default: all) of
        ``lineage``, independent of it from then on (the backend shares what
        it can: copy-on-write views, slices of parked rows, a cache salt);
        the last logits come along only when the whole lineage is forked.
        The source is not changed. The budget is enforced on return."""
        src = self._use(lineage)
        length = len(src.tokens) + len(src.pending)
        n = length if n_tokens is None else check_prefix_length("fork", n_tokens, length)
        if n > len(src.tokens):  # the fork holds tokens not computed yet: compute them
            self._flush(lineage, src)
        handle = self._fresh_handle()
        self._lineages[handle] = self.kv.fork(lineage, src, n)
        self._touch(handle)
        self.budget.enforce()
        return handle

    def tokens(self, lineage: str) -> list[int]:
        """The token ids the lineage's cache holds (a copy), those taken but not computed yet too."""
        lin = self._use(lineage)
        return [*lin.tokens, *lin.pending]

    def drop(self, lineage: str) -> None:
        """Free a lineage's cache (or forget an evicted handle)."""
        if self.budget.forget_evicted(lineage):
            return
        self._use(lineage)
        self.release(lineage)

    # --- the verbs of an engine that computes its own KV (self.kv is a KVBackend)

    def prefill(self, lineage: str, token_ids: Iterable[int]) -> None:
        """The chunk ``token_ids`` on ``lineage``: one forward, or, inside :meth:`prefix_cache`,
        served from a cached lineage. One that fits ``max_forward`` with what is pending is left
        pending, computed with the chunks after it before any verb reads the KV (:meth:`flush`):
        the same KV, chunks and logits, since a forward that short has decode's rows however its
        tokens are grouped (llamacpp/facts.py). A turn's last token, the next observation and
        header are then one forward, not three."""
        lin = self._use(lineage)
        self.budget.spare(lineage)
        ids = self._check_ids(token_ids)
        self.kv.check_room(lin, [*lin.pending, *ids])  # refused before anything is computed
        if not self._defers(lin, ids):
            self._flush(lineage, lin)
        if self._defers(lin, ids):
            lin.defer(ids, len(lin.tokens) + len(lin.pending))
            return
        self._prefill(lineage, lin, ids)

    def flush(self, lineage: str) -> None:
        """Compute what ``lineage`` has pending now (:meth:`prefill`), nothing if nothing is."""
        self._flush(lineage, self._use(lineage))

    def generate(self, lineage: str, max_new_tokens: int, stop_ids: Iterable[int] | None = None,
                 temperature: float = 0.0, seed: int | None = None, assist: Assist | None = None,
                 rule: Rule | None = None) -> list[int]:
        """Decode up to ``max_new_tokens`` ids on ``lineage`` and commit them canonically (as one
        prefilled chunk). Returns the ids. ``rule`` (:class:`~unsee.impl.engines.decoding.Rule`):
        penalties, a nucleus and constraints (a grammar, stop texts) over the turn's own tokens.

        Greedy when temperature == 0; otherwise an exponential race seeded by (``seed``, position
        in the turn) (``decoding.get_scores``), so a run is repeatable whatever the device. Stops
        after a stop id (it is included and committed) or at max_new_tokens. stop_ids=None means
        the model's eos_ids; pass () to never stop early.

        ``assist`` (:class:`~unsee.impl.engines.protocol.Assist`; each part needs ``draft_bound``)
        changes no token: a ``draft`` (the tokens this turn had before a forget) is verified instead
        of decoded where the decoding rule agrees with it stably (impl/agent/drafts.py explains the
        guard); ``probe`` feeds the draft's first token as one decode step first and checks its
        second there; ``lookup`` feeds each decided token with a guess from the lineage's own tokens
        (``decoding.get_lookup``). The turn is one of impl/engines/turn.py's procedures. After a
        draft accepted whole its verification chunk *is* the canonical chunk and the logits after
        the turn are not kept (another matmul shape), so a prefill must come before the next generate."""
        self._use(lineage)
        self.budget.spare(lineage)
        assist = assist or Assist()
        max_new_tokens = self._check_generate(max_new_tokens, temperature, seed, assist)
        lin = self._get_decodable(lineage)
        draft = self._check_ids(assist.draft, allow_empty=True)[:max_new_tokens] if assist.draft is not None else []
        stops = set(self.lm.eos_ids if stop_ids is None else (int(s) for s in stop_ids))
        start, header_logits = len(lin.tokens), lin.last_logits
        lin.decode_logits[start] = header_logits  # what a prefix cache needs to serve this position
        turn = Turn(TurnLineage(self.kv, lineage, lin, self.scheduler), self.counters, start,
                    self.kv.to_torch(header_logits), max_new_tokens, stops, temperature, seed, self.draft_bound,
                    max_forward=self.max_forward, policy=self.draft_policy, rule=rule or PLAIN)
        try:
            out, committed = None, False
            if draft or assist.lookup:  # helped: a draft checked against the rule, or context guesses
                helped = speculate if self.max_forward is not None else decode_guarded
                out, committed = helped(turn, replace(assist, draft=draft))
            if out is None:  # no help, or an unstable decision: the reference procedure
                out = decode_reference(turn)
        except BaseException:
            self.kv.truncate(lineage, lin, start)  # interrupted mid-turn: the lineage as it was
            lin.last_logits = header_logits
            raise
        self._commit_turn(lineage, lin, start, out, committed)
        return out

    def logits(self, lineage: str) -> torch.Tensor | None:
        """The logits after the lineage's last prefill (float32, on the CPU, a
        copy), or None where a crop or a draft accepted whole left none."""
        lin = self._use(lineage)
        self._flush(lineage, lin)
        if lin.last_logits is None and lin.served_last:
            self._recompute_served_chunk(lineage, lin)
        logits = self.kv.to_torch(lin.last_logits)
        return None if logits is None else logits.detach().to("cpu", torch.float32).clone()

    def digest(self, lineage: str) -> str:
        """sha256 of the lineage's KV by position (the backend's). Any empty
        lineage has the same digest, however it got empty."""
        lin = self._use(lineage)
        self._flush(lineage, lin)
        return self.kv.digest(lineage, lin)

    @contextlib.contextmanager
    def hook_forwards(self, on_forward: OnForward, on_commit: OnForward | None = None,
                      every_thread: bool = False) -> Iterator[None]:
        """Call ``on_forward(n_tokens, started)`` after every model forward this
        thread makes in the block (``every_thread``: any thread's, as a test that
        slows a server's engine needs); with ``on_commit``, the forward that commits a decoded turn
        as its canonical chunk calls that instead (a profiler tells it apart)."""
        entry = (on_forward, on_commit, None if every_thread else threading.get_ident())
        self.kv.hooks.append(entry)
        try:
            yield
        finally:
            self.kv.hooks.remove(entry)

    # --- what the budget reads and does

    def get_clock(self) -> int:
        """The engine's LRU clock now (it moves at every use of a lineage): the one clock the KV
        budget, llama.cpp's slots and a server's conversations are evicted by."""
        return self._clock

    @property
    def resident(self) -> dict:
        """handle -> lineage object, of the resident lineages (read only)."""
        return self._lineages

    def get_lineage(self, lineage: str):
        """The lineage object of ``lineage`` (the LRU clock does not move)."""
        return self._lineages[lineage]

    def touch(self, lineage: str) -> None:
        """Check that ``lineage`` is resident and mark it used now (the LRU clock)."""
        self._use(lineage)

    def get_storages(self, handle: str) -> dict:
        return self.kv.storages(handle, self._lineages[handle], True)

    def get_budget_storages(self, handle: str) -> dict:
        return self.kv.storages(handle, self._lineages[handle], False)

    def release(self, handle: str) -> None:
        """Free ``handle``'s cache and forget it (a drop, or the budget's eviction)."""
        self.kv.free(handle)
        del self._lineages[handle]
        self.budget.released(handle)

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
        local = self._local.__dict__
        previous, stack = self._serving, local.setdefault("sources", [])  # nested blocks: a stack
        local["serving"] = True
        stack.append(None if sources is None else {h for h in sources if h in self._lineages})
        try:
            yield self
        finally:
            local["serving"] = previous
            stack.pop()

    # --- the steps of the verbs, each naming its lineage


    def _prefill(self, handle: str, lin, ids: list[int], commit: bool = False) -> None:
        """One chunk ``ids`` on ``lin``: served inside :meth:`prefix_cache`
        where a cached lineage has it, else one forward (``commit``: the one
        that commits a decoded turn)."""
        self.kv.check_room(lin, ids)
        if self._serve(handle, lin, ids):
            self.counters.reused_tokens += len(ids)
        else:
            start = len(lin.tokens)
            # the loop computes it; the session is let go of meanwhile (the lineage is this
            # thread's, spared by the budget: another thread's verbs may run)
            lin.last_logits = self.scheduler.run(self.kv.forward, handle, lin, ids, False, commit, release=True,
                                                 step=self._get_chunk_step(handle, lin, ids, commit))
            lin.record_chunk(start)
            lin.served_last = False
            self.counters.forward_calls += 1
            self.counters.prefilled_tokens += len(ids)
        lin.changed()
        self.budget.enforce()

    def _get_chunk_step(self, handle: str, lin, ids: list[int], commit: bool) -> StepRequest | None:
        """The prefill chunk ``ids`` as a request the loop may compute beside other lineages'
        chunks in one forward, where its rows are the same however llama.cpp cuts it: at most
        ``max_forward`` tokens (each cut a forward of at most that many, equal to decode steps:
        llamacpp/facts.py), on a backend that batches. None elsewhere: a forward of its own."""
        cap = self.max_forward
        if commit or self.scheduler.batch is None or not cap or not 1 < len(ids) <= cap:
            return None
        return StepRequest(handle, lin, ids[-1], threading.get_ident(), tuple(ids))

    def _commit_turn(self, handle: str, lin, start: int, out: list[int], committed: bool) -> None:
        """Leave the turn ``out`` on ``lin`` as the one chunk a replay redoes."""
        if committed:
            # the verification chunk is the turn's canonical chunk: record it
            # as prefill would, so a prefix cache can serve this lineage later
            lin.record_chunk(start)
            lin.served_last = False
            lin.changed()
            self.budget.enforce()
        elif out and not self._commit_decoded(handle, lin, start, out):
            # Canonicalise: decode steps (and verification chunks) wrote the turn in
            # other chunks; replace them by one prefill of g_1..g_n, which a replay can redo.
            self.kv.truncate(handle, lin, start)
            self._prefill(handle, lin, out, commit=True)

    def _commit_decoded(self, handle: str, lin, start: int, out: list[int]) -> bool:
        """Commit a decoded turn without re-prefilling it, where that is the
        same KV: a turn of at most ``max_forward`` tokens, whose rows before
        its last token the turn's own forwards wrote (each of at most
        ``max_forward`` tokens, so each row equal to a decode step's, and to
        the row a one-chunk prefill of the turn writes: llamacpp/facts.py).
        The last token is left pending (:meth:`prefill`), computed with the
        next chunk; inside a prefix cache, whose next chunk may be served
        from this lineage's record, it is fed alone, as a decode step the loop
        may batch with other lineages' steps. False (nothing changed) where
        it does not apply. Inside a prefix cache too, so that B5' does the
        work B5 does, less what it serves."""
        cap = self.max_forward
        if not cap or len(out) > cap:
            return False
        if lin.tokens[start:start + len(out) - 1] != out[:-1]:
            return False
        self.kv.truncate(handle, lin, start + len(out) - 1)
        lin.defer(out[-1:], start)
        if not self._defers(lin, []):
            self._flush(handle, lin)
        self.budget.enforce()
        return True

    def _defers(self, lin, ids: list[int]) -> bool:
        """Whether ``prefill`` leaves chunk ``ids`` pending on ``lin``: it fits ``max_forward``
        with what is pending, outside a prefix cache (which serves whole recorded chunks)."""
        cap = self.max_forward
        return bool(cap) and not self._serving and len(lin.pending) + len(ids) <= cap

    def _flush(self, handle: str, lin) -> None:
        """Compute what ``lin`` has pending in one forward (at most ``max_forward`` tokens: a
        decode step or a chunk the loop may batch with other lineages') and record its chunks.
        They leave pending as the forward starts, so that a hook on it reads each token once;
        if it never ran (cancelled, refused), they are pending again."""
        if not lin.pending:
            return
        ids, chunks, length = lin.pending, lin.pending_chunks, len(lin.tokens)
        lin.pending, lin.pending_chunks = [], []
        step = (StepRequest(handle, lin, ids[0], threading.get_ident()) if len(ids) == 1
                else self._get_chunk_step(handle, lin, ids, False))
        try:
            logits = self.scheduler.run(self.kv.forward, handle, lin, ids, False, release=True, step=step)
        except BaseException:
            if len(lin.tokens) == length:
                lin.pending, lin.pending_chunks = ids, chunks
            raise
        for start, end in chunks:
            lin.record_chunk(start, end)
        lin.last_logits, lin.served_last = logits, False
        self.counters.forward_calls += 1
        self.counters.prefilled_tokens += len(ids)
        lin.changed()

    def _serve(self, handle: str, lin, ids: list[int]) -> bool:
        """Inside :meth:`prefix_cache`, serve chunk ``ids`` on ``lin`` from
        another cached lineage (:func:`find_cached_chunk`); False if none has
        it, or outside the block, or ``lin`` is not an unbroken chunk sequence.
        A source's pending chunks are not recorded until computed: never served."""
        if not self._serving or not lin.is_chunk_end(len(lin.tokens)):
            return False
        found = find_cached_chunk(self._lineages, lambda h: is_cache_source(self._cache_sources, h), lin, ids)
        if found is None:
            return False
        src_handle, src, logits = found
        self.kv.take_rows(handle, lin, src_handle, src, len(lin.tokens) + len(ids))
        take_served_chunk(lin, src, ids, logits)
        self._touch(src_handle)
        return True

    def _get_decodable(self, handle: str):
        """The lineage ``handle``, with the logits a decode continues from."""
        lin = self._use(handle)
        self._flush(handle, lin)
        if lin.last_logits is None and lin.served_last:
            self._recompute_served_chunk(handle, lin)  # a served chunk whose logits were not kept
        if lin.last_logits is None:
            raise RuntimeError(f"generate on lineage {handle!r}: no logits to continue from; "
                               "prefill first (a new lineage or a crop has none)")
        return lin

    def _recompute_served_chunk(self, handle: str, lin) -> None:
        """Compute the last (served) chunk for real, for the logits a decode needs."""
        end = lin.chunk_ends.pop()
        start = lin.chunk_ends[-1] if lin.chunk_ends else 0
        ids = lin.tokens[start:end]
        self.kv.truncate(handle, lin, start)
        lin.decode_logits = {p: t for p, t in lin.decode_logits.items() if p <= start}
        lin.served_last = False
        self.counters.reused_tokens -= len(ids)  # it was not reused after all
        lin.last_logits = self.scheduler.run(self.kv.forward, handle, lin, ids, False, release=True)
        lin.chunk_ends.append(end)
        lin.changed()
        self.counters.forward_calls += 1
        self.counters.prefilled_tokens += len(ids)

    # --- checks and the clock

    def _use(self, lineage: str):
        """The lineage object of ``lineage``, checked and touched (the LRU clock)."""
        if lineage not in self._lineages:
            if self.budget.is_evicted(lineage):
                raise EvictedLineageError(
                    f"lineage {lineage!r} was evicted by the KV budget ({self.budget.limit} bytes); "
                    "rebuild it by prefill from a checkpoint's manifest")
            raise KeyError(f"unknown lineage {lineage!r}; live: {sorted(self._lineages)}")
        self._touch(lineage)
        return self._lineages[lineage]

    def _fresh_handle(self) -> str:
        """The next handle (never reused, even after a drop); inside this thread's prefix cache,
        one of its sources (a serving engine caches what it computes)."""
        handle = compute_lineage_handle(self._next_id)
        self._next_id += 1
        for sources in self._local.__dict__.get("sources", []):  # every open block of this thread
            if sources is not None:
                sources.add(handle)
        return handle

    def _touch(self, handle: str) -> None:
        self._clock += 1
        self._lineages[handle].last_used = self._clock

    def _check_generate(self, max_new_tokens, temperature: float, seed: int | None, assist: Assist) -> int:
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
        if (assist.draft is not None or assist.lookup) and self.draft_bound is None:
            what = "a draft" if assist.draft is not None else "lookup=True"
            raise ValueError(f"generate: {what} needs a measured discrepancy bound, and none is known for "
                             f"{self.lm.name} on {self.lm.device} {self.lm.dtype} (drafts are off there)")
        return int(max_new_tokens)

    def _check_ids(self, token_ids: Iterable[int], allow_empty: bool = False) -> list[int]:
        return check_ids(token_ids, self.lm.vocab_size, allow_empty)


__all__ = ["ForwardHookList", "KVBackend", "LineageBook", "LineageStore", "OnForward", "TurnLineage", "report_forward"]
