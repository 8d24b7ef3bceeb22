"""bench/serve_peer.py: its figures and goals from records, and its unsee side
run end to end on the tiny GGUF (a server process, the ``openai`` client,
the DELETE's compute floor). The peer's side needs its own venv (``make
serve-peer``) and is not run here."""

from __future__ import annotations

import argparse
import json

import pytest

from unsee.bench.options import FIGURE_LABEL
from unsee.bench.serve_peer_table import format_markdown, summarise
from unsee.impl.engines.llamacpp import engine as llamacpp

WORKLOAD = argparse.Namespace(turns=2, max_tokens=8, concurrency=[1, 8], history_tokens=1000)


def make_rows(system: str, seconds: float, tokens: int) -> list[dict]:
    """Two levels of two turns each, a history phase, and for unsee a DELETE and
    another conversation's turn; every turn ``seconds`` long with ``tokens`` tokens."""
    rows = [{"phase": "load", "level": level, "latency_s": seconds, "ttft_s": seconds / 2, "output_tokens": tokens,
             "level_wall_s": 2 * seconds, "level_cpu_s": 2 * seconds} for level in (1, 8) for _ in range(2)]
    rows += [{"phase": "history", "step": step, "latency_s": seconds} for step in ("first", "warm", "after another")]
    if system == "unsee":
        rows += [{"phase": "delete", "step": "delete", "latency_s": 3.0, "report_wall_s": 2.5, "server_cpu_s": 2.85},
                 {"phase": "delete", "step": "other alone", "latency_s": 1.0},
                 {"phase": "delete", "step": "other during delete", "latency_s": 1.5}]
    return [{**r, "system": system} for r in rows]


def test_goals_are_the_measured_ratios():
    rows = make_rows("peer", 2.0, 10) + make_rows("unsee", 1.0, 10)
    floor = {"wall_s": 2.0, "cpu_s": 1.9, "reset_digest_equal": True, "prefilled": 40, "decoded": 8, "forwards": 10}
    summary = summarise(rows, floor, WORKLOAD)
    assert summary["systems"]["unsee"]["levels"][8]["tokens_per_s"] == 10.0  # 20 tokens in 2 s
    by_name = {g["goal"]: g for g in summary["goals"]}
    tokens = by_name["1 conversation: output tokens/s vs llama_cpp.server"]
    assert tokens["value"] == 2.0 and tokens["met"]
    ttft = by_name["1 conversation: time to first token vs llama_cpp.server"]
    assert ttft["value"] == 0.5 and ttft["met"]
    assert by_name["8 concurrent conversations: aggregate tokens/s vs llama_cpp.server"]["value"] == 2.0
    delete = by_name["DELETE vs the compute floor of its forget, by CPU seconds"]
    assert delete["value"] == pytest.approx(1.5) and delete["met"] is False and delete["detail"] == "by wall: 1.50x"
    assert summary["systems"]["unsee"]["levels"][1]["cpu_per_token_s"] == 0.1
    assert by_name["another conversation's turn during a DELETE vs alone"]["value"] == 1.5
    markdown = format_markdown({"label": {"build": "abc1234-dirty", "cpu": "c", "cores": 2, "load_average": 1.0, "threads": 1,
                                          "model": "m", "command": "python -m unsee.bench.serve_peer"}, "summary": summary, "floor": floor})
    assert "| DELETE vs the compute floor of its forget, by CPU seconds (by wall: 1.50x) | 1.50x | <= 1.15x | **no** |" \
        in markdown
    assert markdown.count("\n| ") >= 20
    assert FIGURE_LABEL.match(markdown.splitlines()[0])  # pasted into docs/serve.md as it is


