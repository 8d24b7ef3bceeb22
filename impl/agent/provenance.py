"""Runtime blocks and the artifact graph (paper, Section 3.4 (a)).

Every block the runtime places in context, generates, or stores carries the
paper's provenance tuple ``(id, type, parents, source_ids, token_span, turn,
committed)``. The graph answers Algorithm 1's lines 1-3: ``LocateSource``,
``FirstEntry`` and ``TaintClosure``. It is deliberately conservative: a
generated block's parents are every block resident in context when it was
generated, so it inherits all their source ids (no token-level attribution,
Lemma 2 (ii)).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs

from unsee.impl.engines.protocol import Determinism
from unsee.spec import Artifact, ProvenanceGraph

#: block types that the model wrote (the paper's derived artifacts)
DERIVED_TYPES = ("answer", "summary", "plan", "memory_write")


@attrs.frozen
class RuntimeBlock:
    """One block of runtime state with its provenance tuple and its tokens."""

    id: str
    type: str
    text: str
    tokens: tuple[int, ...]
    parents: tuple[str, ...] = ()
    source_ids: frozenset[str] = frozenset()
    token_span: tuple[int, int] = (0, 0)  # [start, end) in its lineage's cache
    turn: int = 0
    committed: bool = False
    #: lengths of the prefill chunks the tokens were committed in (empty: one
    #: chunk). Replaying the same chunks rebuilds the block's KV bitwise.
    chunks: tuple[int, ...] = ()

    def get_record(self) -> dict:
        """The block as plain data (digests, persistence, reports)."""
        return {"id": self.id, "type": self.type, "text": self.text, "tokens": list(self.tokens),
                "parents": list(self.parents), "source_ids": sorted(self.source_ids),
                "token_span": list(self.token_span), "turn": self.turn, "committed": self.committed,
                "chunks": list(self.chunks)}

    @classmethod
    def from_record(cls, record: dict) -> RuntimeBlock:
        return cls(record["id"], record["type"], record["text"], tuple(record["tokens"]), tuple(record["parents"]),
                   frozenset(record["source_ids"]), tuple(record["token_span"]), record["turn"],
                   record["committed"], tuple(record.get("chunks", ())))

    def get_chunks(self) -> list[list[int]]:
        """The token ids split into the chunks they were prefilled in."""
        if not self.chunks:
            return [list(self.tokens)] if self.tokens else []
        out, start = [], 0
        for n in self.chunks:
            if n:  # an empty header (Mistral's templates) was no prefill
                out.append(list(self.tokens[start:start + n]))
            start += n
        return out


def _check_new(block: RuntimeBlock, index: Mapping[str, int]) -> None:
    """``block`` may be appended to a graph whose ids are ``index``."""
    if block.id in index:
        raise ValueError(f"block id {block.id!r} already recorded")
    missing = [p for p in block.parents if p not in index]
    if missing:
        raise ValueError(f"block {block.id!r} names unknown parents {missing}")


class UnknownSourceError(KeyError):
    """A forget request named a source id the session never observed."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the sentence
        return str(self.args[0])


