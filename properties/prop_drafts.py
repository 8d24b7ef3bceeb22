"""Verified draft replay (impl/agent/drafts.py) keeps forget exact.

======================================================  ===========================================================
test                                                    checks
======================================================  ===========================================================
splice_equals_counterfactual_with_drafts                forget with drafts == full reset (digest, every token id),
                                                        greedy and seeded sampling, tiny model
splice_equals_counterfactual_with_drafts_on_near_ties   the same on ``tiny-ties``, whose LM-head rows are near-tied,
                                                        so verification logits and decode logits disagree on
                                                        ~8% of decisions: the guard falls back and stays exact
guard_is_needed                                         the same family with the guard removed (bound 0): a search
                                                        finds an episode where forget != reset
replay_with_drafts_equals_replay_without                replay with drafts == replay re-decoding every turn, and
                                                        decodes no more
oracle_is_exact_exactly_when_its_labels_are_right      B7-oracle's tokens == reset's iff no turn labelled
                                                        independent changes in the counterfactual; right
                                                        labels give the reset's digest
wrong_draft_costs_one_prefill                           an entirely wrong draft: same tokens and KV as no draft, the
                                                        same decoded tokens, at most one extra forward (a prefill
                                                        of the draft) per turn
lookup_changes_no_token                                 guesses from the context (``lookup``), with or without a
                                                        draft, on ``tiny`` and ``tiny-ties``: the reference's
                                                        tokens and KV; without a fallback, no forward and no
                                                        decoded token more than the same call without lookup
lookup_guard_is_needed                                  on ``tiny-ties`` with the guard removed, a search finds a
                                                        context where a lookup's verification changes a token
======================================================  ===========================================================

``nightly`` runs ``max_examples`` (2,000) of the first property.

That *each* site of the guard is needed at its own site: ``prop_guard_sites.py``.
"""

from __future__ import annotations

import contextlib
import functools
import io

import pytest
from hypothesis import Phase, event, example, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from unsee.impl.agent.episode import parse_episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.conform.episodes import episodes, indep_episodes, scaled
from unsee.impl.engines.hf.engine import KVEngine
from unsee.impl.engines.protocol import Assist
from unsee.properties.differential import (
    compare_forget_with_reset,
    compare_replay_with_and_without_drafts,
    describe_episode,
    engine_scope,
    run_episode,
)
from unsee.properties.engines import make_engine


@functools.cache
def get_engine(name: str) -> KVEngine:
    return make_engine(name)


pytestmark = pytest.mark.usefixtures("one_thread")


#: Episodes with enough model work after the target for drafts to matter.
drafted_episodes = functools.partial(episodes, min_steps=2, max_steps=6, max_new_tokens=(2, 8))


@given(episode=drafted_episodes())
@scaled(1)
def test_splice_equals_counterfactual_with_drafts(episode):
    engine = get_engine("tiny")
    with engine_scope(engine):
        report = compare_forget_with_reset(engine, episode, drafts=True)
        assert report.drafts.mode == "verify"
        event(f"context guesses accepted: {report.drafts.totals['lookup_accepted'] > 0}")


#: The smallest episode a full (shrinking) search found where forget with the
#: guard removed differs from the reset on ``tiny-ties`` under the CPU default,
#: sdpa (the search of ``test_guard_is_needed`` with the shrink phase,
#: 2026-11-24): a near tie in a later turn that the verification prefill and
#: the reset's decode step break differently.
NEAR_TIE_COUNTEREXAMPLE = parse_episode({
    "format": "unsee.episode", "version": 2, "system": "You are a helpful agent.",
    "settings": {"max_new_tokens": 2, "temperature": 0.0, "seed": 0, "checkpoint_policy": "every_turn"},
    "steps": [{"id": "t1", "kind": "user", "text": "4417 Elm", "source": "secret"},
              {"id": "t2", "kind": "user", "text": "tea"}, {"id": "t3", "kind": "user", "text": "tea"}],
    "target": {"source": "secret", "value": "4417 Elm"}})
#: The same search's result under eager attention (the default before sdpa): the
#: third turn's second token. Under sdpa the guard-free forget happens to equal
#: the reset on it; kept: with the guard, it must stay exact.
NEAR_TIE_COUNTEREXAMPLE_EAGER = parse_episode({
    "format": "unsee.episode", "version": 2, "system": "You are a helpful agent.",
    "settings": {"max_new_tokens": 8, "temperature": 0.0, "seed": 0, "checkpoint_policy": "every_turn"},
    "steps": [{"id": "t1", "kind": "user", "text": "4417 Elm", "source": "secret"},
              {"id": "t2", "kind": "user", "text": "tea"}],
    "target": {"source": "secret", "value": "4417 Elm"}})
