"""Function calls in the model's own format, for tools a client runs (issue 38).

A template with its own call format (Qwen2.5's ``<tool_call>`` JSON, read by
:func:`~unsee.impl.agent.templates.get_tool_segments` and
:func:`~unsee.impl.agent.templates.get_call_arguments`) writes a call of tool
``N`` with arguments ``A`` as ``opening + N + between + json(A) + after``,
where ``opening`` starts with a marker (``<tool_call>\\n``) and the rest is a
JSON object ``{"name": N, "arguments": A}``. :func:`get_call_format` reads
those pieces from a renderer's segments and keeps them only where a call it
renders parses back (:func:`parse_turn`), so a format this parser cannot read
is never offered.

:func:`parse_turn` splits a model's turn into its text and its calls: text up
to the first marker, then one or more calls separated by whitespace (the last
call's closing may be left out where the turn ends after its JSON object, as
vLLM's Hermes parser reads it). A turn whose calls do not parse (cut by the
output cap, not JSON, an unknown tool, text after the last call) is text, as vLLM's tool parsers return it: the
model said it, the client reads it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence

import attrs

_SPACE = re.compile(r"\s*")


def canonical_json(value) -> str:
    """A JSON value's canonical text (sorted keys, no spaces): what two calls' arguments are compared by."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@attrs.frozen
class FunctionCall:
    """One call a model wrote: the tool's name and its arguments (a JSON object's text)."""

    name: str
    arguments: str

    def get_signature(self) -> tuple[str, str]:
        """What makes two calls the same call (name and canonical arguments), whatever their spacing."""
        return self.name, canonical_json(json.loads(self.arguments))


@attrs.frozen
class CallFormat:
    """Where a template writes a call (see the module docstring): ``marker`` opens it, ``opening``
    is the call up to the tool's name (what a turn that must call opens with), ``between`` goes
    from the name to the arguments, ``after`` closes it; ``end`` is ``after`` past the JSON
    object's closing brace; ``separator`` goes between two calls of one turn."""

    marker: str
    opening: str
    between: str
    after: str
    end: str
    separator: str = "\n"

    def render(self, call: FunctionCall) -> str:
        return f"{self.opening}{call.name}{self.between}{call.arguments}{self.after}"

    def render_turn(self, text: str, calls: Sequence[FunctionCall]) -> str:
        """A turn's content with ``text`` then ``calls``, as the template lays out an assistant
        message with tool calls (content, a newline, the calls one a line)."""
        rendered = self.separator.join(self.render(c) for c in calls)
        return f"{text}\n{rendered}" if text and rendered else text or rendered


def get_call_format(segments, has_native_calls: bool) -> CallFormat | None:
    """The call format of a renderer's ``segments``, or None where the template has none this
    module can parse (no native calls, an envelope that is not the JSON object, a call
    that does not parse back)."""
    if not has_native_calls:
        return None
    call, arguments = segments.tool_call, segments.tool_arguments
    opening = call.before[len(segments.header):]
    closing = segments.closing
    if "{" not in opening or not arguments.after.endswith(closing):
        return None
    after = arguments.after[:len(arguments.after) - len(closing)]
    if not after.lstrip().startswith("}"):
        return None
    end = after[after.index("}") + 1:]
    fmt = CallFormat(opening[:opening.index("{")], opening, arguments.before, after, end)
    probe = (FunctionCall("probe_tool", '{"probe": 1}'), FunctionCall("probe_tool", '{"probe": 2}'))
    ok = parse_turn(fmt, fmt.render_turn("Probe text.", probe), {"probe_tool"}) == ("Probe text.", probe, True)
    return fmt if ok else None


def parse_turn(fmt: CallFormat | None, text: str, names: Collection[str]) -> tuple[str, tuple[FunctionCall, ...], bool]:
    """``(text, calls, well_formed)`` of a model's turn: its text before the first call (stripped)
    and its calls of tools named in ``names``; a turn without a call marker is text with no
    calls; one whose calls do not parse is all text, ``well_formed`` False."""
    start = text.find(fmt.marker) if fmt is not None else -1
    if start < 0:
        return text.strip(), (), True
    calls, pos = [], start
    while pos < len(text):
        found = read_call(fmt, text, pos, names)
        if found is None:
            return text.strip(), (), False
        call, pos = found
        calls.append(call)
        pos = _SPACE.match(text, pos).end()
    return text[:start].strip(), tuple(calls), True


def read_call(fmt: CallFormat, text: str, pos: int, names: Collection[str]) -> tuple[FunctionCall, int] | None:
    """The call written at ``pos`` and where it ends, or None where none parses there."""
    if not text.startswith(fmt.marker, pos):
        return None
    at = _SPACE.match(text, pos + len(fmt.marker)).end()
    try:
        envelope, at = json.JSONDecoder().raw_decode(text, at)
    except ValueError:
        return None
    if not isinstance(envelope, dict) or set(envelope) != {"name", "arguments"}:
        return None
    name, arguments = envelope["name"], envelope["arguments"]
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(name, str) or name not in names or not isinstance(arguments, dict):
        return None
    end = fmt.end.strip()
    at = _SPACE.match(text, at).end()
    if at == len(text):  # the turn ended after the object: a last call's closing may be left out
        end = ""
    elif not text.startswith(end, at):
        return None
    # the arguments as the template writes them (its `tojson`): a client that sends them back
    # gets the tokens the model wrote, where it wrote them the same way
    return FunctionCall(name, json.dumps(arguments, ensure_ascii=False)), at + len(end)


def split_stream_text(fmt: CallFormat | None, text: str) -> tuple[str, bool]:
    """While a turn is decoded: the part of ``text`` that can be sent as text now (not a call,
    not a prefix of a call's marker, no trailing whitespace, no cut character), and whether
    a call marker has begun (the rest waits for the turn's end)."""
    text = text.lstrip()
    if fmt is not None:
        start = text.find(fmt.marker)
        if start >= 0:
            return text[:start].rstrip(), True
        for n in range(min(len(fmt.marker), len(text)), 0, -1):
            if fmt.marker.startswith(text[-n:]):
                text = text[:-n]
                break
    return text.rstrip().rstrip("\ufffd").rstrip(), False


__all__ = ["CallFormat", "FunctionCall", "canonical_json", "get_call_format", "parse_turn", "read_call",
           "split_stream_text"]