@attrs.frozen
class ArtifactGraph:
    """An append-only provenance graph, as a value. ``ArtifactGraph(blocks)``
    takes the blocks in creation order (each one's parents before it);
    :meth:`with_block`,
    :meth:`with_replaced` and :meth:`truncated` return a new graph and leave
    this one as it was. The blocks (themselves frozen) are shared between
    versions; a change copies the tuple of references and the id index,
    O(blocks) pointer copies with no block copied. Two graphs are equal iff
    they hold equal blocks in the same order."""

    _blocks: tuple[RuntimeBlock, ...] = attrs.field(default=(), converter=tuple)
    #: block id -> position in ``_blocks``: derived (so not part of equality),
    #: built and checked from the blocks unless a change passes it on
    _index: Mapping[str, int] | None = attrs.field(default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self._index is None:
            index: dict[str, int] = {}
            for position, block in enumerate(self._blocks):
                _check_new(block, index)
                index[block.id] = position
            object.__setattr__(self, "_index", index)  # frozen: set once, at construction

    def __contains__(self, block_id: str) -> bool:
        return block_id in self._index

    def __getitem__(self, block_id: str) -> RuntimeBlock:
        return self._blocks[self._index[block_id]]

    def __len__(self) -> int:
        return len(self._blocks)

    def blocks(self) -> list[RuntimeBlock]:
        return list(self._blocks)

    def with_block(self, block: RuntimeBlock) -> ArtifactGraph:
        """This graph and ``block``, appended (its parents must be recorded)."""
        _check_new(block, self._index)
        return ArtifactGraph((*self._blocks, block), {**self._index, block.id: len(self._blocks)})

    def with_replaced(self, block: RuntimeBlock) -> ArtifactGraph:
        """This graph with a block's metadata updated (e.g. marked committed),
        in its place; its parents must not change, since edges are append-only."""
        position = self._index[block.id]
        if self._blocks[position].parents != block.parents:
            raise ValueError(f"block {block.id!r}: parents are immutable")
        blocks = self._blocks[:position] + (block,) + self._blocks[position + 1:]
        return ArtifactGraph(blocks, self._index)  # same ids, same positions: the index is shared

    def truncated(self, turn: int) -> ArtifactGraph:
        """This graph without the blocks produced after ``turn`` (the invalidated suffix)."""
        return ArtifactGraph(b for b in self._blocks if b.turn <= turn)

    # --- Algorithm 1, lines 1-3 ---------------------------------------------

    def locate_source(self, source_id: str) -> list[RuntimeBlock]:
        """``LocateSource``: blocks where ``source_id`` entered (they carry it,
        none of their parents does)."""
        carriers = {b.id for b in self._blocks if source_id in b.source_ids}
        found = [b for b in self._blocks
                 if b.id in carriers and not any(p in carriers for p in b.parents)]
        if not found:
            raise UnknownSourceError(f"unknown source id {source_id!r}: no block of this session carries it")
        return found

    def first_entry(self, source_id: str) -> int:
        """``FirstEntry``: the injection step ``tau``."""
        return min(b.turn for b in self.locate_source(source_id))

    def taint_closure(self, source_id: str) -> list[str]:
        """``TaintClosure``: every block reachable from the source blocks, in
        creation order. A block's parents precede it, so one pass in that
        order finds every descendant."""
        seen = {b.id for b in self.locate_source(source_id)}
        for block in self._blocks:
            if block.id not in seen and any(p in seen for p in block.parents):
                seen.add(block.id)
        return [b.id for b in self._blocks if b.id in seen]

    def to_spec(self, blocks: Iterable[str] | None = None) -> ProvenanceGraph:
        """Lift into the spec's graph, for differential checks."""
        chosen = self._blocks if blocks is None else tuple(self[i] for i in blocks)
        return ProvenanceGraph(tuple(
            Artifact(b.id, b.type, b.parents, b.source_ids, b.token_span, b.turn, b.committed) for b in chosen))


def get_turn_chunks(determinism: Determinism, header: Sequence[int], generated: Sequence[int]) -> tuple[int, ...]:
    """The chunks a rebuild prefills a model turn in, from what the engine
    guarantees (:attr:`Determinism.canonical_chunking`): where chunking
    matters, the header prefill and the canonical prefill of the turn
    (two chunks, as they were computed); on a chunk-invariant engine whose
    decode equals prefill, the whole turn as one chunk gives the same KV."""
    if determinism.canonical_chunking == "block":
        return (len(header) + len(generated),)
    return (len(header), len(generated))


#: the block types of a tool round: the model's call (an answer, or a plan), the outputs, the answer
ROUND_TYPES = ("answer", "plan", "tool")


def get_kept_round(context: Sequence[RuntimeBlock]) -> list[RuntimeBlock]:
    """The blocks a compaction keeps verbatim after its summary: the context's trailing run of
    model turns and tool outputs (the latest tool round: the call, its outputs, the answer),
    where it holds a tool output; none otherwise. A model that sees no answered tool round after
    a summary re-calls its tool about as often as it answers (docs/serve.md, "Long
    conversations"); ``context`` is the context before the compact step's own blocks."""
    start = len(context)
    while start and context[start - 1].type in ROUND_TYPES:
        start -= 1
    tail = list(context[start:])
    return tail if any(b.type == "tool" for b in tail) else []