def test_delete_rounds_read_each_delete_against_its_own_floor():
    """Each round's DELETE against the floor timed right after it; the goals read the medians."""
    rows = make_rows("peer", 2.0, 10) + make_rows("unsee", 1.0, 10)
    rows = [r for r in rows if r["phase"] != "delete"]
    for cpu, floor_cpu, alone, during in ((2.0, 2.0, 1.0, 1.1), (6.0, 2.0, 1.0, 3.0), (3.0, 2.5, 2.0, 2.0)):
        floor = {"wall_s": floor_cpu, "cpu_s": floor_cpu, "reset_digest_equal": True}
        rows += [{"phase": "delete", "step": "delete", "latency_s": cpu, "report_wall_s": cpu, "server_cpu_s": cpu,
                  "floor": floor, "system": "unsee"},
                 {"phase": "delete", "step": "other alone", "latency_s": alone, "system": "unsee"},
                 {"phase": "delete", "step": "other during delete", "latency_s": during, "system": "unsee"}]
    summary = summarise(rows, None, WORKLOAD)
    delete, other = summary["systems"]["unsee"]["delete"], summary["systems"]["unsee"]["other_turn"]
    assert delete["round_x_floor_cpu"] == [1.0, 3.0, 1.2] and delete["x_floor_cpu"] == 1.2
    assert other["round_slowdown"] == pytest.approx([1.1, 3.0, 1.0]) and other["slowdown"] == pytest.approx(1.1)
    by_name = {g["goal"]: g for g in summary["goals"]}
    goal = by_name["DELETE vs the compute floor of its forget, by CPU seconds"]
    assert goal["met"] is False and goal["detail"] == "by wall: 1.20x; median of rounds 1.00x, 3.00x, 1.20x"
    assert by_name["another conversation's turn during a DELETE vs alone"]["met"] is True


def test_a_run_rendered_again_from_its_json_shows_every_figure():
    """JSON writes the levels' keys as strings: read back, the table is the one the run printed."""
    from unsee.bench.serve_peer_table import read_result

    rows = make_rows("peer", 2.0, 10) + make_rows("unsee", 1.0, 10)
    floor = {"wall_s": 2.0, "cpu_s": 1.9, "reset_digest_equal": True, "prefilled": 40, "decoded": 8, "forwards": 10}
    result = {"label": {"build": "abc1234", "cpu": "c", "cores": 2, "load_average": 1.0, "threads": 1, "model": "m",
                        "command": "python -m unsee.bench.serve_peer"}, "summary": summarise(rows, floor, WORKLOAD),
              "floor": floor}
    again = read_result(json.loads(json.dumps(result)))
    assert format_markdown(again) == format_markdown(result)
    assert "| 8 conversation(s): output tokens/s | 5.00 |" in format_markdown(again)


def test_a_goal_without_the_peer_is_not_measured():
    summary = summarise(make_rows("unsee", 1.0, 10), None, WORKLOAD)
    assert [g["met"] for g in summary["goals"]][:4] == [None] * 4


@pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed")
def run_unsee_side(out, *options: str) -> dict:
    """The bench's two unsee systems on the tiny GGUF with ``options``; its result."""
    pytest.importorskip("fastapi")
    pytest.importorskip("openai")
    from unsee.bench.serve_peer import main

    assert main(["--model", "tiny", "--systems", "unsee-chat,unsee", "--max-tokens", "4", *options,
                 "--out", str(out)]) == 0
    return json.loads((out / "serve-peer.json").read_text())


def test_the_unsee_side_runs_against_a_server(tmp_path, one_thread):
    """Both unsee systems through the real client against `unsee serve` on the
    tiny GGUF; the DELETE's floor from the store copied before it, whose full
    reset reaches the digest the server reports after the forget."""
    out = tmp_path / "peer"
    result = run_unsee_side(out, "--concurrency", "1,2", "--turns", "2", "--history-tokens", "40", "--rounds", "1",
                            "--delete-rounds", "2")
    rows = result["rows"]
    for system in ("unsee-chat", "unsee"):
        load = [r for r in rows if r["system"] == system and r["phase"] == "load"]
        assert sorted((r["level"], r["conversation"], r["turn"]) for r in load) == [
            (1, 0, 1), (1, 0, 2), (2, 0, 1), (2, 0, 2), (2, 1, 1), (2, 1, 2)]
        assert all(r["output_tokens"] > 0 and r["ttft_s"] <= r["latency_s"] for r in load)
        for level in (1, 2):  # the server's own count of its forwards over the level (its /metrics)
            engine = next(r["level_engine"] for r in load if r["level"] == level)
            assert engine["forwards"] >= 2 * level and engine["rows"] >= engine["forwards"] and engine["busy_s"] > 0
    assert result["floor"]["reset_digest_equal"] is True
    deletes = [r for r in rows if r["system"] == "unsee" and r.get("step") == "delete"]
    assert [r["round"] for r in deletes] == [0, 1]  # each DELETE's floor timed after it, its reset at its digest
    assert all(r["floor"]["reset_digest_equal"] and r["floor"]["wall_s"] > 0 and r["forward_calls"] > 0
               for r in deletes)
    steps = [r["step"] for r in rows if r["system"] == "unsee" and r["phase"] == "delete"]
    assert steps == ["delete", "other alone", "other during delete"] * 2
    assert len(result["summary"]["systems"]["unsee"]["delete"]["round_x_floor_cpu"]) == 2
    assert "unsee responses (conversation)" in (out / "serve-peer.md").read_text()
    assert "2 conversation(s): forwards; conversations per forward; engine busy" in (out / "serve-peer.md").read_text()


