"""The agent runtime's state ``R_t`` as one value (paper, Section 3.4).

:class:`RuntimeState` holds what a transition changes: the observation log,
the provenance graph, the checkpoints, the cache lineage the runtime extends,
the resident context, memory store and pending plans, and the counters. The
runtime replaces it whole (``attrs.evolve``) at every change, so a fork, a
restore and the adoption of a replay's result are each one new value. The
graph and the checkpoint store are values too (their changes return a new
one), so a state is never changed once made, two runtimes may share one,
and two states are equal iff every field is equal.

The KV tensors are not part of it: ``lineage`` names them in the engine (the
runtime pins it, see :class:`~unsee.impl.agent.runtime.AgentRuntime`).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from unsee.impl.agent.checkpoints import Checkpoint, CheckpointStore
from unsee.impl.agent.episode import Item, Step
from unsee.impl.agent.provenance import ArtifactGraph, RuntimeBlock
from unsee.impl.util.ids import NO_LINEAGE, compute_stored_handle


@attrs.frozen
class RuntimeState:
    """``R_t`` without its KV tensors, as a value: every field is frozen
    (sequences are tuples), so a state is never changed in place."""

    graph: ArtifactGraph = attrs.field(factory=ArtifactGraph)
    checkpoints: CheckpointStore = attrs.field(factory=CheckpointStore)
    steps: tuple[Step, ...] = attrs.field(default=(), converter=tuple)  # the observation log o_1..o_t
    t: int = 0
    lineage: str = NO_LINEAGE  # the cache lineage (NO_LINEAGE before R_0)
    context: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    memory: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    plans: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    transitions: int = 0  # invocations of F
    forgotten: tuple[str, ...] = attrs.field(default=(), converter=tuple)  # source ids (ids, never values)

    def on_branch(self, lineage: str) -> RuntimeState:
        """The same state on ``lineage``, a branch of this one's lineage with
        the same prefix (a fork): checkpoints that cropped the old lineage
        crop the branch."""
        return attrs.evolve(self, checkpoints=self.checkpoints.relabeled(self.lineage, lineage), lineage=lineage)

    def at_checkpoint(self, checkpoint: Checkpoint, lineage: str) -> RuntimeState:
        """``Restore(c*)`` (Algorithm 1 line 5): the state at the checkpoint's
        boundary on ``lineage``, which holds the checkpoint's prefix. The
        transition count and the forgotten sources carry on."""
        # Checkpoints on the restored lineage now name the new one, whose
        # prefix is the same; the original lineage then belongs to the old
        # state alone.
        checkpoints = self.checkpoints.truncated(checkpoint.boundary).relabeled(checkpoint.lineage, lineage)
        return attrs.evolve(self, graph=self.graph.truncated(checkpoint.boundary), checkpoints=checkpoints,
                            steps=self.steps[:checkpoint.boundary], t=checkpoint.boundary, lineage=lineage,
                            context=checkpoint.context, memory=checkpoint.memory, plans=checkpoint.plans)

    def with_block(self, block: RuntimeBlock, extend_context: bool = False) -> RuntimeState:
        """This state with ``block`` recorded in the graph and, with
        ``extend_context``, at the end of the context."""
        context = (*self.context, block.id) if extend_context else self.context
        return attrs.evolve(self, graph=self.graph.with_block(block), context=context)

    def on_live_lineage(self, lineage: str, live_offset: int) -> RuntimeState:
        """This state (reopened from its record) on ``lineage``, which holds its
        context's ``live_offset`` tokens: checkpoints on that prefix crop it
        instead of rebuilding from their manifest."""
        checkpoints = self.checkpoints
        for c in self.checkpoints.all():
            if c.context == self.context[:len(c.context)] and c.token_offset <= live_offset:
                checkpoints = checkpoints.with_checkpoint(attrs.evolve(c, lineage=lineage))
        return attrs.evolve(self, lineage=lineage, checkpoints=checkpoints)

    def with_excised(self, cuts: Mapping[str, tuple[int, int, str]]) -> RuntimeState:
        """This state with ``[a, z)`` of each named context block's own tokens
        and its cut text (the third field) removed from the block's record;
        later blocks' spans shift down (the cache was cut the same way)."""
        offset, graph = 0, self.graph
        for block_id in self.context:
            block = graph[block_id]
            tokens, text, chunks = block.tokens, block.text, block.chunks
            if block_id in cuts:
                a, z, item = cuts[block_id]
                tokens, text, chunks = tokens[:a] + tokens[z:], text.replace(item, "", 1), ()
            graph = graph.with_replaced(attrs.evolve(block, tokens=tuple(tokens), text=text,
                                                     token_span=(offset, offset + len(tokens)), chunks=chunks))
            offset += len(tokens)
        return attrs.evolve(self, graph=graph)

    def get_record(self) -> dict:
        """The state as plain data, as the session record holds it (no
        lineage: a reopened session rebuilds its caches from the blocks)."""
        return {"t": self.t, "transitions": self.transitions,
                "steps": [{"id": s.id, "kind": s.kind, "tool": s.tool,
                           "items": [{"source": i.source, "text": i.text} for i in s.items]} for s in self.steps],
                "blocks": [b.get_record() for b in self.graph.blocks()],
                "checkpoints": [c.get_record() for c in self.checkpoints.all()],
                "context": list(self.context), "memory": list(self.memory), "plans": list(self.plans),
                "forgotten": list(self.forgotten)}

    @classmethod
    def from_record(cls, record: dict, policy: str) -> RuntimeState:
        """The inverse of :meth:`get_record`, without a lineage. A recorded
        checkpoint's cache handle named a cache of the process that wrote it:
        it becomes a stored handle (:func:`compute_stored_handle`), which names no cache here."""
        graph = ArtifactGraph(RuntimeBlock.from_record(block) for block in record["blocks"])
        checkpoints = CheckpointStore(policy, (
            Checkpoint(c["boundary"], compute_stored_handle(c["lineage"]), c["token_offset"], tuple(c["context"]),
                       tuple(c["memory"]), tuple(c["plans"]), c.get("env_snapshot"))
            for c in record["checkpoints"]))
        steps = [Step(s["id"], s["kind"], tuple(Item(i["source"], i["text"]) for i in s["items"]), s["tool"])
                 for s in record["steps"]]
        return cls(graph, checkpoints, steps, record["t"], NO_LINEAGE, record["context"], record["memory"], record["plans"],
                   record["transitions"], record["forgotten"])


__all__ = ["RuntimeState"]
