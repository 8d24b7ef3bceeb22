"""Tools: a tool's signature, kind and argument fillers (:class:`Tool`) and
the default tools (:func:`default_tools`): read-only ``fetch(key)`` and
``search(query)``; consequential ``send_message(to, body)`` and
``book(item, date)``.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from unsee.impl.agent.tools.calls import FILLERS, Call
from unsee.impl.agent.tools.environment import Environment


@attrs.frozen
class Tool:
    """A tool's signature, kind, where each argument comes from, and its
    implementation ``run(environment, call) -> result text``."""

    name: str
    params: tuple[str, ...]
    consequential: bool
    run: Callable[[Environment, Call], str] = attrs.field(eq=False, repr=False)
    required: tuple[str, ...] = ()
    fill: tuple[tuple[str, str], ...] = ()  # (param, filler); unlisted params: 'model'

    def __attrs_post_init__(self) -> None:
        for param, filler in self.fill:
            if param not in self.params or filler not in FILLERS:
                raise ValueError(f"tool {self.name!r}: bad filler {param}={filler!r}; fillers are {FILLERS}")

    def get_definition(self) -> dict:
        """The tool as a function schema, the shape chat templates read from ``tools=``: every
        parameter a string, the required ones listed."""
        return {"type": "function", "function": {"name": self.name, "parameters": {
            "type": "object", "properties": {p: {"type": "string"} for p in self.params},
            "required": list(self.required)}}}

    def filler(self, param: str) -> str:
        return dict(self.fill).get(param, "model")

    def with_fill(self, **fill: str) -> Tool:
        merged = dict(self.fill) | fill
        return attrs.evolve(self, fill=tuple((p, merged[p]) for p in self.params if p in merged))


def _fetch(env: Environment, call: Call) -> str:
    key = call.arg("key")
    value = env.get(key)
    return f"{key} = {value}" if value is not None else f"{key}: not found"


def _search(env: Environment, call: Call) -> str:
    query = call.arg("query").casefold()
    hits = sorted((k, v) for k, v in env.data.items() if query in k.casefold() or query in v.casefold())[:3]
    return "\n".join(f"{k} = {v}" for k, v in hits) or f"no results for {call.arg('query')}"


def _send_message(env: Environment, call: Call) -> str:
    to, body = call.arg("to"), call.arg("body")
    env.put(f"outbox/{call.call_id}", f"to {to}: {body}")
    return f"message sent to {to} ({call.call_id})"


def _book(env: Environment, call: Call) -> str:
    what = f"{call.arg('item')} on {call.arg('date')}" if call.arg("date") else call.arg("item")
    env.put(f"bookings/{call.call_id}", what)
    return f"booked {what} ({call.call_id})"


def default_tools() -> dict[str, Tool]:
    """``fetch``/``search`` (read-only) and ``send_message``/``book`` (consequential).

    ``send_message`` replies to the latest tool result: its ``to`` is the last
    address in that result, copied by the scaffold, so the recipient depends
    on what the agent observed (and on a forget target that injected it).
    """
    return {t.name: t for t in (
        Tool("fetch", ("key",), False, _fetch, required=("key",)),
        Tool("search", ("query",), False, _search, required=("query",)),
        Tool("send_message", ("to", "body"), True, _send_message, required=("to",), fill=(("to", "address"),)),
        Tool("book", ("item", "date"), True, _book, required=("item",)),
    )}


__all__ = ["Tool", "default_tools"]
