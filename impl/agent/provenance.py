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

from collections.abc import Iterable

import attrs

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
            out.append(list(self.tokens[start:start + n]))
            start += n
        return out


class UnknownSourceError(KeyError):
    """A forget request named a source id the session never observed."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the sentence
        return str(self.args[0])


class ArtifactGraph:
    """An append-only provenance graph with a child index for closures."""

    def __init__(self) -> None:
        self._blocks: dict[str, RuntimeBlock] = {}
        self._children: dict[str, list[str]] = {}

    def __contains__(self, block_id: str) -> bool:
        return block_id in self._blocks

    def __getitem__(self, block_id: str) -> RuntimeBlock:
        return self._blocks[block_id]

    def __len__(self) -> int:
        return len(self._blocks)

    def blocks(self) -> list[RuntimeBlock]:
        return list(self._blocks.values())

    def add(self, block: RuntimeBlock) -> RuntimeBlock:
        if block.id in self._blocks:
            raise ValueError(f"block id {block.id!r} already recorded")
        missing = [p for p in block.parents if p not in self._blocks]
        if missing:
            raise ValueError(f"block {block.id!r} names unknown parents {missing}")
        self._blocks[block.id] = block
        for parent in block.parents:
            self._children.setdefault(parent, []).append(block.id)
        return block

    def replace(self, block: RuntimeBlock) -> None:
        """Update a block's metadata in place (e.g. marking a call committed);
        its parents must not change, since edges are append-only."""
        old = self._blocks[block.id]
        if old.parents != block.parents:
            raise ValueError(f"block {block.id!r}: parents are immutable")
        self._blocks[block.id] = block

    def copy(self) -> ArtifactGraph:
        other = ArtifactGraph()
        other._blocks = dict(self._blocks)
        other._children = {k: list(v) for k, v in self._children.items()}
        return other

    def truncate(self, turn: int) -> None:
        """Drop every block produced after ``turn`` (the invalidated suffix)."""
        kept = [b for b in self._blocks.values() if b.turn <= turn]
        self._blocks, self._children = {}, {}
        for block in kept:
            self.add(block)

    # --- Algorithm 1, lines 1-3 ---------------------------------------------

    def locate_source(self, source_id: str) -> list[RuntimeBlock]:
        """``LocateSource``: blocks where ``source_id`` entered (they carry it,
        none of their parents does)."""
        carriers = {b.id for b in self._blocks.values() if source_id in b.source_ids}
        found = [b for b in self._blocks.values()
                 if b.id in carriers and not any(p in carriers for p in b.parents)]
        if not found:
            raise UnknownSourceError(f"unknown source id {source_id!r}: no block of this session carries it")
        return found

    def first_entry(self, source_id: str) -> int:
        """``FirstEntry``: the injection step ``tau``."""
        return min(b.turn for b in self.locate_source(source_id))

    def taint_closure(self, source_id: str) -> list[str]:
        """``TaintClosure``: every block reachable from the source blocks."""
        seen = {b.id for b in self.locate_source(source_id)}
        frontier = list(seen)
        while frontier:
            for child in self._children.get(frontier.pop(), ()):
                if child not in seen:
                    seen.add(child)
                    frontier.append(child)
        return [b for b in self._blocks if b in seen]  # creation order

    def to_spec(self, blocks: Iterable[str] | None = None) -> ProvenanceGraph:
        """Lift into the spec's graph, for differential checks."""
        ids = list(self._blocks) if blocks is None else list(blocks)
        return ProvenanceGraph(tuple(
            Artifact(b.id, b.type, b.parents, b.source_ids, b.token_span, b.turn, b.committed)
            for b in (self._blocks[i] for i in ids)))
