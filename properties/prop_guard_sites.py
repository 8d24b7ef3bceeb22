"""Each site of the draft guard is needed at its own site (issue 20, item 8).

The guard (docs/drafts.md, "The exactness guard"; impl/engines/turn.py)
accepts a token decided on logits from a multi-token forward, or on KV such a
forward built, only when its margin clears ``get_threshold(bound, temperature)``.
It sits at three places, and each property below fails when the guard is
removed at its own site alone, and holds with it:

============================================  ==================================================================
test                                          site (impl/engines/turn.py) and what the strategy feeds it
============================================  ==================================================================
verified_draft_positions_are_guarded          ``get_accepted``: a draft position decided on the verification
                                              forward's logits. The draft is the reference's own tokens up to
                                              the first position where that forward decides differently, then
                                              that decision (``get_flip_draft``); the turn ends there
positions_after_a_draft_are_guarded           ``decode_guarded``'s resume (``decode(..., threshold)``): tokens
                                              decoded after a draft's first disagreement or its end, on KV the
                                              verification forward built. A probed draft of the reference's
                                              first two tokens reaches it with position 1 decided exactly
verified_guesses_are_guarded                  ``accept_guess``: context guesses (``lookup``) decided on the
                                              forward that fed them. The turn ends inside its first guess
============================================  ==================================================================

Each runs on the near-tie family (``tiny-ties``: LM-head rows tied to
``3e-7``, so a multi-token forward and a one-token decode step pick different
tokens on ~8% of greedy decisions, in the last bits, with no noise injected)
and asserts that the turn is the reference's: every token and the lineage's
digest equal to a turn decoded one token at a time, which is what the full
reset does for every turn of a forget. Greedy and seeded sampling; under
sampling the race's margins are large, so flips there are rare and the
greedy examples carry the check. Each pins, with ``@example``, the smallest
counterexample a search found with that site's guard removed, under the CPU
default attention (sdpa) and, where it differs, under eager (the default
before; with the guard it must stay exact too). docs/drafts.md gives the
private check's figures.

Decisions taken on the reference's own logits (a turn's first token on the
header's logits, position 1 on a probe's) need no guard and have none.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from unsee.impl.conform.episodes import scaled
from unsee.impl.engines.counts import Counters
from unsee.impl.engines.decoding import get_lookup, get_scores, pick
from unsee.impl.engines.hf import adapter
from unsee.impl.engines.hf.engine import KVEngine
from unsee.impl.engines.protocol import Assist
from unsee.properties.differential import engine_scope
from unsee.properties.engines import get_model, make_engine

pytestmark = pytest.mark.usefixtures("one_thread")

#: The near-tie family: its prefill and decode logits flip decisions.
MODEL = "tiny-ties"

#: How far the context-guess property looks for a turn's first guess.
LOOKUP_HORIZON = 48


@functools.cache
def get_engine() -> KVEngine:
    return make_engine(MODEL)


#: Contexts that repeat a segment 1-3 times, so that the lineage's n-grams
#: recur (guesses are offered), shrinking to one token.
contexts = st.builds(lambda segment, times: segment * times,
                     st.lists(st.integers(0, 255), min_size=1, max_size=12), st.integers(1, 3))
temperatures = st.sampled_from((0.0, 0.7))
seeds = st.integers(0, 99)


def run_turn(engine: KVEngine, context: list[int], max_new_tokens: int, **kw) -> tuple[str, list[int], Counters]:
    """One turn on a fresh lineage after ``context`` (no stop ids): the
    lineage's digest, the turn's tokens, and the counters it spent."""
    handle = engine.new_lineage()
    engine.prefill(handle, context)
    before = engine.counters.snapshot()
    assist = Assist(**{k: kw.pop(k) for k in ("draft", "probe", "lookup") if k in kw})
    tokens = engine.generate(handle, max_new_tokens, stop_ids=(), assist=assist, **kw)
    return engine.digest(handle), tokens, engine.counters.snapshot() - before


def check_turn_is_reference(engine: KVEngine, context: list[int], max_new_tokens: int, temperature: float,
                            seed: int, **kw) -> Counters:
    """Assert that the turn with ``kw`` (draft, probe, lookup) is the reference
    turn, decoded one token at a time: every token and the digest. Returns
    what the turn with ``kw`` spent."""
    want_digest, want = run_turn(engine, context, max_new_tokens, temperature=temperature, seed=seed)[:2]
    digest, tokens, spent = run_turn(engine, context, max_new_tokens, temperature=temperature, seed=seed, **kw)
    where = f"context={context} max_new_tokens={max_new_tokens} temperature={temperature} seed={seed} {kw}"
    first = next((k for k, (a, b) in enumerate(zip(tokens, want)) if a != b), min(len(tokens), len(want)))
    assert tokens == want, f"{where}: from token {first} on {tokens[first:]}, the reference's {want[first:]}"
    assert digest == want_digest, f"{where}: the reference's tokens, another digest"
    return spent


def get_verification_decisions(context: list[int], chunk: list[int], temperature: float, seed: int) -> list[int]:
    """The decoding rule's tokens at positions 1..len(chunk)-1 of a turn, each
    decided on the logits of one forward over ``chunk`` after ``context``: a
    draft's verification, done the way the engine does it."""
    model = get_model(MODEL).model
    cache = adapter.new_cache(model)
    adapter.forward_last_logits(model, context, cache)
    rows = adapter.forward_all_logits(model, chunk, cache)
    return [pick(get_scores(rows[k - 1], temperature, seed, k))[0] for k in range(1, len(chunk))]


