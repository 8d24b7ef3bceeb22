"""Table 1 on several engines in one run (``bench/paper.py --engines``), the paper shape's memory history (bench/episodes.py) and where
a forget's time goes (bench/timing.py), on the tiny models."""

from __future__ import annotations

import json
import sys

import pytest

from unsee.bench.episodes import HISTORY_KINDS, SECRET, estimate_history_tokens, make_indep_episode
from unsee.bench.paper import get_parser
from unsee.bench.paper import main as paper_main
from unsee.bench.paper_engines import get_engine_spec, get_engine_specs, parse_engines
from unsee.bench.paper_measure import get_changed_turns
from unsee.bench.timing import CATEGORIES, time_engine
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.files import ByteTokenizer
from unsee.impl.engines.llamacpp import engine as llamacpp
from unsee.impl.methods.baselines import apply_method
from unsee.properties.engines import make_engine

pytestmark = pytest.mark.usefixtures("one_thread")
needs_llamacpp = pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed")


def byte_count(text: str) -> int:
    return len(ByteTokenizer().encode(text))


# --- the paper shape's history ----------------------------------------------------------------

def test_memory_history_has_no_model_turn_before_the_target():
    """``history_kind="memory"``: the history after the setup turns is memory
    records only, the estimate counts no model turn for them, and the
    target's step and the turns after it are the current shape's."""
    current = make_indep_episode(0.5, 12, 3, 32)
    ep = make_indep_episode(0.5, 12, 3, 32, history_tokens=1000, count_tokens=byte_count, history_kind="memory")
    tau = len(ep.steps) - 12
    assert [s.kind for s in ep.steps[2:tau - 1]] == ["memory"] * (tau - 3)
    assert 1000 <= estimate_history_tokens(ep, byte_count) < 1000 + 400  # one record past the goal at most
    turns = make_indep_episode(0.5, 12, 3, 32, history_tokens=1000, count_tokens=byte_count)
    assert len(turns.steps) < len(ep.steps)  # a turn's 32 tokens count only where there is a turn
    assert [(s.kind, [i.text for i in s.items]) for s in ep.steps[tau - 1:]] == [
        (s.kind, [i.text for i in s.items]) for s in current.steps[2:]]
    assert all(SECRET not in i.text for s in ep.steps[:tau - 1] for i in s.items)
    with pytest.raises(ValueError, match="history_kind='notes' is not one of"):
        make_indep_episode(history_tokens=100, count_tokens=byte_count, history_kind="notes")
    assert HISTORY_KINDS == ("turns", "memory")


def test_changed_turns_are_split_by_label():
    ep = make_indep_episode(0.5, 4, 2, 8)  # s1 setup, s2 target, s3..s6 after (s4, s6 independent)
    floor = {"changed_turns": [{"block_id": "s3/answer"}, {"block_id": "s4/answer"}, {"block_id": "s5/answer"}]}
    changed = get_changed_turns(ep, floor, 1)
    assert [s.independent for s in ep.steps[2:]] == [False, True, False, True]
    assert changed == {"turns": 5, "changed": 3, "dependent_changed": 2, "dependent": 3, "independent_changed": 1,
                       "ids": ["s3", "s4", "s5"]}


# --- where the time goes ------------------------------------------------------------------------

def _check_breakdown(engine, split_forwards: bool, reprefills: bool = True):
    ep = make_indep_episode(0.5, 4, 2, 6, history_tokens=200, count_tokens=lambda t: len(engine.lm.encode(t)),
                            history_kind="memory")
    base = AgentRuntime.from_episode(engine, ep)
    for method in ("replay", "reset"):
        before = engine.counters.snapshot()
        with time_engine(engine) as b:
            apply_method(base, method, ep.target.source)
        spent = engine.counters - before
        assert set(b.seconds) == set(CATEGORIES) and all(v >= 0 for v in b.seconds.values())
        assert sum(b.seconds.values()) == pytest.approx(b.total_s, rel=1e-6)
        if split_forwards:  # every forward seen once, in one category
            assert sum(b.forwards.values()) == spent.forward_calls
            assert b.forwards["decode"] == b.tokens["decode"] > 0
            assert b.tokens["prefill"] > 0 and (b.tokens["canonical"] > 0) == reprefills
        for verb in ("prefill", "generate", "share_prefix", "digest", "_forward"):
            assert verb not in vars(engine)  # the wrappers are gone


