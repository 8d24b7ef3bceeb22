"""bench/llamacpp_exact_batch.py on the tiny GGUF: the measuring code runs and
its comparisons find what they look for. Whether a batch of sequences, or a
second thread, gives llama.cpp's bits is not asserted: it rests on which
kernels a CPU and a batch take (docs/bench.md, "many sequences in one forward")."""

from __future__ import annotations

import json

import numpy as np
import pytest

from unsee.bench import llamacpp_exact_batch as bench
from unsee.impl.engines.llamacpp import engine as llamacpp
from unsee.impl.engines.llamacpp.state import KVState, SeqKV

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed")]


@pytest.fixture(scope="module")
def lm():
    from unsee.impl.engines.registry import load_engine

    return load_engine("tiny", "llamacpp", threads=1).lm


@pytest.mark.parametrize("unified", [True, False])
def test_a_batch_row_compares_every_sequence(lm, unified):
    plan = bench.make_plan("mixed", 3, lm.vocab_size, chunk=5, history=12, stagger=0, rounds=3)
    assert [len(f) for f in plan.rounds[0]] == [5, 1, 1] and [len(h) for h in plan.histories] == [12] * 3
    row = bench.compare_batch(lm, plan, 1, unified, {})
    assert row["k"] == 3 and row["layout"] == ("unified" if unified else "split")
    assert row["tokens_compared"] == 5 + 2 + 3 * 2 and len(row["first_kv_diff"]) == 3
    assert row["kv_equal"] == all(d is None for d in row["first_kv_diff"])
    assert row["logits_equal"] == (row["max_abs_logit_diff"] == 0.0)
    assert row["batched_cpu_s"] >= 0 and row["single_cpu_s"] >= 0


def test_each_sequence_state_holds_its_own_positions(lm):
    """In a context of a stream per sequence llama.cpp writes every stream into
    a sequence's state; the parser keeps the sequence's cells, by position."""
    plan = bench.make_plan("staggered", 2, lm.vocab_size, history=6, stagger=4, rounds=2)
    for unified in (True, False):
        _, kvs, _, _ = bench.run_batched(lm, plan, 1, unified)
        assert [list(kv.caches[0].positions) for kv in kvs] == [list(range(8)), list(range(12))]


def test_the_first_differing_row_is_found(lm):
    plan = bench.make_plan("equal", 1, lm.vocab_size, history=10, rounds=2)
    _, kv, _, _ = bench.run_alone(lm, plan, 0, 1, {})
    assert bench.get_first_kv_diff(kv, kv) is None
    seq = kv.caches[0]
    k = [a.copy() for a in seq.k]
    k[-1][7, 0] ^= 1  # one bit of position 7's K row in the last layer
    changed = KVState((SeqKV(seq.positions, tuple(k), seq.v, seq.k_types, seq.v_types, seq.v_trans, seq.v_elem),))
    assert bench.get_first_kv_diff(changed, kv) == 7
    assert bench.get_first_kv_diff(kv.head(5), kv) == 0  # other lengths differ from the start


def test_a_prefilled_history_is_reloaded_for_the_next_reference(lm):
    """The reference prefills a history once per thread count and loads it after:
    the second run gives the first's logits and rows (the engine's park and reload)."""
    plan = bench.make_plan("equal", 1, lm.vocab_size, history=20, rounds=3)
    prefilled: dict = {}
    first = bench.run_alone(lm, plan, 0, 1, prefilled)
    again = bench.run_alone(lm, plan, 0, 1, prefilled)
    assert len(prefilled) == 1
    assert all(np.array_equal(a, b) for a, b in zip(first[0], again[0]))
    assert bench.get_first_kv_diff(first[1], again[1]) is None


def test_the_threads_part_and_the_tables(lm, capsys, tmp_path):
    settings = [bench.parse_setting(t) for t in ("1:1", "2:2p", "1:2")]
    assert settings == [(1, 1, False), (2, 2, True), (1, 2, False)]
    rows = bench.run_threads_part(lm, [0, 9], [1, 3], 2, settings, lambda row: None)
    assert [(r["prompt"], r["size"], r["threads"]) for r in rows] == [
        (p, s, t) for p in (0, 9) for s in (1, 3) for t in ("2:2p", "1:2")]
    assert all(r["kv_equal"] == (r["first_kv_diff"] is None) for r in rows)
    assert len(bench.format_threads(rows)) == 2 + len(rows)
    out = tmp_path / "exact.json"
    assert bench.main(["--model", "tiny", "--part", "batch", "--sequences", "2", "--batch-threads", "1",
                       "--layouts", "split", "--chunks", "4", "--history", "8", "--stagger", "3",
                       "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| split | 1 | mixed (chunk 4) | 2 |" in table
    assert [r["case"] for r in json.loads(out.read_text())["batch"]] == ["equal", "staggered", "mixed"]


def test_the_pad_cost_times_both_kinds_of_step(tmp_path):
    from unsee.bench import llamacpp_pad_cost

    out = tmp_path / "cost.json"
    assert llamacpp_pad_cost.main(["--model", "tiny", "--context", "20", "--steps", "2", "--threads", "1",
                                   "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    from unsee.impl.engines.llamacpp.kernels import find_setter, is_lone_row_exact
    from unsee.impl.engines.llamacpp.model import llama_module

    kinds = ("whole", "split", "padded") if find_setter(llama_module()) is not None else ("lone", "padded")
    assert row["threads"] == 1 and row["flash_attn"] and set(row) >= set(kinds)
    assert all(row[k]["wall_min"] <= row[k]["wall_p50"] and row[k]["cpu_p50"] >= 0 for k in kinds)
    assert is_lone_row_exact() == (kinds[0] == "whole")  # the switch left off, as the loader set it
