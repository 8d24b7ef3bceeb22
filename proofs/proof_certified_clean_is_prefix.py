"""``certified_clean_is_prefix``: Lemma 2 (ii) (certifiable boundary) of the paper.

In the conservative provenance graph, where each transition reads the full
state, the artifacts not reachable from z are exactly the prefix output:

    A \\ I(z) = {a : turn(a) < tau}.

The model, for a session with turns ``0..MAX_TURN``:

- each artifact has a turn and is either the observation ``o_t`` of its turn
  (at most one per turn, none at turn 0: ``R_0`` is ``R_init``) or derived,
  i.e. produced by the transition ``F`` at its turn;
- z's source artifact is the observation of turn ``tau >= 1``;
- *conservative* (lower bound on the edges): an artifact of turn ``t`` has an
  edge from every artifact of every turn ``< t`` (transition ``t`` reads the
  full state ``R_{t-1}``; an observation answers what the agent did before,
  e.g. a tool return answers a tool call), and a derived artifact of turn
  ``t`` also has an edge from that turn's observation (``F`` reads ``o_t``);
- *causal* (upper bound): no edge goes back in time, and nothing of turn
  ``t`` flows into that turn's observation.

Any edge set between the two bounds is allowed (derived artifacts of a turn
may or may not feed each other). The check covers every such graph with at
most ``N_NODES`` artifacts, every turn assignment and every ``tau``
(smaller graphs by padding, see ``N_NODES``).

Why the same-turn edge from the observation: with edges from earlier turns
only, the reply produced at turn ``tau`` would not be reachable from z, which
sits at the same turn, and would wrongly look clean; the false variants below
include exactly that model, and z3 must refute it.

This is a bounded check: the graph family is finite, so no induction is
involved; the bound is stated in ``N_NODES`` and ``MAX_TURN``.
"""

from __future__ import annotations

import z3

from unsee.proofs._graphs import closure, edge_matrix
from unsee.proofs._z3util import prove, refute

STATEMENT = "certified_clean_is_prefix"

# Bounds of the check: graphs of N_NODES artifacts, turns 0..MAX_TURN. Smaller
# graphs are covered too: pad them with derived turn-0 artifacts, which never
# lie on a path from z (tau >= 1 and edges never go back in time).
N_NODES = 8
MAX_TURN = 6


def _session(same_turn_observation_edges: bool = True, conservative: bool = True):
    """Hypotheses of the model, the influence set, the turns and tau."""
    n = N_NODES
    turn = [z3.Int(f"turn_{i}") for i in range(n)]
    is_obs = [z3.Bool(f"obs_{i}") for i in range(n)]
    source, tau = z3.Ints("source tau")
    edges = edge_matrix("E", n)

    hypotheses = [1 <= tau, tau <= MAX_TURN, 0 <= source, source < n]
    hypotheses += [z3.And(0 <= turn[i], turn[i] <= MAX_TURN) for i in range(n)]
    hypotheses += [z3.Implies(is_obs[i], turn[i] >= 1) for i in range(n)]
    # One observation per turn.
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    hypotheses += [z3.Implies(z3.And(is_obs[i], is_obs[j]), turn[i] != turn[j]) for i, j in pairs]
    # z's source artifact is the observation of turn tau.
    hypotheses += [z3.Implies(source == i, z3.And(is_obs[i], turn[i] == tau)) for i in range(n)]

    for i in range(n):
        for j in range(n):
            earlier = turn[i] < turn[j]
            reads_own_obs = z3.And(turn[i] == turn[j], is_obs[i], z3.Not(is_obs[j]))
            lower = z3.Or(earlier, reads_own_obs) if same_turn_observation_edges else earlier
            upper = z3.Or(earlier, z3.And(turn[i] == turn[j], z3.Not(is_obs[j])))
            if conservative:
                hypotheses.append(z3.Implies(lower, edges[i][j]))
            hypotheses.append(z3.Implies(edges[i][j], upper))

    influence = closure(edges, [source == i for i in range(n)])
    return hypotheses, influence, turn, tau


def _clean_is(influence, turn, boundary) -> z3.BoolRef:
    """The certified-clean set ``A \\ I(z)`` equals ``{a : boundary(turn(a))}``."""
    return z3.And([z3.Not(hit) == boundary(t) for hit, t in zip(influence, turn, strict=True)])


BOUND = f"<= {N_NODES} artifacts, turns 0..{MAX_TURN}, 1 <= tau <= {MAX_TURN}"


def test_certified_clean_is_prefix_bounded():
    """certified_clean_is_prefix: in the conservative graph, A \\ I(z) = {a : turn(a) < tau}."""
    hypotheses, influence, turn, tau = _session()
    claim = _clean_is(influence, turn, lambda t: t < tau)
    prove(STATEMENT, "bounded, conservative graphs", hypotheses, claim, bound=BOUND)


def test_certified_clean_is_prefix_false_variant_turn_le_tau_is_refuted():
    """certified_clean_is_prefix must NOT include turn tau: z's own source artifact is at turn tau."""
    hypotheses, influence, turn, tau = _session()
    claim = _clean_is(influence, turn, lambda t: t <= tau)
    refute(STATEMENT, "false variant: clean = turn <= tau", hypotheses, claim, bound=BOUND)


def test_certified_clean_is_prefix_false_variant_without_conservative_edges_is_refuted():
    """certified_clean_is_prefix relies on the conservative graph: with sparser (attributed) edges more is clean."""
    hypotheses, influence, turn, tau = _session(conservative=False)
    claim = _clean_is(influence, turn, lambda t: t < tau)
    refute(STATEMENT, "false variant: edges only causal, not conservative", hypotheses, claim, bound=BOUND)


def test_certified_clean_is_prefix_false_variant_no_same_turn_read_is_refuted():
    """certified_clean_is_prefix needs F to read o_t: with earlier-turn edges only, a turn-tau reply looks clean."""
    hypotheses, influence, turn, tau = _session(same_turn_observation_edges=False)
    claim = _clean_is(influence, turn, lambda t: t < tau)
    refute(STATEMENT, "false variant: no edge from o_t to turn-t output", hypotheses, claim, bound=BOUND)