#: The counterexample before probes (2026-11-22): with two-token turns, the flip
#: it showed was at a turn's second token, which a probe now decides on the
#: reference's own logits. Kept: with the guard, it must stay exact.
NEAR_TIE_COUNTEREXAMPLE_BEFORE_PROBES = parse_episode({
    "format": "unsee.episode", "version": 1, "system": "You are a helpful agent.",
    "settings": {"max_new_tokens": 2, "temperature": 0.0, "seed": 0, "checkpoint_policy": "every_turn"},
    "steps": [{"id": "t1", "kind": "user", "text": "4417 Elm", "source": "secret"},
              {"id": "t2", "kind": "user", "text": "tea"}, {"id": "t3", "kind": "user", "text": "tea"}],
    "target": {"source": "secret", "value": "4417 Elm"}})


@given(episode=drafted_episodes())
@example(episode=NEAR_TIE_COUNTEREXAMPLE)
@example(episode=NEAR_TIE_COUNTEREXAMPLE_EAGER)
@example(episode=NEAR_TIE_COUNTEREXAMPLE_BEFORE_PROBES)
@scaled(2)
def test_splice_equals_counterfactual_with_drafts_on_near_ties(episode):
    engine = get_engine("tiny-ties")
    assert engine.draft_bound and engine.draft_bound > 0
    with engine_scope(engine):
        compare_forget_with_reset(engine, episode, drafts=True)


def is_forget_different_from_reset(engine: KVEngine, episode) -> bool:
    with engine_scope(engine), contextlib.redirect_stdout(io.StringIO()):  # the search's mismatches are expected
        try:
            compare_forget_with_reset(engine, episode, drafts=True)
        except AssertionError:
            return True
    return False


def test_guard_is_needed():
    """With the guard removed, the near-tie family breaks forget == reset.

    The model injects no noise: its weights are fixed, and the only thing that
    differs between a verified token and the reset's decoded one is the shape
    of the forward that produced the logits."""
    engine = get_engine("tiny-ties")
    saved = engine.draft_bound
    engine.draft_bound = 0.0
    try:
        # Generation only: shrinking would cost minutes on the tiny model. Which
        # episode flips is a fact of this CPU's kernels (a near tie broken in the
        # last bits), so the test asserts on what the search finds here; the
        # counterexamples found elsewhere are pinned only as @example above,
        # where they must stay exact with the guard.
        found = find(drafted_episodes(), lambda e: is_forget_different_from_reset(engine, e),
                     settings=settings(max_examples=100, database=None, derandomize=True, deadline=None,
                                       phases=(Phase.generate,)))
    except NoSuchExample:
        pytest.fail("no counterexample with the guard removed: the near-tie family no longer exercises it")
    finally:
        engine.draft_bound = saved
    print("counterexample without the guard:", describe_episode(found))
    # ... and the guard, put back, makes that very episode exact again
    assert not is_forget_different_from_reset(engine, found)


@given(episode=drafted_episodes())
@scaled(2)
def test_replay_with_drafts_equals_replay_without(episode):
    engine = get_engine("tiny")
    with engine_scope(engine):
        compare_replay_with_and_without_drafts(engine, episode)


@given(context=st.lists(st.integers(0, 255), min_size=1, max_size=24),
       draft=st.lists(st.integers(0, 255), min_size=1, max_size=12),
       max_new_tokens=st.integers(1, 12), temperature=st.sampled_from((0.0, 0.7)), seed=st.integers(0, 99))
@scaled(1)
def test_wrong_draft_costs_one_prefill(context, draft, max_new_tokens, temperature, seed):
    engine = get_engine("tiny")
    with engine_scope(engine):
        reference = engine.new_lineage()
        engine.prefill(reference, context)
        before = engine.counters.snapshot()
        expected = engine.generate(reference, max_new_tokens, temperature=temperature, seed=seed)
        cost = engine.counters.snapshot() - before
        # an entirely wrong draft: no position agrees with the reference
        wrong = [(e + 1 + d) % 256 if i < len(expected) and (e + 1 + d) % 256 != e else (e + 2) % 256
                 for i, (d, e) in enumerate(zip(draft, expected + [0] * len(draft)))]
        wrong = [w if i >= len(expected) or w != expected[i] else (w + 1) % 256 for i, w in enumerate(wrong)]
        drafted = engine.new_lineage()
        engine.prefill(drafted, context)
        before = engine.counters.snapshot()
        got = engine.generate(drafted, max_new_tokens, temperature=temperature, seed=seed, assist=Assist(draft=wrong))
        spent = engine.counters.snapshot() - before
        assert got == expected
        assert engine.digest(drafted) == engine.digest(reference)
        assert spent.decoded_tokens == cost.decoded_tokens
        assert spent.draft_accepted_tokens == 0
        assert spent.forward_calls <= cost.forward_calls + 1
        assert spent.prefilled_tokens <= cost.prefilled_tokens + min(len(wrong), max_new_tokens)
        # wrong from its first token, which the header's own logits decide: not even prefilled
        assert (spent.forward_calls, spent.prefilled_tokens) == (cost.forward_calls, cost.prefilled_tokens)


