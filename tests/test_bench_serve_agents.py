"""bench/serve_agents.py's pure parts: the scenario list against the client script, the
calls counted in the server's answers, the verdicts, and the table rendered from a
results JSON. No network, no model: the real run is `make serve-agents`."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from unsee.bench import serve_agents as sa
from unsee.bench import serve_agents_clients as clients
from unsee.bench.options import FIGURE_LABEL

ROOT = Path(__file__).resolve().parents[1]
LABEL = {"build": "abc1234", "model": "qwen2.5-1.5b", "engine": "llamacpp", "cpu": "Intel Xeon", "cores": 2,
         "command": "python -m unsee.bench.serve_agents", "load_average": 3.2}


def test_every_scenario_has_a_client_and_no_other():
    assert [s.name for s in sa.SCENARIOS] == list(clients.RUNNERS)
    assert len({s.name for s in sa.SCENARIOS}) == len(sa.SCENARIOS)
    assert {s.venv for s in sa.SCENARIOS} == {"clients", "llamaindex"}


def test_the_done_when_clients_are_all_there():
    """Issue 49's list: the Agents SDK (Runner with a tool in auto, the conversations session
    with a DELETE, output_type), LangGraph's ReAct agent, LangChain's structured output,
    Pydantic AI (a tool on both models, a structured output), smolagents, and LlamaIndex;
    and the goal's ten tool-needing prompts."""
    names = {s.name for s in sa.SCENARIOS}
    assert {"agents-responses", "agents-chat", "agents-session", "agents-output-type", "langgraph-react",
            "langchain-structured", "pydantic-ai-chat", "pydantic-ai-responses", "pydantic-ai-structured",
            "smolagents", "llamaindex", "openai-auto"} <= names
    assert sa.get_scenario("agents-session").twin
    assert sa.get_scenario("openai-auto").at_least == 9 and len(clients.TOOL_PROMPTS) == 10


def test_the_client_script_imports_no_unsee():
    """It runs in the clients' venvs, where unsee is not installed."""
    source = (ROOT / "bench" / "serve_agents_clients.py").read_text()
    assert "import unsee" not in source and "from unsee" not in source


def test_the_extras_are_pinned_exactly():
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("clients", "clients-llamaindex"):
        assert optional[extra] and all("==" in r for r in optional[extra]), extra


def test_result_line_is_read_from_chatter():
    out = "Step 1\nsome framework output\n" + sa.RESULT_MARK + json.dumps({"scenario": "x", "answer": "hi"}) + "\n"
    assert sa.get_result(out) == {"scenario": "x", "answer": "hi"}
    assert sa.get_result("no result here") is None


@pytest.mark.parametrize("response,calls", [
    ({"choices": [{"message": {"tool_calls": [{"id": "a"}, {"id": "b"}]}}]}, 2),
    ({"choices": [{"message": {"content": "```json\n{}\n```"}}]}, 0),
    ({"output": [{"type": "function_call"}, {"type": "message"}]}, 1),
    ('data: {"type": "response.output_item.done", "item": {"type": "function_call"}}\n\n'
     'data: {"type": "response.output_item.done", "item": {"type": "message"}}\n\n', 1),
    ('data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_1"}]}}]}\n\n'
     'data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]}\n\n'
     'data: [DONE]\n\n', 1),
    ("not json", 0),
])
def test_count_calls(response, calls):
    assert sa.count_calls(response) == calls


def test_exchanges_summarised_with_their_refusals():
    refusal = {"error": {"message": "stop is not supported", "type": "invalid_request_error", "param": "stop"}}
    exchanges = [
        {"method": "POST", "path": "/v1/chat/completions", "status": 200, "request": {"messages": []},
         "response": {"choices": [{"message": {"tool_calls": [{"id": "c"}]}}]}},
        {"method": "POST", "path": "/v1/chat/completions", "status": 400, "request": {"stop": ["x"]},
         "response": refusal},
        {"method": "GET", "path": "/v1/conversations/c1", "status": 200, "request": None, "response": {}},
    ]
    summary = sa.summarise_exchanges(exchanges)
    assert summary["requests"] == 3 and summary["model_requests"] == 2 and summary["server_calls"] == 1
    assert summary["failures"] == [{"method": "POST", "path": "/v1/chat/completions", "status": 400,
                                    "request": {"stop": ["x"]}, "response": refusal}]
    assert sa.get_failure_cell(summary) == "400 on /v1/chat/completions (`stop`): stop is not supported"


def test_answer_cell_shows_a_fenced_call_as_written():
    assert sa.get_first_words("It is -20 C in Qaanaaq.") == "It is -20 C in Qaanaaq."
    fenced = sa.get_first_words('```json\n{"name": "get_weather"}\n```')
    assert fenced == '```` ```json {"name": "get_weather"} ``` ````'
    assert sa.get_first_words(" ".join(["word"] * 20), 3) == "word word word ..."