def test_forwards_are_read_from_either_server_s_metrics():
    from unsee.bench.serve_peer import get_engine_delta, parse_engine_figures

    ours = ('# HELP unsee_engine_forwards_total forwards\n# TYPE unsee_engine_forwards_total counter\n'
            'unsee_engine_forwards_total{steps="1"} 10.0\nunsee_engine_forwards_total{steps="3"} 4.0\n'
            'unsee_engine_busy_seconds_total 2.5\nunsee_conversations 3.0\n')
    assert parse_engine_figures(ours) == {"forwards": 14.0, "rows": 22.0, "busy_s": 2.5}
    theirs = "# HELP llamacpp:n_decode_total x\nllamacpp:n_decode_total 20\nllamacpp:n_busy_slots_per_decode 1.5\n"
    assert parse_engine_figures(theirs) == {"forwards": 20.0, "rows": 30.0, "busy_s": None}
    assert parse_engine_figures("# nothing\nother_metric 1\n") is None
    later = {"forwards": 26.0, "rows": 50.0, "busy_s": None}
    assert get_engine_delta(parse_engine_figures(theirs), later) == {"forwards": 6.0, "rows": 20.0, "busy_s": None}
    assert get_engine_delta(None, later) is None


def test_llama_server_is_the_reference_where_it_ran():
    """With llama-server in the run the goals are issue 50's against it (8 conversations: >= 1.0x)."""
    rows = make_rows("peer", 2.0, 10) + make_rows("llama-server", 1.0, 10) + make_rows("unsee", 1.0, 10)
    summary = summarise(rows, None, WORKLOAD)
    by_name = {g["goal"]: g for g in summary["goals"]}
    concurrent = by_name["8 concurrent conversations: aggregate tokens/s vs llama-server"]
    assert concurrent["value"] == 1.0 and concurrent["bar"] == 1.0 and concurrent["met"] and concurrent["issue"] == 50
    assert by_name["1 conversation: output tokens/s vs llama-server"]["value"] == 1.0
    assert not any("llama_cpp.server" in g["goal"] for g in summary["goals"])
    label = {"build": "abc1234", "cpu": "c", "cores": 2, "load_average": 1.0, "threads": None, "model": "m",
             "parallel": 8, "command": "python -m unsee.bench.serve_peer --defaults"}
    markdown = format_markdown({"label": label, "summary": summary, "floor": None})
    assert "| goal (issue 50) |" in markdown and "each server with its own thread defaults" in markdown
    assert "llama-server (chat, history resent)" in markdown and FIGURE_LABEL.match(markdown.splitlines()[0])


def test_the_scaling_table_gives_each_systems_growth():
    from unsee.bench.serve_peer_table import format_scaling

    runs = [{"label": {"threads": t}, "summary": summarise(make_rows("llama-server", 2.0 / t, 10)
                                                           + make_rows("unsee", 2.0 / t ** 0.5, 10), None, WORKLOAD)}
            for t in (2, 1)]
    table = format_scaling(runs)
    assert "| llama-server (chat, history resent) | 1 | 5.00 | 10.00 | 2.00x |" in table
    assert "| unsee responses (conversation) | 8 | 5.00 | 7.07 | 1.41x |" in table