@given(context=st.lists(st.integers(0, 255), min_size=1, max_size=24),
       max_new_tokens=st.integers(2, 12), wrong_at=st.integers(0, 12), temperature=st.sampled_from((0.0, 0.7)),
       seed=st.integers(0, 99))
@scaled(1)
def test_probe_is_exact_and_costs_at_most_one_step(context, max_new_tokens, wrong_at, temperature, seed):
    """A probe before verification changes no token and no bit, saves the
    verification forward when the draft is wrong at its second token, and
    costs at most one one-token forward otherwise."""
    engine = get_engine("tiny")
    with engine_scope(engine):
        reference = engine.new_lineage()
        engine.prefill(reference, context)
        before = engine.counters.snapshot()
        expected = engine.generate(reference, max_new_tokens, stop_ids=(), temperature=temperature, seed=seed)
        cost = engine.counters.snapshot() - before
        draft = [(t + 1) % 256 if i == wrong_at else t for i, t in enumerate(expected)]
        spent = {}
        for probe in (False, True):
            drafted = engine.new_lineage()
            engine.prefill(drafted, context)
            before = engine.counters.snapshot()
            got = engine.generate(drafted, max_new_tokens, stop_ids=(), temperature=temperature, seed=seed,
                                  assist=Assist(draft=draft, probe=probe))
            spent[probe] = engine.counters.snapshot() - before
            assert got == expected
            assert engine.digest(drafted) == engine.digest(reference)
        probed, plain = spent[True], spent[False]
        assert probed.draft_probes == (1 if wrong_at >= 1 else 0)  # wrong at 0: decided on the header, no probe
        if wrong_at == 1:  # the probe is the reference's first decode step: nothing verified, nothing wasted
            assert (probed.forward_calls, probed.prefilled_tokens) == (cost.forward_calls, cost.prefilled_tokens)
            assert plain.prefilled_tokens > cost.prefilled_tokens  # without it, a verification forward is spent
        else:
            assert probed.forward_calls <= plain.forward_calls + 1
            # equal, or less: position 1 decided on the probe's exact logits
            # needs no guard, so it cannot send the turn to a fallback
            assert probed.prefilled_tokens <= plain.prefilled_tokens


# --- B7-oracle (the paper's attribution-oracle variant) ---------------------------

def get_changed_turns(before: AgentRuntime, after: AgentRuntime) -> set[str]:
    """Model turns whose tokens differ between two runtimes (by block id)."""
    old = dict(before.generated_tokens())
    return {b for b, tokens in after.generated_tokens() if b in old and old[b] != tokens}


@given(episode=indep_episodes())
@scaled(2)
def test_oracle_is_exact_exactly_when_its_labels_are_right(episode):
    """B7-oracle trusts its labels. With every label right it lands on the
    reset's state; a wrong label (a labelled turn that the counterfactual
    changes) always shows in the generated tokens, and in the digest whenever
    the wrong turn, or anything written after it, is still live state."""
    engine = get_engine("tiny")
    with engine_scope(engine):
        base = run_episode(engine, episode)
        oracle, reset = base.fork(), base.fork()
        report = oracle.forget(episode.target.source, oracle=True)
        reference = reset.full_reset(episode.target.source)
        labelled = {f"{s.id}/" for s in episode.steps if s.independent}
        wrong = {b for b in get_changed_turns(base, reset) if any(b.startswith(p) for p in labelled)}
        event(f"wrong labels: {bool(wrong)}")
        assert report.drafts.mode == "oracle"
        exact_tokens = oracle.generated_tokens() == reset.generated_tokens()
        assert exact_tokens == (not wrong), (describe_episode(episode), sorted(wrong))
        if not wrong:
            assert report.digest == reference.digest, describe_episode(episode)
        event(f"wrong label visible in the digest: {report.digest != reference.digest}" if wrong else "labels right")


# --- context lookup (guesses from the lineage's own tokens, impl/agent/drafts.py) -------

