"""The tool layer's records: calls, environments and tools as plain data
(the session record, impl/store/), and back."""

from __future__ import annotations

from collections import Counter

import attrs

from unsee.impl.agent.tools.calls import Call
from unsee.impl.agent.tools.catalog import Tool, default_tools
from unsee.impl.agent.tools.environment import Environment, SnapshotStore


def get_call_record(call: Call) -> dict:
    return {"call_id": call.call_id, "tool": call.tool, "args": [list(a) for a in call.args],
            "consequential": call.consequential, "step_id": call.step_id, "turn": call.turn, "parse": call.parse,
            "result": call.result, "committed": call.committed}


def load_call(record: dict) -> Call:
    return Call(record["call_id"], record["tool"], tuple((k, v) for k, v in record["args"]),
                record["consequential"], record["step_id"], record["turn"], record["parse"], record["result"],
                record["committed"])


def get_environment_record(env: Environment) -> dict:
    """An environment's content, call-ID ledger, execution counts and blocked re-fires."""
    return {"data": [list(kv) for kv in sorted(env.data.items())],
            "ledger": [get_call_record(c) for c in env.ledger.values()],
            "executions": [[cid, n] for cid, n in env.executions.items()], "blocked": list(env.blocked)}


def load_environment(record: dict, store: SnapshotStore) -> Environment:
    env = Environment({k: v for k, v in record["data"]}, store)
    env.ledger = {c["call_id"]: load_call(c) for c in record["ledger"]}
    env.executions = Counter({cid: n for cid, n in record["executions"]})
    env.blocked = list(record["blocked"])
    return env


def get_tool_record(tool: Tool) -> dict:
    """A tool's signature and fillers (not its code)."""
    return {"name": tool.name, "params": list(tool.params), "consequential": tool.consequential,
            "required": list(tool.required), "fill": [list(f) for f in tool.fill]}


def load_tool(record: dict) -> Tool:
    """A tool rebuilt by name from :func:`default_tools` (with the stored
    argument fillers); a tool that is not a default one gets a stand-in that
    refuses to run until its implementation is put back in ``runtime.tools``."""
    fill = tuple((p, f) for p, f in record["fill"])
    default = default_tools().get(record["name"])
    if default is not None and (list(default.params), default.consequential, list(default.required)) == (
            record["params"], record["consequential"], record["required"]):
        return attrs.evolve(default, fill=fill)

    def missing(env: Environment, call: Call) -> str:
        raise LookupError(f"tool {record['name']!r} is not a default tool and its code is not stored: "
                          "put its implementation back in runtime.tools before running it")

    return Tool(record["name"], tuple(record["params"]), record["consequential"], missing,
                tuple(record["required"]), fill)


__all__ = ["get_call_record", "get_environment_record", "get_tool_record", "load_call", "load_environment",
           "load_tool"]
