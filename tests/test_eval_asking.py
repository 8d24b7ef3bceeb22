"""The audits' generations asked through a prompt tree (impl/eval/asking.py)
give the tokens of asking one at a time (``runtime.probe_ids``: fork,
prefill, generate, commit, drop) bit for bit, on both engines that compute
their own KV; they leave the state as it was, and the same state asked twice
answers the same.

The tiny models decode near-uniform noise, so samples at a high temperature
depart from each other early: the trees fork, which is what these checks need."""

from __future__ import annotations

import pytest

from unsee.impl.agent.episode import parse_episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.registry import load_engine
from unsee.impl.eval.asking import Asker, PromptTree, ask_state, get_ask_key, get_asking, get_prompt
from unsee.impl.eval.cases import EvalCase, Fact
from unsee.impl.eval.run import EvalConfig

BACKENDS = ["transformers", "llamacpp"]


def make_case() -> EvalCase:
    episode = parse_episode({
        "format": "unsee.episode", "version": 2, "system": "You are a helpful assistant.",
        "settings": {"max_new_tokens": 8},
        "steps": [{"id": "s1", "kind": "user", "text": "My address is 4417 Elm Street."},
                  {"id": "s2", "kind": "user", "text": "Plan a walk near my home."}],
        "target": {"source": "s1", "value": "4417 Elm Street"},
        "probes": ["Where do I live?"]})
    return EvalCase("memory", "t0", episode, facts=(Fact("s2", "walk", "What did I ask you to plan?"),))


@pytest.fixture(scope="module", params=BACKENDS)
def runtime(request):
    if request.param == "llamacpp":
        pytest.importorskip("llama_cpp")
    engine = load_engine("tiny", request.param)
    return AgentRuntime.from_episode(engine, make_case().episode)


#: greedy, then samples whose seeds make them depart from each other at various depths
GENERATIONS = [(0.0, None)] + [(t, s) for t in (0.7, 1.5, 3.0) for s in (11, 12, 13)]


def test_the_tree_gives_the_one_at_a_time_tokens(runtime):
    engine = runtime.engine
    assert get_asking(engine) == "tree"
    question = "Where do I live?"
    expected = [runtime.probe_ids(question, 8, t, s) for t, s in GENERATIONS]
    digest = engine.digest(runtime.lineage)
    before = engine.counters.snapshot()
    tree = PromptTree(engine, runtime.lineage, get_prompt(runtime, question))
    try:
        got = [tree.generate(8, engine.lm.eos_ids, t, s) for t, s in GENERATIONS]
        branches = tree.branches
    finally:
        tree.close()
    spent = engine.counters - before
    assert got == expected
    assert len({tuple(g) for g in got}) > 2 and branches > 2  # the samples departed: the tree forked
    # one prefill of the prompt, then one forward per token no earlier generation decided
    assert spent.forward_calls < sum(len(g) for g in got)
    assert engine.digest(runtime.lineage) == digest  # the state is not changed


def test_ask_state_is_deterministic_and_leaves_the_state(runtime):
    """The same state asked twice gives the same answers; asked one at a time
    (the tree switched off) too."""
    case = make_case()
    config = EvalConfig(model="tiny", samples=3, temperature=1.5)
    digest = runtime.engine.digest(runtime.lineage)
    first = ask_state(runtime, case, config)
    assert ask_state(runtime, case, config) == first
    assert runtime.engine.digest(runtime.lineage) == digest
    original = Asker.__init__

    def one_at_a_time(self, engine, lineage):
        original(self, engine, lineage)
        self.tree = False

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Asker, "__init__", one_at_a_time)
        assert ask_state(runtime, case, config) == first


def test_the_ask_key_is_the_kv_and_the_prompts(runtime):
    """A fork of the state shares its key; a state one turn longer does not."""
    case = make_case()
    key = get_ask_key(runtime, case)
    assert get_ask_key(runtime.fork(), case) == key
    longer = parse_episode({**case.episode.to_json(), "steps": [*case.episode.to_json()["steps"],
                                                                {"id": "s3", "kind": "user", "text": "Thanks."}]})
    other = AgentRuntime.from_episode(runtime.engine, longer)
    assert get_ask_key(other, case) != key


def test_sharing_changes_no_answer():
    """Every row's answers, draws and distributional samples are the same
    whether states with one ask key share their generations (and the
    distributional audit's tree) or each is asked on its own."""
    from unsee.impl.eval.run import run_case

    engine = load_engine("tiny", "transformers")
    case = make_case()
    methods = ("none", "memory-delete", "replay", "sanitized-rebuild")

    def answers(share: bool) -> dict:
        config = EvalConfig(model="tiny", methods=methods, samples=3, temperature=1.5, share_identical=share)
        return {r["method"]: (r["asked_from"], r["probes"], r["leak5"], r["utility"], r["dist"] and r["dist"]["sets"])
                for r in run_case(engine, case, config)}

    shared, alone = answers(True), answers(False)
    assert {m: a[1:] for m, a in shared.items()} == {m: a[1:] for m, a in alone.items()}
    assert shared["replay"][0] == "reset" and shared["memory-delete"][0] == "none"  # shared, in fact
    assert all(a[0] is None for a in alone.values())


def test_the_embedder_embeds_a_text_once(monkeypatch):
    """Repeated samples are embedded once; the vectors are those of embedding each."""
    from unsee.impl.engines import embedding
    from unsee.impl.eval.distribution import get_embedder

    engine = load_engine("tiny", "transformers")
    texts = ["Tool: search", "Tool: send", "Tool: search", ""]
    expected = embedding.embed_texts(engine, texts)
    calls = []
    real = embedding.embed_texts
    monkeypatch.setattr(embedding, "embed_texts", lambda e, ts: calls.append(list(ts)) or real(e, ts))
    embed = get_embedder(engine)
    assert embed(texts) == expected
    assert embed(texts[:2]) == expected[:2]
    assert calls == [["Tool: search", "Tool: send", ""]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_kv_budget_evicts_no_branch_a_later_generation_needs(backend):
    """Under a budget of one byte every unpinned lineage goes at each verb;
    the tree's branches are pinned while it lives, so it still answers as
    one at a time does (unpinned, the second generation finds its branch evicted)."""
    if backend == "llamacpp":
        pytest.importorskip("llama_cpp")
    engine = load_engine("tiny", backend)
    runtime = AgentRuntime.from_episode(engine, make_case().episode)
    state = engine.budget.pin(runtime.lineage)
    engine.budget.set(1)
    question = "Where do I live?"
    expected = [runtime.probe_ids(question, 8, t, s) for t, s in GENERATIONS]
    asker = Asker(engine, runtime.lineage)
    try:
        assert [asker.ask(get_prompt(runtime, question), 8, t, s) for t, s in GENERATIONS] == expected
    finally:
        asker.close()
    assert engine.budget.memory().lineages == 1 and state is not None  # the trees' branches are gone


def test_the_docs_table_says_how_each_engine_is_asked():
    """docs/eval.md's table of how a state is asked matches get_asking on the engines this machine loads."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "eval.md").read_text()
    words = {"tree": "prompt tree", "one at a time": "one at a time"}
    for backend, name in (("transformers", "transformers"), ("llamacpp", "llama.cpp")):
        if backend == "llamacpp":
            pytest.importorskip("llama_cpp")
        assert f"| {name} | {words[get_asking(load_engine('tiny', backend))]} |" in text
