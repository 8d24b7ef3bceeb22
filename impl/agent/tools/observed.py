"""The items a client writes into a step, each in its own role (issue 49).

A step of a :class:`~unsee.impl.agent.tools.client.ClientToolRuntime` is one
observation: items with source ids, then one model turn. Most steps hold one
kind of item, the step kind's own: user messages in a ``user`` step, the
outputs of the last turn's calls in a ``tool`` step. A client may also write
the other roles a conversation has (a client that keeps its history, a
session memory that stores every turn): assistant messages, its own
``function_call`` items, outputs that answer no call of the model's, system
or developer messages. Each is an observation like any other: a source the
store names and a forget removes.

The step records the role of each item whose role is not its kind's
(:data:`DEFAULT_ROLES`) as a :data:`Role` tuple, by source id, in the
:class:`~unsee.impl.agent.tools.client.ClientTools` extension; a step that
records none is rendered as before (old stores keep their tokens). The
observation is rendered as *runs* of items, one message each, in the items'
order (:func:`get_runs`), each as the chat template renders its role:

- consecutive user messages are one user message, their texts joined by a
  newline (as a user step always joined its messages);
- consecutive outputs are one tool block, one result segment each (as a tool
  step's);
- an assistant message opens an assistant turn, and the ``function_call``
  items right after it are that turn's calls (the template writes a turn's
  text, then its calls); calls after another role open a turn of their own;
- each system or developer message is a system message, as the template
  renders one after the first (a user message where it renders none there).

Everything a rendering reads is the step's items and their recorded roles,
so a step without an item renders as a step never given it does: a
forget's replay equals the twin.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from unsee.impl.agent.episode import Item, Step
from unsee.impl.agent.tools.native import FunctionCall

#: an item's role as a step records it: ``(role,)``, or ``(role, tool name)`` for a
#: ``function_call`` or a ``function_call_output``
Role = tuple[str, ...]
ROLES = ("user", "assistant", "system", "developer", "function_call", "function_call_output")
#: the role of an item a step records none for: its kind's
DEFAULT_ROLES = {"user": "user", "tool": "function_call_output"}
#: the message a role is rendered in (system and developer alike: the template's system message)
RUN_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant",
             "function_call": "assistant", "function_call_output": "tool"}
#: the roles whose item joins a run of its message role right before it
JOINED = ("user", "function_call", "function_call_output")


def get_role(roles: Mapping[str, Sequence[str]], step: Step, item: Item) -> Role:
    """The role of ``item`` in ``step`` (recorded, else the step kind's)."""
    recorded = roles.get(item.source)
    return tuple(recorded) if recorded else (DEFAULT_ROLES.get(step.kind, "user"),)


def compute_roles(step: Step, roles: Mapping[str, Role]) -> dict[str, Role]:
    """The roles a step records: those of its items that are not its kind's."""
    default = DEFAULT_ROLES.get(step.kind, "user")
    return {i.source: tuple(roles[i.source]) for i in step.items
            if i.source in roles and tuple(roles[i.source])[:1] != (default,)}


def has_roles(roles: Mapping[str, Sequence[str]], step: Step) -> bool:
    return any(i.source in roles for i in step.items)


def get_runs(roles: Mapping[str, Sequence[str]], step: Step) -> list[tuple[str, list[tuple[Item, Role]]]]:
    """The step's items as messages, in order: ``(message role, [(item, its role), ...])``. User
    messages, outputs and calls join a run of their message role before them; an assistant,
    system or developer message opens a run of its own (see the module docstring)."""
    runs: list[tuple[str, list[tuple[Item, Role]]]] = []
    for item in step.items:
        role = get_role(roles, step, item)
        run = RUN_ROLES[role[0]]
        if runs and runs[-1][0] == run and role[0] in JOINED:
            runs[-1][1].append((item, role))
        else:
            runs.append((run, [(item, role)]))
    return runs


def get_call(item: Item, role: Role) -> FunctionCall:
    """A client's ``function_call`` item as the call the template renders: its arguments as the
    template writes them (``tojson``), whatever spacing the client sent."""
    return FunctionCall(role[1], json.dumps(json.loads(item.text), ensure_ascii=False))


def get_tool_label(step: Step, items: Sequence[tuple[Item, Role]]) -> str | None:
    """The tool name a run of outputs is labelled with where the template has no call format:
    the names the outputs were recorded with, else the step's."""
    names = sorted({r[1] for _, r in items if len(r) > 1})
    return ",".join(names) if names else step.tool


__all__ = ["DEFAULT_ROLES", "JOINED", "ROLES", "RUN_ROLES", "Role", "compute_roles", "get_call", "get_role", "get_runs",
           "get_tool_label", "has_roles"]
