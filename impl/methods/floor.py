"""The compute floor of a forget (issue 8, item 4): what any exact forget must
compute, counted and timed (the demo shows it beside the resets; bench/paper.py
and bench/forget_policy.py measure against it).

The floor is defined from the counterfactual's content, not from what a
forget did. Starting from the restored prefix (the pre-forget session's
checkpoint at ``boundary``), the counterfactual state needs at least:

* one canonical prefill of every *suffix block*: every block the
  counterfactual runtime (a full reset) created after the boundary, in its
  recorded chunks, on the lineage it belongs to (a compaction or a new
  session opens a new one), and
* for every *changed* model turn, the decode of its tokens from its first
  changed token on. A turn is changed when its generated tokens differ from
  those of the block with the same id in the pre-forget runtime; the tokens
  before the first difference are the old turn's and cost no decode (a
  verified draft would accept them). Decoding ``m`` tokens from the first
  changed token ``d`` on costs ``m`` decoded tokens and one-token forwards
  feeding ``g_{d-1} .. g_{n-2}`` (the last token is never fed back): ``m``
  forwards when ``d >= 1``, since the logits that decide ``g_d`` come from
  feeding ``g_{d-1}``, and ``m - 1`` when ``d == 0``, where the header's
  prefill already gave them. (Until 2026-11-22 the floor also counted
  ``m - 1`` for ``d >= 1``, deciding ``g_d`` on logits nothing had computed:
  one forward per such turn below any real method.)

:func:`compute_floor` counts those operations and times a raw run of exactly
them on the same :class:`~unsee.impl.engines.hf.engine.KVEngine` in the same process (engine
verbs only: ``new_lineage``, ``use``, ``prefill``, ``crop``; no runtime, no
provenance, no sanitising). Restoring the prefix is set-up, outside the timed
run: what a method spends on restore, verification or fallback re-decodes
shows up as a ratio above 1.

One approximation in the timing, not in the counts: the raw run feeds a
changed turn's decode forwards right after its header, so a turn whose first
change is at position ``d`` attends over ``d`` fewer tokens than a real
decode would (the old turn's first ``d`` tokens are not in the cache yet).
That keeps the floor a lower bound and costs well under one percent of a
forward at the context lengths here.
"""

from __future__ import annotations

import time

import attrs

from unsee.impl.agent.provenance import DERIVED_TYPES, RuntimeBlock
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.lineage import crop
from unsee.impl.engines.opening import can_fork_first_chunk
from unsee.impl.engines.protocol import Engine, PendingChunks


@attrs.frozen
class FloorTurn:
    """One changed model turn of the counterfactual suffix."""

    block_id: str
    generated: int  # tokens the counterfactual turn generated
    first_change: int  # index of its first token that differs from the old turn's

    @property
    def decoded(self) -> int:
        return self.generated - self.first_change

    @property
    def forwards(self) -> int:
        # the logits of g_d come from feeding g_{d-1}; at d == 0 from the header
        return self.decoded if self.first_change >= 1 else max(self.decoded - 1, 0)


@attrs.frozen
class Floor:
    """The compute floor of one forget: counts by definition, wall time of a raw run."""

    prefilled: int  # tokens of the canonical prefill of every suffix block
    decoded: int  # tokens decoded in the changed turns, from their first changed token on
    forwards: int  # prefill chunks plus one-token decode forwards
    wall_s: float  # the raw engine run of exactly those operations
    boundary: int
    blocks: int  # suffix blocks prefilled
    changed_turns: tuple[FloorTurn, ...] = ()
    #: CPU time of the calling thread over the same run: with one torch thread
    #: it is the model work itself, which a loaded machine does not inflate
    cpu_s: float = 0.0

    @property
    def recomputed(self) -> int:
        return self.prefilled + self.decoded

    def to_json(self) -> dict:
        return {"prefilled": self.prefilled, "decoded": self.decoded, "recomputed": self.recomputed,
                "forwards": self.forwards, "wall_s": self.wall_s, "cpu_s": self.cpu_s, "boundary": self.boundary, "blocks": self.blocks,
                "changed_turns": [attrs.asdict(t) | {"decoded": t.decoded} for t in self.changed_turns]}


def get_suffix_blocks(reset_runtime: AgentRuntime, boundary: int) -> list[RuntimeBlock]:
    """The blocks the counterfactual created after ``boundary`` that hold KV
    (memory records are stored, never prefilled), in creation order."""
    return [b for b in reset_runtime.graph.blocks() if b.turn > boundary and b.tokens]


def is_model_turn(block: RuntimeBlock) -> bool:
    """A block the model decoded: a derived type committed as a header chunk
    and a turn chunk. (A compaction's summary is also re-prefilled as the new
    lineage's ``summary`` context block, in one chunk: a prefill, not a turn.)"""
    return block.type in DERIVED_TYPES and len(block.chunks) == 2


def get_first_change(new: RuntimeBlock, old: RuntimeBlock | None) -> int | None:
    """Where a counterfactual model turn's generated tokens first differ from
    the pre-forget turn's, or None when they are identical (no decode)."""
    header = new.chunks[0] if new.chunks else 0
    generated = new.tokens[header:]
    if old is None:
        return 0
    previous = old.tokens[(old.chunks[0] if old.chunks else 0):]
    if generated == previous:
        return None
    for i, (a, b) in enumerate(zip(generated, previous)):
        if a != b:
            return i
    return min(len(generated), len(previous))


