"""The llama.cpp engine with drafts and its prefix cache, episode by episode (``llamacpp-tiny``).

=======================================  ====================================================
test                                     checks
=======================================  ====================================================
forget_with_drafts_equals_reset          forget with drafts, probes and guesses on (bound 0,
                                         measured at load: decode == prefill) == full reset:
                                         digest and every token, greedy and seeded sampling;
                                         the report says where the bound came from
replay_with_drafts_equals_without        replay with drafts == replay re-decoding every turn,
                                         decoding no more
generate_with_drafts_changes_no_token    one turn with no draft, a draft wrong from some
                                         position, or wrong throughout; probe and lookup on
                                         or off: the reference's tokens and KV
draft_policy_changes_no_token            the same under any draft policy (any per-token
                                         cost, any opening, or none): the reference's tokens
                                         and KV, and with a policy the turn's forwards cost at
                                         most its opening more than decoding it (credit rule)
reset_prefix_cache_equals_reset          B5' served by the engine's prefix cache == B5, with
                                         any KV budget (as prop_engine.py on ``tiny``)
forget_on_two_slots_equals_one_slot      on a context of two slots (impl/engines/llamacpp/
                                         rows.py: a run's lineages parked and reloaded
                                         between them), forget with drafts == full reset ==
                                         the one-slot engine's forget: digest and tokens
=======================================  ====================================================

Skipped where llama-cpp-python is not installed. Under ``ci`` 30, 20, 60, 120, 20
and 20 examples; ``nightly`` runs 1,000 of the first.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from unsee.impl.conform.episodes import episodes, scaled
from unsee.impl.engines.protocol import Assist
from unsee.impl.engines.speculation import DraftPolicy
from unsee.properties.differential import (
    check_agreement,
    compare_forget_with_reset,
    compare_prefix_cache_reset_with_reset,
    compare_replay_with_and_without_drafts,
    describe_episode,
    engine_scope,
)
from unsee.properties.engines import llamacpp_available, make_engine

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not llamacpp_available(), reason="llama-cpp-python is not installed")]

NAME = "llamacpp-tiny"

#: Episodes with enough model work after the target for drafts to matter.
drafted_episodes = functools.partial(episodes, min_steps=2, max_steps=6, max_new_tokens=(2, 8))


@functools.cache
def get_engine(slots: int = 1):
    return make_engine(NAME, **({"slots": slots} if slots > 1 else {}))


@given(episode=drafted_episodes())
@scaled(2)
def test_forget_with_drafts_equals_reset(episode):
    engine = get_engine()
    assert engine.draft_bound == 0.0
    with engine_scope(engine):
        report = compare_forget_with_reset(engine, episode, drafts=True)
    assert report.drafts.mode == "verify"
    assert "decode == prefill" in report.drafts.bound_source
    totals = report.drafts.totals or {}
    event(f"draft tokens accepted: {bool(totals.get('accepted'))}, fallbacks: {bool(totals.get('fallbacks'))}")


@given(episode=drafted_episodes())
@scaled(3)
def test_replay_with_drafts_equals_without(episode):
    engine = get_engine()
    with engine_scope(engine):
        compare_replay_with_and_without_drafts(engine, episode)


def run_generate(engine, context: list[int], n: int, **kw) -> tuple[str, list[int]]:
    handle = engine.new_lineage()
    engine.prefill(handle, context)
    assist = Assist(**{k: kw.pop(k) for k in ("draft", "probe", "lookup") if k in kw})
    out = engine.generate(handle, n, stop_ids=(), assist=assist, **kw)
    return engine.digest(handle), out


@given(context=st.builds(lambda s, k: s * k, st.lists(st.integers(0, 255), min_size=1, max_size=12),
                         st.integers(1, 3)),
       max_new_tokens=st.integers(1, 40), draft_kind=st.sampled_from(("none", "right_then_wrong", "wrong")),
       at=st.integers(1, 12), temperature=st.sampled_from((0.0, 0.7)), seed=st.integers(0, 99),
       probe=st.booleans(), lookup=st.booleans())
@scaled(1)
def test_generate_with_drafts_changes_no_token(context, max_new_tokens, draft_kind, at, temperature, seed, probe,
                                               lookup):
    engine = get_engine()
    kw = {"temperature": temperature, "seed": seed}
    with engine_scope(engine):
        digest, expected = run_generate(engine, context, max_new_tokens, **kw)
        start = 0 if draft_kind == "wrong" else min(at, len(expected))
        draft = None if draft_kind == "none" else expected[:start] + [(t + 1) % 256 for t in expected[start:]]
        if draft is None and not lookup:
            return
        before = engine.counters.snapshot()
        got_digest, got = run_generate(engine, context, max_new_tokens, draft=draft,
                                       probe=probe and draft is not None, lookup=lookup, **kw)
        spent = engine.counters - before
        assert (got, got_digest) == (expected, digest), (context, draft, probe, lookup)
        event(f"accepted: {spent.draft_accepted_tokens + spent.lookup_accepted_tokens > 0}, "
              f"fallback: {spent.draft_fallbacks > 0}")


def get_model_cost(sizes: list[int], policy: DraftPolicy) -> float:
    """What the forwards of ``sizes`` cost in decode steps under the policy's cost model."""
    return sum(1 + policy.per_token * (n - 1) for n in sizes)


