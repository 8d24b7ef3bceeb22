"""The provenance graph and the taint closure (paper, Lemma 2 and Section 3.4a).

Artifacts carry the paper's tuple ``(id, type, parents, source_ids,
token_span, turn, committed)``. Edges run parent -> child. The influence set
``I_t(z)`` is everything reachable from the artifacts that carry ``z``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from .transition import Observation


@attrs.frozen
class Artifact:
    """A node of the provenance graph: one block of runtime state."""

    id: str
    type: str
    parents: tuple[str, ...] = ()
    source_ids: frozenset[str] = frozenset()
    token_span: tuple[int, int] = (0, 0)
    turn: int = 0
    committed: bool = False


@attrs.frozen
class ProvenanceGraph:
    """``G_t = (A_t, E_t)``: artifacts in creation order; edges are the parents."""

    artifacts: tuple[Artifact, ...] = ()

    def get_ids(self) -> frozenset[str]:
        return frozenset(a.id for a in self.artifacts)

    def get(self, artifact_id: str) -> Artifact:
        for artifact in self.artifacts:
            if artifact.id == artifact_id:
                return artifact
        raise KeyError(f"no artifact {artifact_id!r} in the provenance graph")


def add_artifact(graph: ProvenanceGraph, artifact: Artifact) -> ProvenanceGraph:
    """Execution only appends (the premise of Lemma 2 (i)). Parents must exist."""
    known = graph.get_ids()
    if artifact.id in known:
        raise ValueError(f"artifact id {artifact.id!r} already in the graph")
    missing = [p for p in artifact.parents if p not in known]
    if missing:
        raise ValueError(f"artifact {artifact.id!r} names unknown parents {missing}")
    return ProvenanceGraph(graph.artifacts + (artifact,))


def get_prefix_graph(graph: ProvenanceGraph, turn: int) -> ProvenanceGraph:
    """``G_t``: the artifacts produced up to and including ``turn``."""
    return ProvenanceGraph(tuple(a for a in graph.artifacts if a.turn <= turn))


def locate_source(graph: ProvenanceGraph, target: str) -> tuple[Artifact, ...]:
    """Algorithm 1 line 1, ``LocateSource``: artifacts where ``z`` entered
    (they carry ``z`` but none of their parents does)."""
    carriers = {a.id for a in graph.artifacts if target in a.source_ids}
    return tuple(a for a in graph.artifacts
                 if a.id in carriers and not any(p in carriers for p in a.parents))


def first_entry_turn(graph: ProvenanceGraph, target: str) -> int:
    """Algorithm 1 line 2, ``FirstEntry``: the turn ``tau`` of the earliest source artifact."""
    sources = locate_source(graph, target)
    if not sources:
        raise ValueError(f"target {target!r} has no source artifact in the provenance graph")
    return min(a.turn for a in sources)


def get_reachable(graph: ProvenanceGraph, roots: Iterable[str]) -> frozenset[str]:
    """Reachability closure along parent -> child edges, roots included."""
    children: dict[str, list[str]] = {}
    for artifact in graph.artifacts:
        for parent in artifact.parents:
            children.setdefault(parent, []).append(artifact.id)
    seen = set(roots)
    frontier = list(seen)
    while frontier:
        node = frontier.pop()
        for child in children.get(node, ()):
            if child not in seen:
                seen.add(child)
                frontier.append(child)
    return frozenset(seen)


def get_influence_set(graph: ProvenanceGraph, target: str) -> frozenset[str]:
    """``I_t(z) = {a in A_t : z ~> a}`` (Lemma 2); Algorithm 1 line 3, ``TaintClosure``."""
    return get_reachable(graph, (a.id for a in locate_source(graph, target)))


def get_certified_clean_set(graph: ProvenanceGraph, target: str) -> frozenset[str]:
    """``A_t \\ I_t(z)``: the artifacts certifiably independent of ``z``."""
    return graph.get_ids() - get_influence_set(graph, target)


def build_conservative_graph(observations: Sequence[Observation]) -> ProvenanceGraph:
    """The conservative graph of Lemma 2 (ii): without per-token attribution,
    each transition reads the full state, so every artifact it produces has an
    edge from every artifact produced before it.

    Turn 0 holds the initial state; transition ``t`` produces one prompt block
    for ``o_t`` (carrying its items' source ids) and one model turn.
    """
    graph = ProvenanceGraph((Artifact("init", "system", turn=0),))
    for t, observation in enumerate(observations, start=1):
        earlier = tuple(a.id for a in graph.artifacts)
        inherited = frozenset().union(*(a.source_ids for a in graph.artifacts))
        block = Artifact(f"obs:{t}", observation.kind, earlier,
                         inherited | frozenset(observation.get_source_ids()), turn=t)
        graph = add_artifact(graph, block)
        graph = add_artifact(graph, Artifact(f"turn:{t}", "answer", earlier + (block.id,),
                                             block.source_ids, turn=t))
    return graph


def build_selective_graph(observations: Sequence[Observation], reads: Sequence[frozenset[int]]) -> ProvenanceGraph:
    """A graph *with* attribution: the model turn of transition ``t`` reads only
    the prompt blocks of the turns in ``reads[t-1]`` (plus its own block).

    This is what Lemma 2 (ii) excludes; with it the clean set can be larger
    than the prefix, which is why the lemma's boundary is about certifiability.
    """
    graph = ProvenanceGraph((Artifact("init", "system", turn=0),))
    for t, observation in enumerate(observations, start=1):
        block = Artifact(f"obs:{t}", observation.kind, ("init",),
                         frozenset(observation.get_source_ids()), turn=t)
        graph = add_artifact(graph, block)
        parents = tuple(f"obs:{s}" for s in sorted(reads[t - 1]) if 1 <= s < t) + (block.id,)
        sources = frozenset().union(*(graph.get(p).source_ids for p in parents))
        graph = add_artifact(graph, Artifact(f"turn:{t}", "answer", parents, sources, turn=t))
    return graph
