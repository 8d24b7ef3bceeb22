"""Necessity of Theorem 1's assumptions A1-A3.

For each assumption the check that splice runs for it is switched off
(``unittest.mock.patch`` on the name as :mod:`unsee.spec.splice` looks it up,
returning True), and a search over the strategies then finds a case where
splice claims exactness yet misses the counterfactual state: the
splice_equals_counterfactual property fails. The same search with the check
left in place finds nothing. A pinned smallest counterexample per assumption
guards against a search that stops finding one.
"""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import find
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from unsee.properties.strategies import (
    BAD_SANITIZERS,
    HASH_CHAIN,
    UNSEEDED_SAMPLER,
    SpliceCase,
    bad_sanitizers,
    effectful_runs,
    get_initial_state,
    is_splice_counterexample,
    print_splice,
    search_settings,
    splice_cases,
    step_functions,
    unseeded_samplers,
)
from unsee.spec import CommittedEffect, Item, Observation, record_observations

#: Where splice looks up each assumption's check.
CHECKS = {
    "A1": "unsee.spec.splice.is_deterministic",
    "A2": "unsee.spec.splice.is_sanitized_counterfactual",
    "A3": "unsee.spec.splice.has_no_committed_effects_after",
}

#: The search space that violates each assumption (and only that one).
SEARCHES = {
    "A1": splice_cases(steps=unseeded_samplers()),
    "A2": splice_cases(steps=step_functions(), sanitizer_strategy=bad_sanitizers()),
    "A3": splice_cases(steps=step_functions(), run_strategy=effectful_runs()),
}

#: Smallest counterexamples, one per assumption.
PINNED = {
    # A1: one user turn; every call of the unseeded sampler draws fresh entropy.
    "A1": SpliceCase(UNSEEDED_SAMPLER, get_initial_state(UNSEEDED_SAMPLER),
                     record_observations((Observation("user", (Item("s0", ""),)),), (), ()), "s0", ()),
    # A2: the target shares its observation with a clean item; amputation drops both.
    "A2": SpliceCase(HASH_CHAIN, get_initial_state(HASH_CHAIN),
                     record_observations((Observation("user", (Item("s0", ""), Item("s1", ""))),), (), ()),
                     "s0", (), BAD_SANITIZERS[2]),
    # A3: a tool read of k0 at step 2, written by an effect committed at step 2;
    # the target comes first, so replay starts at 0 and re-reads the new value.
    "A3": SpliceCase(HASH_CHAIN, get_initial_state(HASH_CHAIN),
                     record_observations((Observation("user", (Item("s0", ""),)),
                                          Observation("tool", (Item("s1", "", "k0"),))),
                                         (), (CommittedEffect(2, "k0", "new!"),)),
                     "s0", ()),
}


def search_counterexample(assumption: str, multiple: float = 1.0) -> SpliceCase | None:
    """The smallest case in the assumption's search space that breaks
    splice_equals_counterfactual, or None when the search finds none."""
    try:
        return find(SEARCHES[assumption], is_splice_counterexample, settings=search_settings(multiple))
    except NoSuchExample:
        return None


@pytest.mark.parametrize("assumption", sorted(CHECKS))
def test_splice_equals_counterfactual_needs_assumption(assumption):
    """splice_equals_counterfactual (Theorem 1) needs each of A1, A2, A3: with
    splice's check for it patched to True, a counterexample exists (found by
    search, and the pinned one); with the check in place none is found."""
    with mock.patch(CHECKS[assumption], return_value=True):
        found = search_counterexample(assumption)
        assert found is not None, f"no counterexample for {assumption} without its check"
        print(f"\n{assumption} counterexample (check patched out):")
        print_splice(found)
        assert is_splice_counterexample(PINNED[assumption])
    assert search_counterexample(assumption) is None
    assert not is_splice_counterexample(PINNED[assumption])


@pytest.mark.parametrize(("patched", "violated"),
                         [(p, v) for p in sorted(CHECKS) for v in sorted(CHECKS) if p != v])
def test_splice_equals_counterfactual_checks_are_independent(patched, violated):
    """splice_equals_counterfactual (Theorem 1): with one assumption's check
    patched out, the others still stand guard: searching the space that
    violates a different assumption finds no counterexample."""
    with mock.patch(CHECKS[patched], return_value=True):
        assert search_counterexample(violated, 0.5) is None
        assert not is_splice_counterexample(PINNED[violated])


@pytest.mark.parametrize("sanitizer", BAD_SANITIZERS, ids=lambda s: s.name)
def test_splice_equals_counterfactual_needs_a2_for_each_bad_sanitizer(sanitizer):
    """splice_equals_counterfactual (Theorem 1) needs A2 against each bad
    sanitizer on its own: with is_sanitized_counterfactual patched to True the
    search finds a counterexample; with the check in place it finds none."""
    cases = splice_cases(steps=step_functions(), sanitizer_strategy=st.just(sanitizer))
    with mock.patch(CHECKS["A2"], return_value=True):
        found = find(cases, is_splice_counterexample, settings=search_settings())
        print(f"\nA2 counterexample for {sanitizer.name} (check patched out):")
        print_splice(found)
    with pytest.raises(NoSuchExample):
        find(cases, is_splice_counterexample, settings=search_settings(0.5))
