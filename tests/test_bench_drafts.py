"""The issue-54 benches' own logic (bench/drafts_models.py, bench/cold_forget.py): a
model's shards merged and an episode run twice refused; a cold pair's ratios; one
counted ``unsee run`` on the tiny GGUF. No figure is asserted: the benches measure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unsee.bench import cold_forget, drafts_models
from unsee.impl.engines.llamacpp import engine as llamacpp

ROOT = Path(__file__).resolve().parents[1]


def write_run(folder, model: str, cases: list[str], command: str) -> None:
    folder.mkdir()
    rows = [{"build": "abc1234", "load": load, "suite": "memory", "case": case, "methods": {}}
            for load, case in zip((3.5, 9.25), cases)]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "label.json").write_text(json.dumps({"model": model, "build": "abc1234", "load": "under load",
                                                   "command": command}))


def test_a_models_shards_merge_into_one_run_and_an_episode_run_twice_is_refused(tmp_path):
    write_run(tmp_path / "q-0", "qwen", ["a", "b"], "python -m x --shard 0/2 --out /elsewhere/q-0")
    write_run(tmp_path / "q-1", "qwen", ["c"], "python -m x --shard 1/2 --out /elsewhere/q-1")
    write_run(tmp_path / "g-0", "gemma", ["a"], "python -m x --out g")
    runs = drafts_models.get_model_runs([tmp_path / "q-0", tmp_path / "g-0", tmp_path / "q-1"])
    assert [label["model"] for _, label in runs] == ["qwen", "gemma"]
    rows, label = runs[0]
    assert [r["case"] for r in rows] == ["a", "b", "c"]
    # each command names the folder its rows are read from now; the load is the rows' own
    assert label["command"] == (f"python -m x --shard 0/2 --out {tmp_path / 'q-0'}; "
                                f"python -m x --shard 1/2 --out {tmp_path / 'q-1'}")
    assert label["load"].startswith("load average 3.5 to 9.2 over 3 episodes")
    write_run(tmp_path / "q-2", "qwen", ["b"], "python -m x --out q-2")
    with pytest.raises(ValueError, match=r"q-2: episodes another folder of qwen ran too: \[\('memory', 'b'\)\]"):
        drafts_models.get_model_runs([tmp_path / "q-0", tmp_path / "q-2"])


def cold_row(pair: int, method: str, wall: float, cpu: float, digest: str = "d" * 64) -> dict:
    return {"build": "abc1234", "model": "m", "pair": pair, "method": method, "wall_s": wall, "cpu_s": cpu,
            "phases": {"torch": [1.0, 0.5], "load": [1.0, 0.2], "run": [wall - 3, cpu - 1], "start": [1.0, 0.3]},
            "method_wall_s": wall / 4, "method_prefilled": 10, "method_decoded": 5, "forwards": 20, "fed": 40,
            "load_average": 2.0, "digest": digest}


def test_cold_pairs_are_matched_whatever_their_order_and_an_unfinished_pair_is_left_out():
    rows = [cold_row(0, "replay", 9.0, 4.0), cold_row(0, "reset", 10.0, 5.0),
            cold_row(1, "reset", 10.0, 4.0), cold_row(1, "replay", 12.0, 5.0), cold_row(2, "replay", 1.0, 1.0)]
    pairs = cold_forget.get_pairs(rows)["m"]
    assert [p["pair"] for p in pairs] == [0, 1]
    assert [cold_forget.compute_ratios(p)["wall"] for p in pairs] == [0.9, 1.2]
    assert [cold_forget.compute_ratios(p)["cpu"] for p in pairs] == [0.8, 1.25]
    table = cold_forget.render(rows, ["--pairs", "3"], {"cpu": "AMD EPYC", "cores": 2})
    assert "| m | 2 | 0.90x 1.20x | 1.050x | 1 of 2 | 0.80x 1.25x | 1.025x |" in table
    assert table.startswith("> build `abc1234`") and "`python -m unsee.bench.cold_forget --pairs 3`" in table


@pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed")
def test_a_counted_cold_run_is_unsee_runs_own_and_counts_its_forwards(tmp_path):
    episode = tmp_path / "episode.json"
    episode.write_text(json.dumps(cold_forget.EPISODE))
    out = {m: cold_forget.run_child(cold_forget.get_run_args(episode, "tiny", m))
           for m in cold_forget.METHODS}
    assert out["replay"]["digest"] == out["reset"]["digest"] and out["replay"]["code"] == 0
    for report in out.values():
        assert set(report["phases"]) == {"torch", "load", "run"}
        # every forward of the episode and the method: more than the method's own tokens need one by one
        assert report["forwards"] > 0 and report["fed"] >= report["method_prefilled"]
    assert out["replay"]["drafts"] in ("off", "verify")


@pytest.mark.parametrize("bench", [drafts_models, cold_forget], ids=["drafts-models", "cold-forget"])
def test_the_committed_tables_are_their_benches_rendering_of_the_committed_figures(bench):
    """docs/drafts.md's two issue-54 regions are what the benches wrote, not edited by hand."""
    from unsee.impl.cli.docs import get_region

    summary = json.loads((ROOT / bench.SUMMARY_FILE).read_text())
    rendered = (drafts_models.render(summary["models"], summary["labels"]) if bench is drafts_models else
                cold_forget.render(summary["rows"], summary["command"], summary["machine"]))
    committed = get_region((ROOT / "docs" / "drafts.md").read_text(), bench.REGION, getattr(
        bench, "COMMAND", None) or bench.DOCS_COMMAND)
    assert committed == rendered, f"docs/drafts.md's {bench.REGION} region differs: run its command"


def test_the_cold_label_names_the_decode_threads_the_run_had():
    assert cold_forget.get_threads_text({"cpu": "c", "cores": 2}) == "1 thread"  # a summary from before
    assert cold_forget.get_threads_text({"cpu": "c", "cores": 2, "threads": 2}) == "2 decode threads"