def test_breakdown_accounts_for_every_second_and_forward():
    _check_breakdown(make_engine("tiny"), split_forwards=True)


@needs_llamacpp
def test_breakdown_on_llamacpp():
    # its decoded turns (at most max_forward tokens here) commit without a re-prefill, their
    # last token left pending (engine._commit_decoded) and computed with the next chunk: prefill
    _check_breakdown(make_engine("llamacpp-tiny"), split_forwards=True, reprefills=False)


# --- several engines in one run -------------------------------------------------------------------

def test_engine_names_resolve_through_the_registry():
    assert get_engine_spec("transformers", "smollm2", "cpu", "float32") == (
        "transformers", "smollm2", {"device": "cpu", "dtype": "float32"})
    assert get_engine_spec("llamacpp", "smollm2", "cpu", "float32") == ("llamacpp", "smollm2", {})
    assert get_engine_spec("llamacpp-tiny", "smollm2", "cpu", "float32") == ("llamacpp", "tiny", {})
    assert get_engine_spec("vllm-tiny", "smollm2", "cpu", "float32", {"tensor_parallel_size": 2}) == (
        "vllm", "tiny", {"device": "cpu", "dtype": "float32", "tensor_parallel_size": 2})
    with pytest.raises(ValueError, match="engine 'vlm' is neither a backend"):
        get_engine_spec("vlm", "smollm2", "cpu", "float32")
    assert parse_engines(" transformers, llamacpp,transformers ") == ["transformers", "llamacpp"]
    with pytest.raises(ValueError, match="expected one or more"):
        parse_engines(" , ")


def test_scale_out_options_reach_the_vllm_engines_only():
    """--tensor-parallel-size and --distributed-executor-backend go to every
    vLLM engine of --engines (the loader's options), to no other; given with
    no vLLM engine, they are bad input."""
    argv = ["--engines", "vllm,tiny,llamacpp-tiny", "--tensor-parallel-size", "2",
            "--distributed-executor-backend", "mp"]
    specs = get_engine_specs(parse_engines("vllm,tiny,llamacpp-tiny"), get_parser().parse_args(argv))
    assert specs["vllm"] == ("vllm", "smollm2", {"device": "cpu", "dtype": "float32", "tensor_parallel_size": 2,
                                                 "distributed_executor_backend": "mp"})
    assert specs["tiny"][2] == {"device": "cpu", "dtype": "float32"} and specs["llamacpp-tiny"][2] == {}
    with pytest.raises(ValueError, match="--tensor-parallel-size is a vLLM option"):
        get_engine_specs(["tiny"], get_parser().parse_args(["--tensor-parallel-size", "2"]))


def test_a_missing_extra_stops_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp now raises ImportError
    with pytest.raises(SystemExit) as stop:
        paper_main(["--model", "tiny", "--engines", "transformers,llamacpp", "--rounds", "1", "--tables", "table1",
                    "--out", str(tmp_path)])
    assert stop.value.code == 2
    assert "pip install 'unsee[llamacpp]'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing measured, nothing written


@needs_llamacpp
def test_table1_on_two_engines_side_by_side(tmp_path):
    code = paper_main(["--model", "tiny", "--engines", "transformers,llamacpp", "--rounds", "1", "--tables",
                       "table1", "--shape", "current", "--turns-after", "2", "--max-new-tokens", "3",
                       "--out", str(tmp_path)])
    assert code == 0
    result = json.loads((tmp_path / "paper.json").read_text())
    assert list(result["engines"]) == ["transformers", "llamacpp"]
    for name, r in result["engines"].items():
        table = r["tables"]["table1"]
        assert table["methods"]["replay"]["equal_to_reset"] is True
        assert set(table["methods"]["replay"]["breakdown"]["seconds"]) == set(CATEGORIES)
        assert (tmp_path / name / "paper.json").exists()
    assert result["engines"]["llamacpp"]["dtype"] != result["engines"]["transformers"]["dtype"]
    markdown = (tmp_path / "paper.md").read_text()
    side = markdown.split("### Table 1 on 2 engines: the current shape")[1]
    assert "| transformers (tiny, cpu float32) | B7 forget (ours) |" in side
    assert "| llamacpp (tiny-gguf, cpu gguf) | B7 forget (ours) |" in side
    assert "the forget changed" in side
    assert "| transformers (tiny, cpu float32) | B5/B7 |" in side and "| 9.3x |" in side and "| 1.5x |" in side
