"""The distributional audit (impl/eval/distribution.py): its distances on
hand-made sample sets, its pairing into the floor test, its report section,
and one run end to end on the tiny model."""

from __future__ import annotations

import math
import os
import time

import pytest

from unsee.impl.eval.distribution import (
    OTHER_TOOL,
    compute_distances,
    cosine_distance,
    embedding_distance,
    get_episode_distances,
    get_ngrams,
    ngram_distance,
    parse_tool,
    summarize_distribution,
    tool_disagreement,
    tool_tv,
)
from unsee.impl.eval.distribution_report import get_stars, render_distribution


def test_tool_disagreement_counts_cross_pairs():
    assert tool_disagreement(["pay", "pay"], ["pay", "pay"]) == 0.0
    assert tool_disagreement(["pay"], ["book"]) == 1.0
    # 2 x 2 cross pairs, one of them equal (pay, pay)
    assert tool_disagreement(["pay", "book"], ["pay", "send_message"]) == 0.75
    assert tool_disagreement([], ["pay"]) is None


def test_tool_disagreement_is_not_zero_within_one_mixed_set():
    # a set that mixes tools disagrees with itself: the floor is not zero
    assert tool_disagreement(["pay", "book"], ["pay", "book"]) == 0.5


def test_tool_tv_is_half_the_l1_distance():
    assert tool_tv(["pay", "book"], ["book", "pay"]) == 0.0
    assert tool_tv(["pay"], ["book"]) == 1.0
    # p = (pay 3/4, book 1/4), q = (pay 1/4, book 1/4, other 1/2): (1/2 + 0 + 1/2) / 2
    assert tool_tv(["pay", "pay", "pay", "book"], ["pay", "book", "other", "other"]) == pytest.approx(0.5)
    assert tool_tv(["pay"], []) is None


def test_ngrams_are_normalised_word_bigrams():
    assert get_ngrams("Pay Bob, now!") == {("pay", "bob"), ("bob", "now")}
    assert get_ngrams("pay") == {("pay",)}
    assert get_ngrams("  ") == set()


def test_ngram_distance_is_one_minus_jaccard_of_pooled_bigrams():
    assert ngram_distance(["pay bob now"], ["pay bob now"]) == 0.0
    assert ngram_distance(["pay bob"], ["book room"]) == 1.0
    # {pay bob, bob now} against {pay bob, bob later}: 1 shared of 3
    assert ngram_distance(["pay bob now"], ["pay bob later"]) == pytest.approx(2 / 3)
    # pooled over the set: the second text supplies the missing bigram
    assert ngram_distance(["pay bob", "bob now"], ["pay bob now"]) == 0.0
    assert ngram_distance([""], [""]) == 0.0
    assert ngram_distance([], ["x"]) is None


def test_cosine_and_embedding_distance():
    assert cosine_distance([1.0, 0.0], [2.0, 0.0]) == pytest.approx(0.0)
    assert cosine_distance([1.0, 0.0], [0.0, 3.0]) == pytest.approx(1.0)
    assert cosine_distance([1.0, 0.0], [-1.0, 0.0]) == pytest.approx(2.0)
    assert cosine_distance([0.0, 0.0], [1.0, 0.0]) == 1.0
    with pytest.raises(ValueError, match="length"):
        cosine_distance([1.0], [1.0, 2.0])
    # cross pairs: (e1, e1) 0, (e1, e2) 1, (e2, e1) 1, (e2, e2) 0
    assert embedding_distance([[1, 0], [0, 1]], [[1, 0], [0, 1]]) == pytest.approx(0.5)
    # a sample with no embedding is left out, not counted as a distance
    assert embedding_distance([[1, 0], None], [[1, 0]]) == pytest.approx(0.0)
    assert embedding_distance([None], [[1, 0]]) is None


def test_parse_tool_takes_the_first_tool_named():
    tools = ("pay", "send_message")
    assert parse_tool("Tool: pay(account=1)", tools) == "pay"
    assert parse_tool("Tool: Send_Message, then pay", tools) == "send_message"
    assert parse_tool("Tool: pay or send_message", tools) == "pay"
    assert parse_tool("Tool: payments and repay", tools) == OTHER_TOOL  # whole words only
    assert parse_tool("Tool: nothing", tools) == OTHER_TOOL


def _sets(tools, texts, embeddings=None):
    return {"tools": tools, "texts": texts, "embeddings": embeddings}


def test_compute_distances_names_all_four_and_skips_a_missing_embedding():
    a = _sets(["pay"], ["pay bob"], [[1.0, 0.0]])
    b = _sets(["book"], ["book room"], None)
    d = compute_distances(a, b)
    assert d == {"tool_consistency": 1.0, "tool_tv": 1.0, "ngram": 1.0, "embedding": None}


def _row(case, method, sets):
    return {"suite": "s", "case": case, "method": method, "dist": {"k": 2, "temperature": 0.7, "ngram": 2,
                                                                   "embedder": "test", "sets": sets}}


def _fake_rows(n=8):
    """B5's two sets agree; B7 agrees with B5; B6 always picks another tool."""
    rows = []
    for i in range(n):
        same = _sets(["pay", "pay"], [f"pay bob {i}", "pay bob"], [[1.0, 0.0], [1.0, 0.1]])
        other = _sets(["book", "book"], ["book the room", "book it"], [[0.0, 1.0], [0.1, 1.0]])
        floor_b = _sets(["pay", "book"] if i % 2 else ["pay", "pay"], ["pay bob", "pay bob now"],
                        [[1.0, 0.0], [1.0, 0.2]])
        rows += [_row(f"c{i}", "reset", {"a": same, "b": floor_b}), _row(f"c{i}", "replay", {"a": floor_b}),
                 _row(f"c{i}", "sanitized-rebuild", {"a": other})]
    return rows