def compute_floor(engine: Engine, base_runtime: AgentRuntime, reset_runtime: AgentRuntime,
                  boundary: int) -> Floor:
    """The compute floor of forgetting, restoring at ``boundary``: the
    counterfactual is ``reset_runtime`` (a full reset of ``base_runtime``, the
    pre-forget session), the restored prefix is ``base_runtime``'s checkpoint
    at ``boundary``. Counts and a timed raw run, see the module docstring.
    Every lineage the run creates is dropped before returning."""
    checkpoint = {c.boundary: c for c in base_runtime.checkpoints.all()}.get(boundary)
    if checkpoint is None:
        raise ValueError(f"boundary={boundary!r}: the pre-forget session has no checkpoint there; it has "
                         f"{[c.boundary for c in base_runtime.checkpoints.all()]}")
    if reset_runtime.engine is not engine or base_runtime.engine is not engine:
        raise ValueError("compute_floor: both runtimes must run on the engine it times")
    blocks = get_suffix_blocks(reset_runtime, boundary)
    old = {b.id: b for b in base_runtime.graph.blocks()}
    changed: dict[str, FloorTurn] = {}
    for block in blocks:
        if is_model_turn(block):
            first = get_first_change(block, old.get(block.id))
            if first is not None:
                generated = len(block.tokens) - (block.chunks[0] if block.chunks else 0)
                changed[block.id] = FloorTurn(block.id, generated, first)
    # set-up (untimed): the restored prefix, as a restore would leave it
    prefix = engine.fork(checkpoint.lineage) if checkpoint.lineage in engine.budget.lineages \
        else base_runtime.rebuild_lineage(checkpoint.context)
    prefix = crop(engine, prefix, checkpoint.token_offset)
    created = [prefix]
    first = base_runtime.graph[checkpoint.context[0]].get_chunks()[:1] if checkpoint.context else []
    try:
        # the process's CPU, not this thread's: the engine's loop thread computes the forwards
        # (impl/engines/scheduler.py), and nothing else runs while the floor is timed
        started, cpu_started = time.perf_counter(), time.process_time()
        forked = _run_floor(engine, prefix, first, blocks, changed, created)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    finally:
        for lineage in created:
            if lineage in engine.budget.lineages:
                engine.drop(lineage)
    # a new context's system block is forked from the live lineage, as the runtime does: no prefill
    chunks = [len(chunk) for block in blocks if block.id not in forked for chunk in block.get_chunks()]
    floor_counts = {"prefilled": sum(chunks), "decoded": sum(t.decoded for t in changed.values()),
                    "forwards": len(chunks) + sum(t.forwards for t in changed.values())}
    return Floor(wall_s=wall, cpu_s=cpu, boundary=boundary, blocks=len(blocks),
                 changed_turns=tuple(changed.values()), **floor_counts)


def _run_floor(engine: Engine, prefix: str, first: list, blocks: list[RuntimeBlock], changed: dict[str, FloorTurn],
               created: list[str]) -> set[str]:
    """Exactly the floor's operations, engine verbs only; the ids of the
    blocks that opened a lineage as a fork of the live one (``first``: the
    live lineage's first chunk, as :func:`~unsee.impl.engines.opening.open_lineage` reads it)."""
    lineage, forked = prefix, set()
    for block in blocks:
        if block.token_span[0] == 0:  # a block at offset 0 opens a lineage (compaction, new session)
            chunks = block.get_chunks()
            if block.type == "system" and len(chunks) == 1 and can_fork_first_chunk(engine, lineage, first, chunks[0]):
                lineage = engine.fork(lineage, len(chunks[0]))
                created.append(lineage)
                forked.add(block.id)
                continue
            first = chunks[:1]
            lineage = engine.new_lineage()
            created.append(lineage)
        if len(engine.tokens(lineage)) != block.token_span[0]:
            raise RuntimeError(f"floor: block {block.id!r} starts at {block.token_span[0]} in the counterfactual, "
                               f"but its lineage holds {len(engine.tokens(lineage))} tokens here")
        chunks = block.get_chunks()
        turn = changed.get(block.id)
        if turn is None:
            for chunk in chunks:
                engine.prefill(lineage, chunk)
            continue
        header, generated = chunks[0], [t for chunk in chunks[1:] for t in chunk]
        engine.prefill(lineage, header)
        start = len(engine.tokens(lineage))
        compute_pending(engine, lineage)
        # the decode: one-token forwards feeding g_{d-1} .. g_{n-2} (the
        # logits of g_d need g_{d-1} fed; the last token is never fed)
        for token in generated[max(turn.first_change - 1, 0):len(generated) - 1]:
            engine.prefill(lineage, [token])
            compute_pending(engine, lineage)
        lineage = crop(engine, lineage, start)
        created.append(lineage)
        for chunk in chunks[1:]:  # the turn's canonical prefill
            engine.prefill(lineage, chunk)
    return forked


def compute_pending(engine: Engine, lineage: str) -> None:
    """Compute what ``lineage`` has pending, now: a decode step is a forward of
    its own, since the token it feeds is known only from the logits before it.
    An engine that defers chunks (:class:`~unsee.impl.engines.protocol.PendingChunks`)
    would otherwise compute the floor's known tokens in one forward, below
    what any decode can do."""
    if isinstance(engine, PendingChunks):
        engine.flush(lineage)


__all__ = ["Floor", "FloorTurn", "compute_floor", "get_first_change", "get_suffix_blocks", "is_model_turn"]
