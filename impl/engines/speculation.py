"""The draft policy: how many proposed tokens a decoding turn feeds with the
token it has just decided, so that drafts and context guesses never cost a
turn more than they save (issue 42).

Where an engine's forwards of up to ``max_forward`` tokens give decoding's
own logits and KV bit for bit (llama.cpp: impl/engines/llamacpp/facts.py), a
turn can be decoded as a run of forwards of any sizes up to that cap: each
feeds the token just decided and ``p`` *proposals* after it (the old turn's
tokens while they agree, else a guess from the context), and reads the
decision after every token it fed. The proposals the decoding rule agrees
with are kept; the first it does not is decided on that very row, and the
rows after it are cropped. Which proposals are fed, and how many, changes no
decision: it only changes how many forwards the turn takes.

The cost model. A forward of ``1 + p`` tokens costs about ``1 + r p`` decode
steps (``r``: :attr:`DraftPolicy.per_token`, measured per engine). It decides
the ``j`` proposals the rule agrees with and the token after them, where
decoding would have taken ``j + 1`` one-token forwards: it saves ``j - r p``
decode steps, and loses ``r p`` when its first proposal is wrong.

The credit rule. Each turn starts with a *credit* of :attr:`DraftPolicy.opening`
decode steps; a forward risks no more than the credit left
(``p <= credit / r``, :func:`compute_proposals`), and its outcome is settled
against it (``credit + j - r p``, :func:`compute_credit`). The credit never
goes below zero, so a turn's proposals cost it at most the opening more than
decoding it would, and a draft that keeps agreeing earns longer forwards: the
credit grows by ``1 - r`` per agreeing proposal, so the next forward can be
about ``1 / r`` times as long. A draft wrong from its first proposal loses
``r`` times the opening's proposals once, and the turn decodes on. Exactness
does not depend on any of this (docs/drafts.md, "The draft policy").
"""

from __future__ import annotations

import itertools
import math
import statistics

import attrs

#: Proposals a turn may risk before its drafts have saved anything: the opening
#: credit is this many times ``per_token``. Chosen on the per-turn records of 40
#: evaluation episodes (docs/bench.md, "Drafts on real episodes"): 2 left the
#: forget cheapest of 1 to 4 (the first forward feeds the decided token and two
#: of the old turn's tokens after it).
OPENING_PROPOSALS = 2


#: Drafts are on by default only where an opening forward that holds saves at least what
#: one that fails at its first proposal loses: a forward of ``n`` tokens costing ``c(n)``
#: decode steps saves ``n - c(n)`` when all its proposals hold and loses ``c(n) - 1`` when
#: none does, and a replay's turns fail early about as often as they hold (of 159 turns
#: of 40 Qwen2.5-Coder-1.5B episodes, 47 held whole and 14 failed at their first token:
#: docs/bench.md). So the policy pays where, for some opening size, the loss over the
#: saving is at most this (issue 54: on a smaller Qwen2.5 file drafts under the linear
#: cost model lost in 12 of 12 episodes).
PAY_RATIO = 1.0
#: the forward sizes the opening may take (the decided token and 1 to 7 proposals): the
#: cheapest per token of them is the opening, since per-row kernels make a forward's
#: cost by size uneven (Gemma 3 270M here: 3 tokens 4.8 steps, 4 tokens 3.9, 8 tokens 5.3)
OPENING_SIZES = (2, 3, 4, 6, 8)