#: Contexts that repeat themselves (a segment 1-3 times), so that the
#: lineage's n-grams recur and guesses are offered; the tiny models also
#: repeat their own output in long turns.
repeating_contexts = st.builds(lambda segment, times: segment * times,
                               st.lists(st.integers(0, 255), min_size=1, max_size=12), st.integers(1, 3))


def get_draft(kind: str, expected: list[int], at: int) -> list[int] | None:
    """No draft, the reference's tokens wrong from position ``at`` on, or wrong throughout."""
    if kind == "none":
        return None
    start = 0 if kind == "wrong" else min(at, len(expected))
    return expected[:start] + [(t + 1) % 256 for t in expected[start:]]


def run_generate(engine: KVEngine, context: list[int], n: int, **kw) -> tuple[str, list[int], object]:
    handle = engine.new_lineage()
    engine.prefill(handle, context)
    before = engine.counters.snapshot()
    assist = Assist(**{k: kw.pop(k) for k in ("draft", "probe", "lookup") if k in kw})
    out = engine.generate(handle, n, stop_ids=(), assist=assist, **kw)
    return engine.digest(handle), out, engine.counters.snapshot() - before


#: "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n" in the tiny
#: models' ids: the tiny model loops in a long turn after it, so guesses are
#: offered and accepted.
LOOPING_CONTEXT = [257, 117, 115, 101, 114, 10, 104, 101, 108, 108, 111, 258, 10, 257, 97, 115, 115, 105, 115, 116,
                   97, 110, 116, 10]


@given(model=st.sampled_from(("tiny", "tiny-ties")), context=repeating_contexts, max_new_tokens=st.integers(1, 80),
       draft_kind=st.sampled_from(("none", "right_then_wrong", "wrong")), at=st.integers(1, 12),
       temperature=st.sampled_from((0.0, 0.7)), seed=st.integers(0, 99), probe=st.booleans())
@example(model="tiny", context=LOOPING_CONTEXT, max_new_tokens=80, draft_kind="none", at=1, temperature=0.0, seed=0,
         probe=False)
@example(model="tiny", context=LOOPING_CONTEXT, max_new_tokens=80, draft_kind="right_then_wrong", at=3,
         temperature=0.0, seed=0, probe=True)
@scaled(1)
def test_lookup_changes_no_token(model, context, max_new_tokens, draft_kind, at, temperature, seed, probe):
    engine = get_engine(model)
    kw = {"temperature": temperature, "seed": seed}
    with engine_scope(engine):
        digest, expected, _ = run_generate(engine, context, max_new_tokens, **kw)
        draft = get_draft(draft_kind, expected, at)
        runs = {lookup: run_generate(engine, context, max_new_tokens, draft=draft, probe=probe and draft is not None,
                                     lookup=lookup, **kw) for lookup in (False, True)}
        for lookup, (got_digest, got, spent) in runs.items():
            assert got == expected, (model, context, draft, lookup)
            assert got_digest == digest, (model, context, draft, lookup)
        looked, plain = runs[True][2], runs[False][2]
        event(f"{model}: guesses offered: {looked.lookup_forwards > 0}, accepted: {looked.lookup_accepted_tokens > 0}, "
              f"fallback: {looked.draft_fallbacks > 0}")
        if not looked.draft_fallbacks:
            assert looked.forward_calls <= plain.forward_calls
            assert looked.decoded_tokens <= plain.decoded_tokens
            assert looked.decoded_tokens + looked.lookup_accepted_tokens <= plain.decoded_tokens


def is_lookup_different(engine: KVEngine, context: list[int]) -> bool:
    with engine_scope(engine):
        expected = run_generate(engine, context, 40)[:2]
        return run_generate(engine, context, 40, lookup=True)[:2] != expected


def test_lookup_guard_is_needed():
    """A lookup's verification forward decides tokens on multi-token logits;
    on the near-tie family, with the guard removed, some of those decisions
    differ from the reference's decode steps (no noise injected)."""
    engine = get_engine("tiny-ties")
    saved = engine.draft_bound
    engine.draft_bound = 0.0
    try:
        found = find(repeating_contexts, lambda c: is_lookup_different(engine, c),
                     settings=settings(max_examples=100, database=None, derandomize=True, deadline=None,
                                       phases=(Phase.generate,)))
    except NoSuchExample:
        pytest.fail("no context where an unguarded lookup changes a token: the near-tie family no longer "
                    "exercises the guard")
    finally:
        engine.draft_bound = saved
    print("context where an unguarded lookup differs:", found)
    assert not is_lookup_different(engine, found)  # the guard, put back, keeps the reference's tokens