def test_failure_cell_names_no_conversation_and_is_cut():
    record = {"failures": [{"method": "POST", "path": "/v1/conversations/conv_8e01/items", "status": 400,
                            "request": {}, "response": {"error": {"message": "x" * 500, "param": "items[0].role"}}}]}
    cell = sa.get_failure_cell(record)
    assert cell.startswith("400 on /v1/conversations/{id}/items (`items[0].role`): xxx") and cell.endswith(" ...")
    assert len(cell) <= 204


def test_an_exchange_belongs_to_the_scenario_that_sent_it():
    """A request its client left at the timeout ends during the next scenario: it is still
    the first one's, and the harness waits for it before timing the next."""
    recorder = sa.Recorder()
    recorder.scenario = "first"
    sent_by = recorder.start()
    recorder.scenario = "second"
    assert recorder.in_flight == 1 and recorder.wait_idle(0.01) >= 0.01
    recorder.add(sent_by, {"status": 200})
    assert recorder.exchanges == [{"scenario": "first", "status": 200}] and recorder.in_flight == 0
    assert recorder.wait_idle(10) < 1
    assert sa.get_wall_cell({"wall_s": 600, "server_busy_after_s": 95.2}) == "600 s (the server busy 95 s more)"


def test_twin_words():
    assert sa.get_twin_words({"digests": [None, None], "items_equal": True}) == (
        "twin: no digest on either (items only wait), items equal")
    assert sa.get_twin_words({"digests": ["d", "d"], "items_equal": True}) == "twin: digest equal, items equal"


def test_judge():
    tool = sa.get_scenario("agents-responses")
    assert sa.judge(tool, {"answer": "Snow.", "tool_calls": ["Qaanaaq"]}) == (True, "")
    assert sa.judge(tool, {"answer": "Snow.", "tool_calls": []}) == (False, "the tool was never called")
    assert sa.judge(tool, {"answer": '```json {"name": "get_weather"} ```', "tool_calls": []}) == (
        False, "the tool was never called: the call came back as text")
    assert sa.judge(tool, {"timed_out": True}) == (False, "timed out")
    assert sa.judge(tool, {"error": {"status": 400, "message": "no"}}) == (False, "400: no")
    assert not sa.judge(sa.get_scenario("agents-output-type"), {"answer": "{}", "structured": False})[0]
    session = sa.get_scenario("agents-session")
    assert sa.judge(session, {"answer": "a", "tool_calls": ["x"], "twin": {
        "digests": ["d", "d"], "items_equal": False, "equal": False}}) == (
        False, "after the DELETE, not its twin: digests equal, items differ")
    auto = sa.get_scenario("openai-auto")
    assert sa.judge(auto, {"prompts": 10, "prompts_with_call": 9})[0]
    assert not sa.judge(auto, {"prompts": 10, "prompts_with_call": 8})[0]


def test_table_from_a_results_json(tmp_path, capsys):
    records = [
        {"scenario": "agents-responses", "ok": True, "why": "", "answer": "It is -20 C with light snow in Qaanaaq.",
         "tool_calls": ["Qaanaaq"], "server_calls": 1, "failures": [], "wall_s": 41.2},
        {"scenario": "smolagents", "ok": False, "why": "400: stop", "answer": "", "tool_calls": [], "server_calls": 0,
         "failures": [{"method": "POST", "path": "/v1/chat/completions", "status": 400, "request": {},
                       "response": {"error": {"message": "a | b", "param": "stop"}}}], "wall_s": 3.0},
        {"scenario": "openai-auto", "ok": False, "why": "", "prompts": 10, "prompts_with_call": 7, "wall_s": 300},
        {"scenario": "agents-session", "ok": False, "timed_out": True,
         "twin": {"digests": ["a", "b"], "equal": False}, "wall_s": 600},
    ]
    result = {"label": LABEL, "wall_s": 1200, "records": records}
    table = sa.format_table(result)
    lines = table.splitlines()
    assert FIGURE_LABEL.match(lines[0])
    dirty = sa.format_label({**LABEL, "build": "abc1234-dirty"})
    assert FIGURE_LABEL.match(dirty) and dirty.startswith("> build `abc1234` plus uncommitted changes · ")
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| client")]
    assert len(rows) == len(records)
    assert all(row.count(" | ") == 6 for row in rows)  # seven cells: a "|" in a message is escaped
    assert "| ok |" in rows[0] and "yes (1 run, 1 parsed by the server)" in rows[0]
    assert "400 on /v1/chat/completions (`stop`): a \\| b" in rows[1]
    assert "7 of 10 prompts" in rows[2]
    assert "timed out; twin: digest differs, items differ" in rows[3]
    assert lines[-1] == "1 of 4 scenarios ok; the whole run took 20.0 min."
    path = tmp_path / "results.json"
    path.write_text(json.dumps(result))
    assert sa.main(["--table", str(path)]) == 0
    assert capsys.readouterr().out == table


def test_unknown_scenario_refused():
    with pytest.raises(SystemExit):
        sa.parse_args(["--scenarios", "crewai"])
