"""Tool calls: their IDs, the :class:`Call` record and the total, deterministic
parse of a model's plan text into arguments (issue 4).

A call's ID is ``f"{step_id}/call"``: the counterfactual replay of the same
step has the same ID, which is what de-duplication keys on.
"""

from __future__ import annotations

import json
import re
import unicodedata

import attrs

from unsee.impl.util.ids import CALL, RESULT, compute_block_id

#: How a read-only tool is served during replay.
#: ``reexecute``: run it again against the shadow environment restored from
#: the checkpoint's snapshot (the paper's A3 mechanism; the default).
#: ``recorded``: serve the result the trajectory recorded for the same call
#: ID and arguments; a call with other arguments falls back to re-execution.
READ_MODES = ("reexecute", "recorded")
# Default: re-execution. The environment here is fully snapshot-able and its
# only writers are the agent's consequential tools, so re-running a read
# against the restored snapshot plus the *counterfactual's* own shadow effects
# yields exactly the counterfactual observation o^cf_t, even when the twin's
# earlier side effects differ from the real ones (a recorded observation would
# hand the twin what the real world showed, e.g. an outbox holding a message
# the twin never sent). Results that differ from the recorded ones are listed
# in the report (``changed_reads``), which is how environment drift shows up.
DEFAULT_READ_MODE = "reexecute"

#: Where a tool parameter's value comes from.
#: ``model``: parsed from the plan the model decoded after ``CALL tool(`` (or, where the
#: template has its own call format, the JSON arguments it wrote: :func:`parse_json_arguments`);
#: ``request``: parsed from the plan step's own text (the user's request);
#: ``address``: the last e-mail address in the latest tool result in context
#: (consequential calls' confirmations do not count), copied by the scaffold.
FILLERS = ("model", "request", "address")

ADDRESS = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
_SPECIAL = re.compile(r"<\|[^|<>]{0,40}\|>")
_NAMED = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)\Z", re.DOTALL)
#: a JSON object's string member, possibly unterminated: ``"name": "value``
_JSON_MEMBER = re.compile(r'"([A-Za-z_][A-Za-z0-9_]*)"\s*:\s*"((?:[^"\\]|\\.)*)')
MAX_ARG_CHARS = 80

#: The divergence kinds a forget report lists.
DIVERGENCE_KINDS = ("changed_arguments", "new_call", "not_made")


def call_id_for(step_id: str) -> str:
    """A plan step's call ID: a function of the step ID alone, so the
    counterfactual replay of the same step issues the same ID."""
    return compute_block_id(step_id, CALL)


def result_source(call_id: str) -> str:
    """The source ID of a call's result observation (a forget may name it)."""
    return compute_block_id(call_id, RESULT)


# --- calls and argument parsing ------------------------------------------------


@attrs.frozen
class Call:
    """One tool call. ``committed`` is true iff the real world holds exactly
    this call's side effect (consequential tools only)."""

    call_id: str
    tool: str
    args: tuple[tuple[str, str], ...]
    consequential: bool
    step_id: str
    turn: int
    parse: str = "ok"  # how the model's plan text parsed: 'ok' or 'fallback'
    result: str = ""
    committed: bool = False

    def arg(self, name: str) -> str:
        return dict(self.args).get(name, "")

    def same_call(self, other: Call) -> bool:
        """Same tool with the same arguments (the call ID is compared by the caller)."""
        return (self.tool, self.args) == (other.tool, other.args)

    def to_json(self) -> dict:
        return {"call_id": self.call_id, "tool": self.tool, "args": dict(self.args), "step_id": self.step_id,
                "turn": self.turn, "committed": self.committed}


def clean_value(text: str) -> str:
    """Make an argument printable and bounded: control and unassigned
    characters become spaces, whitespace collapses, quotes are stripped."""
    text = _SPECIAL.sub(" ", text)  # chat-template markers never reach an argument
    chars = [" " if unicodedata.category(c).startswith(("C", "Z")) or c == "\ufffd" else c for c in text]
    value = " ".join("".join(chars).split())
    return value.strip("\"'` ")[:MAX_ARG_CHARS].strip()


def parse_arguments(params: tuple[str, ...], text: str) -> tuple[dict[str, str], bool]:
    """Total, deterministic parse of ``a, name=b)`` into ``params``.

    Well formed: the argument list is closed by ``)``; the text before the
    first ``)`` is parsed. Fallback (no ``)``): the first line is parsed the
    same way. Parts split on commas (the last parameter takes the rest);
    ``name=value`` parts bind by name, the others fill the remaining
    parameters in order; anything missing is ``''``.
    """
    closed = ")" in text
    body = text[:text.index(")")] if closed else text.split("\n", 1)[0]
    args = {p: "" for p in params}
    if not params or not body.strip():
        return args, closed
    named: dict[str, str] = {}
    positional: list[str] = []
    for part in body.split(",", len(params) - 1):
        m = _NAMED.match(part)
        if m and m.group(1) in args and m.group(1) not in named:
            named[m.group(1)] = clean_value(m.group(2))
        else:
            positional.append(clean_value(part))
    free = iter(positional)
    for p in params:
        args[p] = named[p] if p in named else next(free, "")
    return args, closed


def parse_json_arguments(params: tuple[str, ...], text: str) -> tuple[dict[str, str], bool]:
    """Total, deterministic parse of the arguments a model wrote in its template's own call
    format: a JSON object (then the rest of the call, ignored).

    Well formed: ``text`` opens with a JSON object; its members named in ``params`` bind
    (a value that is not a string is written as JSON), the others are ignored. Fallback
    (the object does not parse, e.g. cut at ``max_new_tokens``): each ``"param": "value``
    found binds, the first one a parameter's. Values are cleaned as :func:`parse_arguments`'
    are; anything missing is ``''``.
    """
    args = {p: "" for p in params}
    try:
        found, _ = json.JSONDecoder().raw_decode(text.lstrip())
    except ValueError:
        found = None
    if isinstance(found, dict):
        for p in params:
            value = found.get(p, "")
            args[p] = clean_value(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
        return args, True
    for name, value in _JSON_MEMBER.findall(text):
        if name in args and not args[name]:
            args[name] = clean_value(_unescape(value))
    return args, False


def _unescape(value: str) -> str:
    """A JSON string's body unescaped, or as it is where it is cut inside an escape."""
    try:
        return json.loads(f'"{value}"')
    except ValueError:
        return value


__all__ = [
    "ADDRESS",
    "DEFAULT_READ_MODE",
    "DIVERGENCE_KINDS",
    "FILLERS",
    "MAX_ARG_CHARS",
    "READ_MODES",
    "Call",
    "call_id_for",
    "clean_value",
    "parse_arguments",
    "parse_json_arguments",
    "result_source",
]