@attrs.frozen
class DraftPolicy:
    """How a turn sizes its forwards: ``per_token``, what one more token in a
    forward costs in decode steps (the engine's measurement, with where it came
    from in ``source``), and ``opening``, the decode steps a turn may lose before
    its proposals have saved any. ``costs``, where measured: a forward's cost
    in decode steps by its size, ((size, steps), ...) ascending (None: the line
    ``1 + per_token (n - 1)``). ``pays``: whether drafts can pay at all on the
    model (:meth:`from_costs`), and ``why`` in words."""

    per_token: float
    opening: float
    source: str = ""
    costs: tuple[tuple[int, float], ...] | None = attrs.field(
        default=None, converter=lambda c: None if c is None else tuple((int(n), float(v)) for n, v in c))
    pays: bool = True
    why: str = ""

    @classmethod
    def from_cost(cls, per_token: float, source: str = "",
                  proposals: int = OPENING_PROPOSALS) -> DraftPolicy:
        """The policy whose opening risks ``proposals`` proposals at ``per_token``."""
        return cls(per_token, proposals * per_token, source)

    @classmethod
    def from_costs(cls, costs: dict[int, float], source: str = "") -> DraftPolicy:
        """The policy of a measured cost table (``costs``: a forward's cost in decode steps by its
        size, 2 and up): ``per_token`` the median of ``(c(n) - 1) / (n - 1)``; the opening the
        risk ``c(n) - 1`` of the size of :data:`OPENING_SIZES` whose loss when it fails, over its
        saving when it holds, is lowest (:func:`get_loss_ratio`); drafts pay where that ratio is
        at most :data:`PAY_RATIO`."""
        table = tuple(sorted((int(n), float(c)) for n, c in costs.items() if n >= 2))
        if not table:
            raise ValueError(f"a draft policy needs the cost of forwards of 2 tokens or more, got {costs!r}")
        per_token = statistics.median((c - 1) / (n - 1) for n, c in table)
        probe = cls(max(round(per_token, 3), 0.0), 0.0, source, table)
        size = min(OPENING_SIZES, key=lambda n: (get_loss_ratio(probe.get_cost(n), n), n))
        cost = probe.get_cost(size)
        pays = get_loss_ratio(cost, size) <= PAY_RATIO
        why = (f"a forward of {size} tokens costs {cost:.2f} decode steps: it saves {size - cost:.2f} when its "
               f"proposals hold and loses {cost - 1:.2f} when they fail"
               + ("" if pays else f", a ratio above {PAY_RATIO:g} at every opening size of {list(OPENING_SIZES)}"))
        return attrs.evolve(probe, opening=cost - 1, pays=pays, why=why)

    def get_cost(self, n: int) -> float:
        """What a forward of ``n`` tokens costs, in decode steps: 1 for one; the measured table,
        linear between its sizes and along its last stretch beyond them; else the line."""
        if n <= 1:
            return float(max(n, 0))
        if not self.costs:
            return 1 + self.per_token * (n - 1)
        points = ((1, 1.0), *self.costs)
        for (a, ca), (b, cb) in itertools.pairwise(points):
            if n <= b:
                return ca + (cb - ca) * (n - a) / (b - a)
        (a, ca), (b, cb) = points[-2], points[-1]
        return cb + max((cb - ca) / (b - a), 0.0) * (n - b)

    def to_json(self) -> dict:
        out = {"per_token": self.per_token, "opening": self.opening, "source": self.source}
        if self.costs is not None:
            out.update(costs={str(n): round(c, 3) for n, c in self.costs}, pays=self.pays, why=self.why)
        return out


def get_loss_ratio(cost: float, n: int) -> float:
    """What a forward of ``n`` tokens costing ``cost`` decode steps loses when its proposals
    fail at the first (``cost - 1``) over what it saves when they all hold (``n - cost``);
    infinite where it saves nothing."""
    return (cost - 1) / (n - cost) if n > cost else math.inf


def compute_proposals(policy: DraftPolicy | None, credit: float, available: int) -> int:
    """How many of ``available`` proposals the next forward feeds: as many as
    the turn's ``credit`` can lose (all of them without a policy: one forward
    over everything, the behaviour of a direct ``generate`` call)."""
    if policy is None or policy.per_token <= 0:
        return max(available, 0)
    if policy.costs is None:
        # the small epsilon keeps a credit of exactly k * r from rounding down to k - 1
        return max(0, min(available, math.floor(credit / policy.per_token + 1e-9)))
    # a measured table need not rise evenly with the size: the largest that fits the credit
    return max((p for p in range(available + 1) if policy.get_cost(1 + p) - 1 <= credit + 1e-9), default=0)


def compute_credit(policy: DraftPolicy | None, credit: float, fed: int, accepted: int) -> float:
    """The turn's credit after a forward fed ``fed`` proposals and the rule
    agreed with the first ``accepted`` of them: each agreeing one saved a
    decode step, each fed one cost ``per_token``."""
    if policy is None:
        return credit
    return credit + accepted - (policy.get_cost(1 + fed) - 1)


__all__ = ["OPENING_PROPOSALS", "OPENING_SIZES", "PAY_RATIO", "DraftPolicy", "compute_credit", "compute_proposals", "get_loss_ratio"]
