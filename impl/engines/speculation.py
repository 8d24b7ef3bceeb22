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

import math

import attrs

#: Proposals a turn may risk before its drafts have saved anything: the opening
#: credit is this many times ``per_token``. Chosen on the per-turn records of 40
#: evaluation episodes (docs/bench.md, "Drafts on real episodes"): 2 left the
#: forget cheapest of 1 to 4 (the first forward feeds the decided token and two
#: of the old turn's tokens after it).
OPENING_PROPOSALS = 2


@attrs.frozen
class DraftPolicy:
    """How a turn sizes its forwards: ``per_token``, what one more token in a
    forward costs in decode steps (the engine's measurement, with where it came
    from in ``source``), and ``opening``, the decode steps a turn may lose before
    its proposals have saved any."""

    per_token: float
    opening: float
    source: str = ""

    @classmethod
    def from_cost(cls, per_token: float, source: str = "",
                  proposals: int = OPENING_PROPOSALS) -> DraftPolicy:
        """The policy whose opening risks ``proposals`` proposals at ``per_token``."""
        return cls(per_token, proposals * per_token, source)

    def to_json(self) -> dict:
        return {"per_token": self.per_token, "opening": self.opening, "source": self.source}


def compute_proposals(policy: DraftPolicy | None, credit: float, available: int) -> int:
    """How many of ``available`` proposals the next forward feeds: as many as
    the turn's ``credit`` can lose (all of them without a policy: one forward
    over everything, the behaviour of a direct ``generate`` call)."""
    if policy is None or policy.per_token <= 0:
        return max(available, 0)
    # the small epsilon keeps a credit of exactly k * r from rounding down to k - 1
    return max(0, min(available, math.floor(credit / policy.per_token + 1e-9)))


def compute_credit(policy: DraftPolicy | None, credit: float, fed: int, accepted: int) -> float:
    """The turn's credit after a forward fed ``fed`` proposals and the rule
    agreed with the first ``accepted`` of them: each agreeing one saved a
    decode step, each fed one cost ``per_token``."""
    if policy is None:
        return credit
    return credit + accepted - policy.per_token * fed


__all__ = ["OPENING_PROPOSALS", "DraftPolicy", "compute_credit", "compute_proposals"]
