"""bench/serve_compaction.py's checks and table (issue 52), on a recorded result: a run whose
files hold the secret, whose twin differs or whose Agents SDK conversation stopped short fails,
and the goal is stated on CPU and on forwards, each against 1.15x."""

from __future__ import annotations

import copy

from unsee.bench.serve_compaction_agents import get_length, get_turn_text
from unsee.bench.serve_compaction_table import get_table, is_ok

LABEL = {"build": "abc1234", "model": "qwen2.5-1.5b", "cpu": "AMD EPYC", "cores": 2, "load_average": 1.0,
         "command": "python -m unsee.bench.serve_compaction --model qwen2.5-1.5b"}
DELETE = {"report": {"tau": 1, "length": 5, "invocations": 5}, "compacted_at": [4], "twin_compacted_at": [4],
          "equals_twin": {"digest": True, "items": True, "next_answer": True}, "restart_digest_equal": True,
          "files_holding_secret": [], "reply_holds_secret": False,
          "delete": {"cpu_s": 10.0, "wall_s": 20.0, "forwards": 121, "prefilled": 160, "decoded": 122},
          "floor": {"cpu_s": 10.0, "wall_s": 20.0, "forwards": 110, "prefilled": 277, "decoded": 95,
                    "reset_digest_equal": True, "summaries_that_read_the_secret": 1},
          "cpu_over_floor": 1.0, "forwards_over_floor": 1.1, "tokens_over_floor": 0.76}
TURN = {"turn": 1, "requests": 2, "tool_calls": 1, "largest_prompt": 563, "conversation_tokens": 3100,
        "cpu_s": 1.0, "wall_s": 2.0, "error": None,
        "compaction": {"read_tokens": 608, "summary_tokens": 53, "kept_tokens": 92, "context_tokens_after": 344}}
RESULT = {"label": LABEL, "ctx_size": 1024, "times": 3.0, "delete": DELETE,
          "agents": {"turns": [TURN], "errors": [], "conversation_tokens": 3100, "times_the_context": 3.03,
                     "compactions": 1}}


def changed(path: tuple, value) -> dict:
    out = copy.deepcopy(RESULT)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def test_a_run_passes_only_where_every_check_held():
    assert is_ok(RESULT)
    assert not is_ok(changed(("delete", "files_holding_secret"), ["c/session.db"]))
    assert not is_ok(changed(("delete", "equals_twin", "next_answer"), False))
    assert not is_ok(changed(("delete", "floor", "reset_digest_equal"), False))
    assert not is_ok(changed(("agents", "times_the_context"), 1.46))
    assert not is_ok(changed(("agents", "errors"), ["MaxTurnsExceeded"]))
    assert is_ok(changed(("delete", "forwards_over_floor"), 1.21))  # the goal is reported, not checked


def test_the_table_states_the_goal_on_cpu_and_on_forwards():
    table = get_table(RESULT)
    assert table.startswith("> build `abc1234`") and "on CPU met, on forwards met" in table
    assert "on CPU met, on forwards not met" in get_table(changed(("delete", "forwards_over_floor"), 1.21))
    assert "| 1 | 2 | 1 | 563 | 608 / 53 / 92 / 344 | 3100 |" in table


def test_the_conversation_length_counts_every_item_but_summaries():
    items = [{"type": "message", "content": [{"text": "a b"}]}, {"type": "compaction", "summary": []},
             {"type": "function_call", "name": "tide", "arguments": "{}"},
             {"type": "function_call_output", "output": "x"}]
    assert get_length(str.split, items) == 2 + 1 + 1 + 1
    assert get_turn_text(0) != get_turn_text(1) and "tide" in get_turn_text(3)