def test_a_missing_llama_server_names_the_make_target(tmp_path):
    from unsee.bench.serve_peer import start_llama_server

    with pytest.raises(FileNotFoundError, match="make llama-server"):
        start_llama_server(str(tmp_path / "none"), tmp_path / "m.gguf", "m", None, None, 4096, 8, tmp_path)


def test_runs_of_one_system_each_merge_into_one_table():
    from unsee.bench.serve_peer_table import merge_results

    def run(system: str, seconds: float, load: float) -> dict:
        rows = make_rows(system, seconds, 10)
        label = {"build": "abc1234", "cpu": "c", "cores": 2, "load_average": load, "threads": None, "model": "m",
                 "command": f"python -m unsee.bench.serve_peer --systems {system}"}
        return {"label": label, "summary": summarise(rows, None, WORKLOAD), "floor": None, "rows": rows}

    merged = merge_results([run("llama-server", 2.0, 3.0), run("unsee", 1.0, 5.0)])
    assert set(merged["summary"]["systems"]) == {"llama-server", "unsee"} and merged["label"]["load_average"] == 5.0
    by_name = {g["goal"]: g for g in merged["summary"]["goals"]}
    assert by_name["1 conversation: output tokens/s vs llama-server"]["value"] == 2.0
    assert "--systems llama-server` and `python" in format_markdown(merged)


def test_the_tables_are_written_into_the_docs_region_from_what_is_kept_beside_it(tmp_path):
    """``--docs``: the goal run's table (each goal marked from its measured ratio) and the scaling
    table (labelled) land in their generated regions, rendered from the JSON kept beside the page."""
    from unsee.bench.serve_peer_table import REGIONS, render_region, write_docs
    from unsee.impl.cli.docs import get_markers, get_region

    page = tmp_path / "serve.md"
    page.write_text("".join(f"# {kind}\n{get_markers(name, cmd)[0]}old\n{get_markers(name, cmd)[1]}\n"
                            for kind, (name, _, cmd) in REGIONS.items()))

    def run(threads: int | None, unsee_s: float) -> dict:
        rows = make_rows("llama-server", 1.0, 10) + make_rows("unsee", unsee_s, 10)
        label = {"build": "abc1234", "cpu": "c", "cores": 2, "load_average": 1.0, "threads": threads, "model": "m",
                 "parallel": 8, "command": f"python -m unsee.bench.serve_peer --threads {threads}"}
        return {"label": label, "summary": summarise(rows, None, WORKLOAD), "floor": None, "rows": rows}

    write_docs("goals", [run(None, 2.0)], page)
    write_docs("scaling", [run(2, 1.0), run(1, 2.0)], page)
    text = page.read_text()
    for kind, (name, file, command) in REGIONS.items():
        kept = json.loads((tmp_path / file).read_text())
        assert get_region(text, name, command) == render_region(kind, kept) != "old\n"
    goals = get_region(text, *REGIONS["goals"][::2])
    assert "| 8 concurrent conversations: aggregate tokens/s vs llama-server" in goals
    assert "| 0.50x | >= 1.0x | **no** |" in goals and FIGURE_LABEL.match(goals.splitlines()[0])
    scaling = get_region(text, *REGIONS["scaling"][::2])
    assert FIGURE_LABEL.match(scaling.splitlines()[0]) and "1 and 2 thread(s) each" in scaling
    assert "| unsee responses (conversation) | 8 | 5.00 | 10.00 | 2.00x |" in scaling


def test_the_docs_regions_are_the_kept_runs_rendered_again():
    """docs/serve.md's peer tables are what ``make serve-peer`` / ``make serve-peer-scaling`` wrote
    (rendered again from the JSON beside the page), or say that no run is kept yet."""
    from pathlib import Path

    from unsee.bench.serve_peer_table import REGIONS, render_region
    from unsee.impl.cli.docs import get_region

    docs = Path(__file__).resolve().parents[1] / "docs"
    text = (docs / "serve.md").read_text()
    for kind, (name, file, command) in REGIONS.items():
        region = get_region(text, name, command)
        if (docs / file).exists():
            assert region == render_region(kind, json.loads((docs / file).read_text())), f"run {command}"
        else:
            assert region.startswith("Not run yet") and command in region, region