def get_flip_draft(context: list[int], reference: list[int], temperature: float, seed: int) -> list[int] | None:
    """The shortest draft ``reference[:k] + [v]`` whose verification forward
    agrees with the reference up to position k and decides ``v != reference[k]``
    there: a real prefill-versus-decode flip at a verified position, or None.

    Its verification forward has the draft's own length, so its rows are the
    ones searched here (causal attention: row k-1 reads no later token)."""
    for k in range(1, len(reference)):
        decisions = get_verification_decisions(context, reference[:k + 1], temperature, seed)
        if decisions[:k - 1] == reference[1:k] and decisions[k - 1] != reference[k]:
            return reference[:k] + [decisions[k - 1]]
    return None


# --- (a) verified draft positions (get_accepted) ----------------------------------

@given(context=contexts, max_new_tokens=st.integers(2, 12), temperature=temperatures, seed=seeds,
       probe=st.booleans())
@example(context=[0, 0, 0], max_new_tokens=2, temperature=0.0, seed=0, probe=False)  # sdpa's
@example(context=[0], max_new_tokens=3, temperature=0.0, seed=0, probe=False)  # eager's
@scaled(1)
def test_verified_draft_positions_are_guarded(context, max_new_tokens, temperature, seed, probe):
    """A draft holding the verification forward's own flipped decision: the
    turn ends on it, so only the guard at the verified position stands
    between it and a wrong token."""
    engine = get_engine()
    with engine_scope(engine):
        reference = run_turn(engine, context, max_new_tokens, temperature=temperature, seed=seed)[1]
        draft = get_flip_draft(context, reference, temperature, seed)
        event(f"a verified position flips: {draft is not None}")
        draft = draft or reference
        check_turn_is_reference(engine, context, len(draft), temperature, seed, draft=draft, probe=probe,
                                lookup=True)


# --- (b) positions decoded after a draft (decode_guarded's resume) -------------

@given(context=contexts, max_new_tokens=st.integers(3, 12), temperature=temperatures, seed=seeds,
       lookup=st.booleans())
@example(context=[0, 0, 0], max_new_tokens=7, temperature=0.0, seed=0, lookup=False)  # sdpa's
@example(context=[0], max_new_tokens=3, temperature=0.0, seed=0, lookup=False)  # eager's
@scaled(1)
def test_positions_after_a_draft_are_guarded(context, max_new_tokens, temperature, seed, lookup):
    """A probed draft of the reference's first two tokens: position 0 is
    decided on the header's logits and position 1 on the probe's (both the
    reference's own), so the verification decides nothing and every later
    token is decoded on KV the verification forward built: the resume's
    guard is the only one on the way."""
    engine = get_engine()
    with engine_scope(engine):
        reference = run_turn(engine, context, max_new_tokens, temperature=temperature, seed=seed)[1]
        spent = check_turn_is_reference(engine, context, max_new_tokens, temperature, seed, draft=reference[:2],
                                        probe=True, lookup=lookup)
        event(f"a guarded decision fell back to the reference: {spent.draft_fallbacks > 0}")


# --- (c) verified context guesses (accept_guess) -----------------------------------

def get_first_guess_position(context: list[int], reference: list[int]) -> int | None:
    """How many tokens of the turn are decided before its first context
    guess is offered (``decoding.get_lookup`` over the lineage), or None."""
    for decided in range(1, len(reference)):
        if get_lookup(context + reference[:decided], len(reference) - decided):
            return decided
    return None


@given(context=contexts, extra=st.integers(1, 8), temperature=temperatures, seed=seeds)
@example(context=[1, 8, 1], extra=1, temperature=0.0, seed=0)
@scaled(2)
def test_verified_guesses_are_guarded(context, extra, temperature, seed):
    """A turn that ends ``extra`` tokens after its first guess is offered, so
    inside that guess: the guessed positions are decided on the rows of the
    one forward that fed the decided token with the guess, and only
    ``accept_guess``'s guard checks them (a decision after the guess would be
    guarded in ``decode``; every one before it is the reference's own)."""
    engine = get_engine()
    with engine_scope(engine):
        reference = run_turn(engine, context, LOOKUP_HORIZON, temperature=temperature, seed=seed)[1]
        decided = get_first_guess_position(context, reference)
        event(f"a guess is offered: {decided is not None}")
        max_new_tokens = (decided or 0) + extra
        spent = check_turn_is_reference(engine, context, max_new_tokens, temperature, seed, lookup=True)
        event(f"guessed tokens accepted: {spent.lookup_accepted_tokens > 0}")
