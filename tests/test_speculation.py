"""The draft policy's arithmetic (impl/engines/speculation.py) and the llama.cpp engine's
measured per-token cost (impl/engines/llamacpp/cost.py). That the policy changes no token,
and that a turn's forwards cost at most its opening more than decoding it, is
``properties/prop_llamacpp.py::test_draft_policy_changes_no_token``."""

from __future__ import annotations

import pytest

from unsee.impl.engines.llamacpp.cost import compute_per_token
from unsee.impl.engines.speculation import OPENING_PROPOSALS, DraftPolicy, compute_credit, compute_proposals


def test_the_opening_risks_its_proposals():
    policy = DraftPolicy.from_cost(0.45, "measured")
    assert policy.opening == pytest.approx(OPENING_PROPOSALS * 0.45)
    assert compute_proposals(policy, policy.opening, 50) == OPENING_PROPOSALS
    assert policy.to_json() == {"per_token": 0.45, "opening": policy.opening, "source": "measured"}


@pytest.mark.parametrize(("credit", "available", "expected"), [(0.0, 9, 0), (0.44, 9, 0), (0.45, 9, 1),
                                                               (0.9, 9, 2), (10.0, 3, 3), (10.0, 0, 0)])
def test_a_forward_risks_no_more_than_the_credit(credit, available, expected):
    assert compute_proposals(DraftPolicy(0.45, 0.9), credit, available) == expected


def test_without_a_policy_a_forward_feeds_all_it_can():
    assert compute_proposals(None, 0.0, 17) == 17
    assert compute_credit(None, 1.0, 17, 0) == 1.0


def test_credit_grows_by_what_agreeing_proposals_save_and_never_goes_below_zero():
    policy = DraftPolicy.from_cost(0.5)  # opening 1.0: two proposals
    credit, schedule = policy.opening, []
    for _ in range(4):  # a draft that always agrees: each forward about 1 / r times the last
        fed = compute_proposals(policy, credit, 100)
        schedule.append(fed)
        credit = compute_credit(policy, credit, fed, fed)
    assert schedule == [2, 4, 8, 16]
    for accepted in range(3):  # whatever the outcome, what is left stays >= 0
        assert compute_credit(policy, 1.0, compute_proposals(policy, 1.0, 9), accepted) >= 0


@pytest.mark.parametrize(("step", "sizes", "expected"), [
    (0.19, {2: 0.28, 4: 0.48, 8: 0.78}, 0.5),  # Qwen2.5-Coder-1.5B Q4_K_M, one thread: ratios 0.47, 0.51, 0.44
    (1.0, {2: 1.0, 4: 1.0}, 0.05),  # nothing measurable: the floor
    (1.0, {2: 3.5, 4: 8.0}, 1.0),  # dearer than decoding: capped at a decode step a token
    (1.0, {2: 1.4, 4: 2.2, 8: 3.8}, 0.4),  # a median of exactly 0.4 is not rounded up
])
def test_per_token_is_the_median_ratio_rounded_up_to_a_twentieth(step, sizes, expected):
    assert compute_per_token(step, sizes) == pytest.approx(expected)
