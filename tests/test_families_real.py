"""bench/families_real.py's pure parts (the clients a machine lacks, the family a server
reports, the families x clients table from a results JSON) and the GGUF ``tool_use``
template's choice. No model, no network: the real run is `make families-real`."""

from __future__ import annotations

import sys
from pathlib import Path

from unsee.bench import families_real as fr
from unsee.bench import serve_agents as sa
from unsee.bench.options import FIGURE_LABEL
from unsee.impl.agent.tools.families import get_family
from unsee.impl.engines.llamacpp.model import pick_chat_template

TEMPLATES = Path(__file__).resolve().parent / "data" / "templates"
LABEL = {"build": "abc1234", "model": "smollm2", "engine": "llamacpp", "cpu": "AMD EPYC", "cores": 2,
         "command": "python -m unsee.bench.families_real", "load_average": 3.2}


def test_every_default_scenario_is_a_serve_agents_scenario_with_a_known_client():
    names = {s.name for s in sa.SCENARIOS}
    assert set(fr.SCENARIOS) <= names
    assert {"agents-chat", "agents-session", "openai-auto"} <= set(fr.SCENARIOS)  # issue 51's three
    assert all(fr.get_client_module(s.name) for s in sa.SCENARIOS)


def test_a_client_the_interpreter_lacks_is_named_and_one_it_has_is_not():
    assert fr.get_missing(sys.executable, "json") is None
    assert "no_such_module_x" in fr.get_missing(sys.executable, "no_such_module_x")
    assert fr.get_missing("/no/such/python", "json").startswith("no interpreter")


def test_the_family_is_the_format_the_server_reported(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("unsee serve: tools are called in the `generic` format (--tool-format sets another)\n")
    assert fr.get_family("gemma3-270m", log) == {"architecture": "gemma3", "size": 253_113_024,
                                                 "call_format": "generic"}
    assert fr.get_family("smollm2", tmp_path / "none.log")["call_format"] == "?"


def test_the_table_has_a_row_per_model_and_a_measured_or_not_run_cell_per_scenario():
    auto = {"scenario": "openai-auto", "prompts": 10, "prompts_with_call": 7, "answer": "x", "wall_s": 40.0,
            "tool_calls": [], "error": None}
    session = {"scenario": "agents-session", "answer": "It is -20 C.", "tool_calls": ["Qaanaaq"], "wall_s": 30.0,
               "server_calls": 1, "error": None, "twin": {"digests": ["d1", "d1"], "items_equal": True}}
    result = {"label": LABEL, "scenarios": ["agents-session", "openai-auto", "smolagents"], "wall_s": 120,
              "models": [{"model": "smollm2", "architecture": "llama", "size": None, "call_format": "generic",
                          "records": [auto, session], "not_run": {"smolagents": "smolagents is not installed"}}]}
    table = fr.format_table(result)
    assert FIGURE_LABEL.search(table)
    row = next(line for line in table.splitlines() if line.startswith("| smollm2"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "smollm2 (llama, `generic`)"
    assert cells[1].startswith("ok (yes (1 run, 1 parsed by the server); twin: digest equal, items equal")
    assert cells[2].startswith("failed (7 of 10 prompts")  # the goal is 9: 7 fails
    assert cells[3] == "not run: smolagents is not installed"


def test_a_gguf_tool_use_template_is_served_where_the_default_renders_no_tools():
    """Hermes 2 Pro / 3 keep their tool format in `tokenizer.chat_template.tool_use`: read, the
    model is of the hermes family; a default template that renders tools keeps its own."""
    tool_use = (TEMPLATES / "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja").read_text()
    chatml = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}"
              "{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}")
    assert get_family(chatml).name == "generic"
    assert pick_chat_template(chatml, tool_use) == tool_use and get_family(tool_use).name == "hermes"
    assert pick_chat_template(None, tool_use) == tool_use
    qwen = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    assert pick_chat_template(qwen, tool_use) == qwen
    assert pick_chat_template(chatml, None) == chatml and pick_chat_template(None, None) is None


def test_runs_of_other_scenarios_merge_by_model():
    first = {"label": LABEL, "scenarios": ["openai-auto", "smolagents"], "wall_s": 60,
             "models": [{"model": "smollm2", "architecture": "llama", "size": None, "call_format": "generic",
                         "records": [{"scenario": "openai-auto", "prompts": 10, "prompts_with_call": 0}],
                         "not_run": {"smolagents": "smolagents is not installed"}}]}
    second = {"label": {**LABEL, "command": "python -m unsee.bench.families_real --scenarios smolagents"},
              "scenarios": ["smolagents"], "wall_s": 30,
              "models": [{"model": "smollm2", "architecture": "llama", "size": None, "call_format": "generic",
                          "records": [{"scenario": "smolagents", "answer": "x"}], "not_run": {}}]}
    merged = fr.merge_results([first, second])
    (row,) = merged["models"]
    assert [r["scenario"] for r in row["records"]] == ["openai-auto", "smolagents"]
    assert row["not_run"] == {} and merged["wall_s"] == 90 and " and " in merged["label"]["command"]
    assert fr.merge_results([first]) is first


def test_a_tools_objects_are_closed_where_they_name_their_properties_and_no_others():
    """As llama.cpp's and xgrammar's call grammars read a tool's parameters: SmolLM2-135M, its
    call forced, wrote the schema's own keys into the arguments until the output cap cut it."""
    from unsee.impl.agent.tools.grammars import Tool, get_closed

    weather = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    assert get_closed(weather) == {**weather, "additionalProperties": False}
    nested = {"type": "object", "properties": {"where": {"type": "object", "properties": {"city": {"type": "string"}}},
                                               "tags": {"type": "array", "items": {"properties": {"k": {}}}}},
              "anyOf": [{"properties": {"a": {}}}], "$defs": {"D": {"properties": {"b": {}}}}}
    closed = get_closed(nested)
    assert closed["properties"]["where"]["additionalProperties"] is False
    assert closed["properties"]["tags"]["items"]["additionalProperties"] is False
    assert closed["anyOf"][0]["additionalProperties"] is False and closed["$defs"]["D"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["tags"]  # an array names no properties
    kept = [{"type": "object"}, {"properties": {"a": {}}, "additionalProperties": True},
            {"properties": {"a": {}}, "patternProperties": {"^x": {}}}]
    assert [get_closed(k) for k in kept] == kept
    assert weather == {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}  # unchanged
    definition = {"type": "function", "function": {"name": "get_weather", "parameters": weather}}
    assert Tool.from_definition(definition).parameters["additionalProperties"] is False


def test_a_note_says_why_a_scenario_no_run_measured_was_not_run():
    row = {"model": "smollm2", "records": [{"scenario": "openai-auto"}], "not_run": {"smolagents": "old reason"}}
    noted = fr.add_notes({"models": [row]}, {"smolagents": "time", "openai-auto": "never shown"})
    assert noted["models"][0]["not_run"] == {"smolagents": "time"}
