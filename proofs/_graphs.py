"""Bounded provenance graphs for the proofs of Lemma 2.

A graph over ``n`` artifacts ``0..n-1`` is a matrix of Bool edge variables;
the influence set of ``z`` is its reflexive reachability closure, written as
a ``n - 1``-step unrolling: a shortest path visits at most ``n`` artifacts,
so after ``n - 1`` steps the unrolling is the fixpoint (the proofs check
this rather than assume it, see :func:`reach_steps`).
"""

from __future__ import annotations

import z3


def edge_matrix(name: str, n: int) -> list[list[z3.BoolRef]]:
    """Free edge variables ``e[i][j]`` for the edge ``i -> j``."""
    return [[z3.Bool(f"{name}_{i}_{j}") for j in range(n)] for i in range(n)]


def reach_steps(edges: list[list[z3.BoolRef]], seed: list[z3.BoolRef], steps: int) -> list[list[z3.BoolRef]]:
    """``layers[k][j]``: artifact ``j`` is reachable from the seed in at most ``k`` edges."""
    n = len(seed)
    layers = [seed]
    for _ in range(steps):
        prev = layers[-1]
        layers.append([z3.Or(prev[j], *[z3.And(prev[i], edges[i][j]) for i in range(n)]) for j in range(n)])
    return layers


def closure(edges: list[list[z3.BoolRef]], seed: list[z3.BoolRef]) -> list[z3.BoolRef]:
    """Reflexive reachability closure of the seed: ``n - 1`` steps of :func:`reach_steps`."""
    return reach_steps(edges, seed, len(seed) - 1)[-1]


def same_set(xs: list[z3.BoolRef], ys: list[z3.BoolRef]) -> z3.BoolRef:
    return z3.And([x == y for x, y in zip(xs, ys, strict=True)])


def subset(xs: list[z3.BoolRef], ys: list[z3.BoolRef]) -> z3.BoolRef:
    return z3.And([z3.Implies(x, y) for x, y in zip(xs, ys, strict=True)])