@given(context=st.lists(st.integers(0, 255), min_size=1, max_size=30),
       max_new_tokens=st.integers(1, 40), draft_kind=st.sampled_from(("none", "right", "longer", "right_then_wrong",
                                                                      "wrong")),
       at=st.integers(1, 40), temperature=st.sampled_from((0.0, 0.7)), seed=st.integers(0, 99),
       probe=st.booleans(), lookup=st.booleans(),
       policy=st.one_of(st.none(), st.builds(DraftPolicy.from_cost, st.floats(0.05, 1.0), st.just(""),
                                             st.integers(0, 6))))
# a one-token turn: no forward of its own, its token left pending by the commit
@example(context=[0], max_new_tokens=1, draft_kind="none", at=1, temperature=0.0, seed=0, probe=False, lookup=True,
         policy=None)
@scaled(6)
def test_draft_policy_changes_no_token(context, max_new_tokens, draft_kind, at, temperature, seed, probe, lookup,
                                       policy):
    engine = get_engine()
    kw = {"temperature": temperature, "seed": seed}
    with engine_scope(engine):
        digest, expected = run_generate(engine, context, max_new_tokens, **kw)
        cut = {"none": 0, "right": len(expected), "longer": len(expected), "wrong": 0}.get(draft_kind, at)
        draft = None if draft_kind == "none" else expected[:cut] + [(t + 1) % 256 for t in expected[cut:]]
        draft = draft + [7, 7, 7] if draft_kind == "longer" else draft
        if draft is None and not lookup:
            return
        engine.draft_policy, sizes = policy, []
        handle = engine.new_lineage()
        engine.prefill(handle, context)
        engine.flush(handle)  # computed now, not inside the turn
        before = engine.counters.snapshot()
        with engine.hook_forwards(lambda n, _: sizes.append(n)):  # the turn's forwards alone
            got = engine.generate(handle, max_new_tokens, stop_ids=(), **kw,
                                  assist=Assist(draft, probe and draft is not None, lookup))
        spent, got_digest = engine.counters - before, engine.digest(handle)
    assert (got, got_digest) == (expected, digest), (context, draft, probe, lookup, policy)
    # longer: the canonical prefill only; a one-token turn makes no forward (its token is left pending)
    assert max(sizes, default=0) <= max(engine.lm.max_forward, len(expected))
    if policy is not None and not spent.draft_fallbacks:
        # decoding the turn: a forward per token but the last (left pending by the commit); the credit rule
        # lets the turn's proposals lose at most the opening (impl/engines/speculation.py)
        assert get_model_cost(sizes, policy) <= len(expected) + policy.opening + 1e-9, (sizes, policy)
    event(f"policy: {policy is not None}, fallback: {spent.draft_fallbacks > 0}, "
          f"kept: {spent.draft_accepted_tokens + spent.lookup_accepted_tokens > 0}")


@given(episode=episodes(), budget=st.one_of(st.none(), st.integers(0, 400_000)))
@scaled(3)
def test_reset_prefix_cache_equals_reset(episode, budget):
    engine = make_engine(NAME, kv_budget=budget)
    result = compare_prefix_cache_reset_with_reset(engine, episode)
    event("B5' reused tokens" if result.reused_tokens else "B5' reused nothing")


@given(episode=drafted_episodes())
@scaled(2)
def test_forget_on_two_slots_equals_one_slot(episode):
    engine, one = get_engine(slots=2), get_engine()
    assert engine.kv.slots == 2
    with engine_scope(engine):
        report = compare_forget_with_reset(engine, episode, drafts=True)
    with engine_scope(one):
        reference = compare_forget_with_reset(one, episode, drafts=True)
    check_agreement("forget on two slots vs on one", {"episode": describe_episode(episode)},
                    {"two slots": report.to_json(), "one slot": reference.to_json()},
                    [("digest", report.digest, reference.digest),
                     ("invocations", report.invocations, reference.invocations)])