def test_episode_distances_pair_each_method_with_b5_and_the_floor():
    d = get_episode_distances(_fake_rows(4))
    assert [r["case"] for r in d["floor"]] == ["c0", "c1", "c2", "c3"]
    # B7's set is the floor's other side here, so its distance to B5 equals the floor's
    assert [r["tool_tv"] for r in d["replay"]] == [r["tool_tv"] for r in d["floor"]]
    assert all(r["tool_tv"] == 1.0 for r in d["sanitized-rebuild"])


def test_an_episode_without_b5s_two_sets_is_left_out():
    rows = _fake_rows(2)
    rows[0]["dist"]["sets"].pop("b")
    assert [r["case"] for r in get_episode_distances(rows)["floor"]] == ["c1"]


def test_an_episode_with_b5_alone_adds_no_floor_point():
    rows = [r for r in _fake_rows(2) if r["case"] == "c0" or r["method"] == "reset"]  # c1: cut short after B5
    d = get_episode_distances(rows)
    assert [r["case"] for r in d["floor"]] == ["c0"] and [r["case"] for r in d["replay"]] == ["c0"]


def test_the_floor_test_flags_b6_and_not_b7():
    summary = summarize_distribution(_fake_rows(8))
    assert summary["replay"]["tool_tv"]["p"] == 1.0  # equal to the floor on every episode
    assert summary["sanitized-rebuild"]["tool_tv"]["n"] == 8
    assert summary["sanitized-rebuild"]["tool_tv"]["p"] < 0.01  # above the floor on all 8
    assert summary["sanitized-rebuild"]["tool_tv"]["above"] == 8
    assert summary["sanitized-rebuild"]["embedding"]["mean"] > summary["sanitized-rebuild"]["embedding"]["floor"]


def test_report_section_has_one_row_per_audited_method():
    lines = render_distribution(_fake_rows(8))
    cut = next(i for i, line in enumerate(lines) if line.startswith("Power:"))
    table = [line for line in lines[:cut] if line.startswith("| B")]
    assert [line.split(" | ")[0] for line in table] == ["| B7 Selective-Replay", "| B6 Sanitized-Rebuild"]
    assert "**" in table[1] and "*" not in table[0]
    power = [line for line in lines[cut:] if line.startswith("| B")]
    assert [line.split(" | ")[0] for line in power] == ["| B7 Selective-Replay", "| B6 Sanitized-Rebuild"]
    assert "d = " in power[1] and "n = " in power[1]
    assert "No row holds" in render_distribution([{"suite": "s", "case": "c", "method": "reset", "dist": None}])[2]


def test_stars():
    assert [get_stars(p) for p in (None, 0.5, 0.04, 0.005, 0.0005)] == ["", "", "*", "**", "***"]


def test_audit_end_to_end_on_tiny(tmp_path):
    """``unsee eval`` on the tiny model with B5, B6 and B7: the rows carry the
    sample sets (B5 two, the others one, independent seeds), the embeddings
    are the model's hidden size, and the report has the section and plot."""
    pytest.importorskip("scipy")
    from unsee.impl.engines.registry import load_engine
    from unsee.impl.eval.report import write_report
    from unsee.impl.eval.run import EvalConfig, generate_cases, run_evaluation

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start = time.perf_counter()
    engine = load_engine("tiny", "transformers")
    config = EvalConfig(model="tiny", methods=("reset", "sanitized-rebuild", "replay"), samples=2,
                        max_new_tokens=4, turn_tokens=4)
    cases = generate_cases("tool", 2, seed=0)
    rows = run_evaluation(cases, config, tmp_path, progress=False, engine=engine)
    by_method = {(r["case"], r["method"]): r["dist"] for r in rows}
    ref = by_method[(cases[0].id, "reset")]
    assert set(ref["sets"]) == {"a", "b"} and set(by_method[(cases[0].id, "replay")]["sets"]) == {"a"}
    seeds = ref["sets"]["a"]["seeds"] + ref["sets"]["b"]["seeds"] + by_method[(cases[0].id, "replay")]["sets"]["a"]["seeds"]
    assert len(set(seeds)) == len(seeds) == 6  # independent, not matched
    vector = ref["sets"]["a"]["embeddings"][0]
    assert len(vector) == engine.lm.model.config.hidden_size and all(math.isfinite(x) for x in vector)
    assert all(t.startswith("Tool: ") for t in ref["sets"]["a"]["texts"])
    report = write_report(rows, tmp_path).read_text()
    assert "## Distributional audit" in report and "| B6 Sanitized-Rebuild | 2 |" in report
    assert (tmp_path / "distribution.png").exists() and (tmp_path / "distribution.json").exists()
    assert time.perf_counter() - start < 60


def test_embedder_is_refused_for_an_engine_without_one():
    from types import SimpleNamespace

    from unsee.impl.engines.embedding import embed_texts

    with pytest.raises(ValueError, match="no offline embedder"):
        embed_texts(SimpleNamespace(lm=SimpleNamespace()), ["x"])


def test_llamacpp_embedder_is_the_mean_pooled_hidden_state():
    pytest.importorskip("llama_cpp")
    from unsee.impl.engines.embedding import embed_texts
    from unsee.impl.engines.registry import load_engine

    engine = load_engine("tiny", "llamacpp")
    before = engine.budget.lineages
    a, again, other, empty = embed_texts(engine, ["pay the rent", "pay the rent", "book a room", ""])
    assert len(a) == engine.lm.n_embd and all(math.isfinite(x) for x in a)
    assert a == again and a != other and empty is None
    assert engine.budget.lineages == before  # no lineage made or changed