def test_the_label_says_the_threads_unsee_said_it_runs_on(tmp_path):
    from unsee.bench.serve_peer import get_unsee_threads
    from unsee.bench.serve_peer_table import get_threads_note

    log = tmp_path / "unsee.log"
    log.write_text("unsee serve: llama.cpp decodes on 2 thread(s) and prefills on 2 (--threads, --batch-threads)\n")
    label = {"threads": None, **get_unsee_threads(log)}
    assert label["unsee_threads"] == 2 and label["unsee_batch_threads"] == 2
    assert "unsee decoding a lone conversation's steps on 2 thread(s)" in get_threads_note(label)
    assert get_unsee_threads(tmp_path / "absent.log") == {}
    assert "on one thread" in get_threads_note({"threads": None})  # a run that did not record them


def test_rounds_pool_the_walls_and_give_each_rounds_ratio():
    """--rounds: a level's tokens/s is every round's tokens over every round's wall, and the goals
    give each round's ratio, read within the round (the machine drifts between rounds)."""
    def rounds(system: str, walls: list[float]) -> list[dict]:
        return [{"phase": "load", "level": level, "round": k, "latency_s": 1.0, "ttft_s": 0.5, "output_tokens": 10,
                 "level_wall_s": wall, "level_cpu_s": wall, "system": system}
                for k, wall in enumerate(walls) for level in (1, 8)]

    summary = summarise(rounds("llama-server", [1.0, 4.0]) + rounds("unsee", [2.0, 2.0]), None, WORKLOAD)
    level = summary["systems"]["unsee"]["levels"][1]
    assert level["wall_s"] == 4.0 and level["tokens_per_s"] == 5.0 and level["round_tokens_per_s"] == [5.0, 5.0]
    assert level["cpu_per_token_s"] == 0.2
    goal = next(g for g in summary["goals"] if g["goal"].startswith("1 conversation: output tokens/s"))
    assert goal["value"] == 1.25 and goal["detail"].endswith("by round: 0.50x, 2.00x")  # 20 tokens in 4 s and in 5 s


def test_rounds_start_every_server_first_and_alternate_the_order(tmp_path, one_thread):
    out = tmp_path / "peer"
    result = run_unsee_side(out, "--concurrency", "1", "--turns", "1", "--phases", "load", "--rounds", "3")
    order = [(r["round"], r["system"]) for r in result["rows"]]
    assert order == [(0, "unsee-chat"), (0, "unsee"), (1, "unsee"), (1, "unsee-chat"), (2, "unsee-chat"), (2, "unsee")]
    # every round its own conversation, the same one to each system: no server is served a round's
    # prompt from what it cached in an earlier one
    questions = {(r["round"], r["system"]): r["question"] for r in result["rows"]}
    assert len({questions[(round_, "unsee")] for round_ in range(3)}) == 3
    assert all(questions[(round_, "unsee")] == questions[(round_, "unsee-chat")] for round_ in range(3))
    assert len(result["summary"]["systems"]["unsee"]["levels"]["1"]["round_tokens_per_s"]) == 3
    assert "the load phase 3 times" in (out / "serve-peer.md").read_text()


def test_a_rounds_question_shares_no_words_with_the_last_rounds_in_the_same_slot():
    """llama-server's slots reuse any common start of the last prompt a slot held: the label opens
    the question, its round first, so a new round's conversation shares none of its text with the
    one the slot served last round, and a level's with another level's only the round."""
    from os.path import commonprefix

    from unsee.bench.serve_peer import get_turn_text

    assert commonprefix([get_turn_text(0, 1, "2.8"), get_turn_text(0, 1, "1.8")]) == "["
    assert commonprefix([get_turn_text(3, 1, "1.8"), get_turn_text(3, 1, "1.1")]) == "[1."
    assert get_turn_text(5, 2).startswith("[5] Question 2: describe")
