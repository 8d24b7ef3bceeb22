"""``influence_is_monotone``: Lemma 2 (i) (taint monotonicity) of the paper.

    I_t(z) subset of I_{t+1}(z),

where ``I_t(z) = {a in A_t : z ~> a in G_t}`` is the (reflexive) reachability
closure of ``z`` in the provenance graph ``G_t = (A_t, E_t)``, and execution
only appends: ``A_t subset A_{t+1}``, ``E_t subset E_{t+1}``.

Two proofs:

- *Unbounded*, over an uninterpreted sort of artifacts. Reachability is a
  least fixpoint, so ``I_t`` is characterised by: it contains ``z`` (when
  ``z in A_t``), it is closed under ``E_t``, and it is contained in every set
  with those two properties (fixpoint induction). The induction principle is
  a second-order schema; we add its one instance the proof needs, at the set
  ``I_{t+1}``, which is sound because every instance of a valid schema is
  valid. z3 then has to show that ``I_{t+1}`` contains ``z`` and is closed
  under ``E_t``, which is where ``E_t subset E_{t+1}`` is used. (z3's built-in
  ``TransitiveClosure`` answers ``unknown`` on this quantified goal, hence the
  explicit fixpoint characterisation.)
- *Bounded*, as a cross-check with genuine reachability: every pair of graphs
  on at most ``N_NODES`` artifacts (Bool edge variables, closure as an
  ``N_NODES - 1``-step unrolling).

False variant z3 must refute: the same claim when edges can disappear
(``E_{t+1}`` not a superset of ``E_t``, e.g. one edge deleted) -- the reason
local edits to the graph do not make the closure of the edited graph a sound
taint set for the original computation.
"""

from __future__ import annotations

import z3

from unsee.proofs._graphs import closure, edge_matrix, reach_steps, same_set, subset
from unsee.proofs._z3util import prove, refute

STATEMENT = "influence_is_monotone"

# Size bound of the bounded cross-check: all graph pairs G_t, G_{t+1} with up
# to this many artifacts (absent artifacts model smaller graphs).
N_NODES = 7


# --- unbounded: least-fixpoint characterisation --------------------------------


def _lfp_hypotheses(edges_grow: bool) -> tuple[list[z3.BoolRef], z3.BoolRef]:
    art = z3.DeclareSort("Artifact")
    A0, A1, I0, I1 = (z3.Function(n, art, z3.BoolSort()) for n in ("A_t", "A_t1", "I_t", "I_t1"))
    E0, E1 = (z3.Function(n, art, art, z3.BoolSort()) for n in ("E_t", "E_t1"))
    z = z3.Const("z", art)
    x, y = z3.Consts("x y", art)

    def closed(S, E):
        return z3.ForAll([x, y], z3.Implies(z3.And(S(x), E(x, y)), S(y)))

    def contains_seed(S, A):
        return z3.Implies(A(z), S(z))

    hypotheses = [
        # G_t and G_{t+1} are graphs: edges join recorded artifacts.
        z3.ForAll([x, y], z3.Implies(E0(x, y), z3.And(A0(x), A0(y)))),
        z3.ForAll([x, y], z3.Implies(E1(x, y), z3.And(A1(x), A1(y)))),
        # Execution appends artifacts.
        z3.ForAll([x], z3.Implies(A0(x), A1(x))),
        # I_{t+1} is a pre-fixpoint of reachability in G_{t+1}.
        contains_seed(I1, A1),
        closed(I1, E1),
        # I_t is the least pre-fixpoint in G_t: the induction schema at P = I_{t+1}.
        z3.Implies(z3.And(contains_seed(I1, A0), closed(I1, E0)), z3.ForAll([x], z3.Implies(I0(x), I1(x)))),
    ]
    if edges_grow:
        hypotheses.append(z3.ForAll([x, y], z3.Implies(E0(x, y), E1(x, y))))
    return hypotheses, z3.ForAll([x], z3.Implies(I0(x), I1(x)))


def test_influence_is_monotone_unbounded():
    """influence_is_monotone: A_t, E_t only grow => I_t(z) subset of I_{t+1}(z), any graph size."""
    hypotheses, claim = _lfp_hypotheses(edges_grow=True)
    prove(STATEMENT, "least-fixpoint induction, uninterpreted artifacts", hypotheses, claim, bound="unbounded")


def test_influence_is_monotone_unbounded_false_variant_is_refuted():
    """influence_is_monotone needs E_t subset E_{t+1}: drop it and the fixpoint argument breaks."""
    hypotheses, claim = _lfp_hypotheses(edges_grow=False)
    refute(STATEMENT, "false variant: least-fixpoint, edges may vanish", hypotheses, claim, bound="unbounded")


# --- bounded: explicit graphs ---------------------------------------------------


def _graph(name: str, n: int, z: z3.ArithRef):
    nodes = [z3.Bool(f"{name}_in_{i}") for i in range(n)]
    edges = edge_matrix(name, n)
    well_formed = [z3.Implies(edges[i][j], z3.And(nodes[i], nodes[j])) for i in range(n) for j in range(n)]
    seed = [z3.And(z == i, nodes[i]) for i in range(n)]
    return nodes, edges, seed, well_formed


def _bounded(n: int, delete_one_edge: bool) -> tuple[list[z3.BoolRef], z3.BoolRef]:
    z = z3.Int("z")
    nodes0, edges0, seed0, wf0 = _graph("G_t", n, z)
    nodes1, edges1, seed1, wf1 = _graph("G_t1", n, z)
    hypotheses = [0 <= z, z < n, *wf0, *wf1, subset(nodes0, nodes1)]
    pairs = [(i, j) for i in range(n) for j in range(n)]
    if delete_one_edge:
        # E_{t+1} = E_t minus the edge (u, v): a "local edit" of the graph.
        u, v = z3.Ints("u v")
        hypotheses += [0 <= u, u < n, 0 <= v, v < n]
        hypotheses += [edges1[i][j] == z3.And(edges0[i][j], z3.Not(z3.And(u == i, v == j))) for i, j in pairs]
    else:
        hypotheses += [z3.Implies(edges0[i][j], edges1[i][j]) for i, j in pairs]
    return hypotheses, subset(closure(edges0, seed0), closure(edges1, seed1))


def test_influence_is_monotone_bounded_unrolling_is_the_fixpoint():
    """influence_is_monotone encoding check: N_NODES - 1 steps already reach the reachability fixpoint."""
    z = z3.Int("z")
    _, edges, seed, well_formed = _graph("G", N_NODES, z)
    layers = reach_steps(edges, seed, N_NODES)
    hypotheses = [*well_formed, 0 <= z, z < N_NODES]
    claim = same_set(layers[-2], layers[-1])
    prove(STATEMENT, "encoding: n - 1 steps are the fixpoint", hypotheses, claim, bound=f"n = {N_NODES} artifacts")


def test_influence_is_monotone_bounded():
    """influence_is_monotone, cross-check: every pair of graphs with <= N_NODES artifacts, E_t subset E_{t+1}."""
    hypotheses, claim = _bounded(N_NODES, delete_one_edge=False)
    prove(STATEMENT, "bounded, explicit graphs", hypotheses, claim, bound=f"<= {N_NODES} artifacts")


def test_influence_is_monotone_bounded_false_variant_is_refuted():
    """influence_is_monotone fails once an edge is deleted (E_{t+1} not a superset of E_t)."""
    hypotheses, claim = _bounded(N_NODES, delete_one_edge=True)
    refute(STATEMENT, "false variant: one edge deleted", hypotheses, claim, bound=f"<= {N_NODES} artifacts")
