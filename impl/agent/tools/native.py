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
to the first opening, then one or more calls separated by whitespace (the last
call's closing may be left out where the turn ends after its JSON object, as
vLLM's Hermes parser reads it). An opening is the template's marker, or one of
the other shapes the model's family writes a call in (:data:`OPENINGS`: a
fenced ``json`` or ``xml`` block, a ``<function=NAME>`` tag, a JSON object
opening the turn), as llama.cpp's server reads them. A turn whose calls do not parse (cut by the
output cap, not JSON, an unknown tool, text after the last call) is text, as vLLM's tool parsers return it: the
model said it, the client reads it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence

import attrs

from unsee.impl.agent.tools.call_shapes import (
    dump,
    get_envelope_call,
    read_list,
    read_name_args,
    read_pythonic,
    read_xml,
    render_pythonic,
    render_xml,
)

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
    #: how the call's text is laid out (:data:`~unsee.impl.agent.tools.call_shapes.SHAPES`) and the
    #: key its JSON object names the arguments by (``envelope`` and ``list``)
    shape: str = "envelope"
    key: str = "arguments"
    #: the family's name (the tool-format table's, :mod:`unsee.impl.agent.tools.families`)
    family: str = "hermes"

    def render(self, call: FunctionCall) -> str:
        if self.shape == "xml":
            return f"{self.marker}{render_xml(call.name, call.arguments)}\n{self.end}"
        if self.shape == "pythonic":
            return render_pythonic([(call.name, call.arguments)])
        return f"{self.opening}{call.name}{self.between}{call.arguments}{self.after}"

    def render_calls(self, calls: Sequence[FunctionCall]) -> str:
        """The calls of one turn as the family writes them (one list for the list shapes)."""
        if self.shape == "pythonic":
            return render_pythonic([(c.name, c.arguments) for c in calls]) if calls else ""
        if self.shape == "list" and calls:
            listed = ", ".join(f'{{"name": {dump(c.name)}, "{self.key}": {c.arguments}}}' for c in calls)
            return f"{self.marker}[{listed}]"
        return self.separator.join(self.render(c) for c in calls)

    def render_turn(self, text: str, calls: Sequence[FunctionCall]) -> str:
        """A turn's content with ``text`` then ``calls``, as the template lays out an assistant
        message with tool calls (content, a newline, the calls one a line)."""
        rendered = self.render_calls(calls)
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


#: Where a call may open in a turn, besides the template's own marker (issue 49): a fenced
#: ``json`` block holding the call's JSON object, a fenced ``xml`` block holding a call in the
#: template's format, a ``<function=NAME>`` tag before the arguments, or the JSON object
#: itself opening the turn. Qwen2.5-Coder writes the fenced form when not forced; llama.cpp's
#: Hermes handler reads the same openings. impl/agent/tools/grammars.py constrains each.
FENCED_JSON, FENCED_XML, FUNCTION_TAG, FENCE_END = "```json", "```xml", "<function=", "```"
OPENINGS = ("marker", "fenced_json", "fenced_xml", "function_tag", "bare_json")
_BARE = re.compile(r"\s*\{")
_FUNCTION = re.compile(r"<function=([A-Za-z0-9_.:-]{1,64})>")


THINK, END_THINK = "<think>", "</think>"


def split_reasoning(text: str) -> tuple[str, str]:
    """``(reasoning, rest)`` of a model's turn: the ``<think>`` block a reasoning model opens its turn
    with (its opening may be the generation prompt's, so a turn may hold only the closing), and what
    follows it; ``("", text)`` where the turn has none. A ``<think>`` later in the turn is text."""
    stripped = text.lstrip()
    if END_THINK not in text or (THINK in text and not stripped.startswith(THINK)):
        return "", text
    reasoning, rest = stripped.split(END_THINK, 1)
    return reasoning.removeprefix(THINK).strip(), rest.lstrip()


def get_marker_at(fmt: CallFormat, text: str) -> int:
    """Where the template's own marker first opens a call in ``text`` (-1: nowhere). A format whose
    marker is no text of its own (Llama 3's bare object, the pythonic list's bracket) opens only at
    the turn's start."""
    tag = fmt.marker.strip()
    if fmt.shape == "pythonic":
        return len(text) - len(text.lstrip()) if text.lstrip().startswith("[") else -1
    return text.find(tag) if tag else -1


def get_openings_at(fmt: CallFormat, text: str, openings: Collection[str]) -> list[tuple[int, str]]:
    """Each opening of ``openings`` found in ``text``, as (where it starts, which), earliest first."""
    found = []
    starts = {"fenced_json": FENCED_JSON, "fenced_xml": FENCED_XML, "function_tag": FUNCTION_TAG}
    marker = get_marker_at(fmt, text)
    if "marker" in openings and marker >= 0:
        found.append((marker, "marker"))
    for kind, token in starts.items():
        at = text.find(token)
        if kind in openings and at >= 0:
            found.append((at, kind))
    bare = _BARE.match(text)
    if "bare_json" in openings and bare:
        found.append((bare.end() - 1, "bare_json"))
    return sorted(found)


def parse_turn(fmt: CallFormat | None, text: str, names: Collection[str],
               openings: Collection[str] = OPENINGS) -> tuple[str, tuple[FunctionCall, ...], bool]:
    """``(text, calls, well_formed)`` of a model's turn: its text before the first call (stripped)
    and its calls of tools named in ``names``, each opened by any of ``openings``; a turn without
    an opening is text with no calls; one whose calls do not parse is all text, ``well_formed``
    False. Where no tool is named, nothing is a call."""
    found = get_openings_at(fmt, text, openings) if fmt is not None and names else []
    if not found:
        return text.strip(), (), True
    start = found[0][0]
    calls, pos = [], start
    while pos < len(text):
        read = None
        for kind in openings:
            read = read_opening(kind, fmt, text, pos, names)
            if read is not None:
                break
        if read is None:
            return text.strip(), (), False
        calls.extend(read[0])
        pos = _SPACE.match(text, read[1]).end()
    return text[:start].strip(), tuple(calls), True


def read_opening(kind: str, fmt: CallFormat, text: str, pos: int, names: Collection[str]
                 ) -> tuple[tuple[FunctionCall, ...], int] | None:
    """The calls of opening ``kind`` written at ``pos`` and where they end, or None."""
    if kind == "marker":
        return read_call(fmt, text, pos, names)
    if kind == "fenced_json" and text.startswith(FENCED_JSON, pos):
        found = read_envelope(text, pos + len(FENCED_JSON), names)
        return None if found is None else read_closing(found, text, FENCE_END)
    if kind == "fenced_xml" and text.startswith(FENCED_XML, pos):
        found = read_call(fmt, text, _SPACE.match(text, pos + len(FENCED_XML)).end(), names, closed=True)
        return None if found is None else read_closing(found, text, FENCE_END)
    if kind == "function_tag":
        m = _FUNCTION.match(text, pos)
        if m is None or m.group(1) not in names:
            return None
        found = read_object(text, m.end())
        if found is None:
            return None
        return read_closing(((FunctionCall(m.group(1), json.dumps(found[0], ensure_ascii=False)),), found[1]), text,
                            "</function>")
    if kind == "bare_json" and text.startswith("{", pos) and not text[:pos].strip():
        return read_envelope(text, pos, names)
    return None


def read_closing(found: tuple[tuple[FunctionCall, ...], int], text: str, closing: str
                 ) -> tuple[tuple[FunctionCall, ...], int] | None:
    """A call read up to ``found[1]``, then ``closing`` (which the turn's end may leave out)."""
    call, at = found
    at = _SPACE.match(text, at).end()
    if at == len(text):
        return call, at
    return (call, at + len(closing)) if text.startswith(closing, at) else None


def read_object(text: str, pos: int) -> tuple[dict, int] | None:
    """The JSON object at ``pos`` (after whitespace) and where it ends, or None."""
    try:
        value, at = json.JSONDecoder().raw_decode(text, _SPACE.match(text, pos).end())
    except ValueError:
        return None
    return (value, at) if isinstance(value, dict) else None


def read_envelope(text: str, pos: int, names: Collection[str]) -> tuple[tuple[FunctionCall, ...], int] | None:
    """A call's JSON object ``{"name": N, "arguments": A}`` at ``pos`` (``parameters`` is read
    as ``arguments``, as some models write it; A may be a JSON string of the object)."""
    found = read_object(text, pos)
    if found is None:
        return None
    call = get_envelope_call(found[0], names)
    # the arguments as the template writes them (its `tojson`): a client that sends them back
    # gets the tokens the model wrote, where it wrote them the same way
    return None if call is None else ((FunctionCall(*call),), found[1])


def read_call(fmt: CallFormat, text: str, pos: int, names: Collection[str],
              closed: bool = False) -> tuple[tuple[FunctionCall, ...], int] | None:
    """The calls written at ``pos`` in the template's own format (its marker, the call in the
    format's shape, its closing) and where they end, or None where none parses there. The turn's
    end may leave the last call's closing out, unless ``closed`` (inside a fence)."""
    tag = fmt.marker.strip()
    if fmt.shape != "envelope":
        found = read_shape(fmt, text, pos, names)
        return None if found is None else (tuple(FunctionCall(*c) for c in found[0]), found[1])
    if text.startswith(tag, pos):
        pos += len(tag)
    elif fmt.opening.startswith(tag):  # a marker that is optional (Llama 3's `<|python_tag|>`) may be left out
        return None
    found = read_envelope(text, pos, names)
    if found is None:
        return None
    calls, at = found
    end = fmt.end.strip()
    at = _SPACE.match(text, at).end()
    if at == len(text) and not closed:  # the turn ended after the object: a last call's closing may be left out
        return calls, at
    return (calls, at + len(end)) if text.startswith(end, at) else None


def read_shape(fmt: CallFormat, text: str, pos: int, names: Collection[str]):
    """The calls at ``pos`` of a format of another shape than the envelope (:mod:`.call_shapes`)."""
    tag = fmt.marker.strip()
    if fmt.shape == "name_args":
        return read_name_args(text, pos, tag, fmt.between.strip(), names)
    if fmt.shape == "list":
        return read_list(text, pos, tag, names)
    if fmt.shape == "xml":
        return read_xml(text, pos, tag, fmt.end.strip(), names)
    return read_pythonic(text, pos, names)


def split_stream_text(fmt: CallFormat | None, text: str,
                      openings: Collection[str] = OPENINGS) -> tuple[str, bool]:
    """While a turn is decoded: the part of ``text`` that can be sent as text now (not a call,
    not a prefix of an opening, no trailing whitespace, no cut character), and whether an
    opening has begun (the rest waits for the turn's end: it may yet be a call, or text)."""
    text = text.lstrip()
    if fmt is not None:
        found = get_openings_at(fmt, text, openings)
        if found or ("bare_json" in openings and not text):
            return (text[:found[0][0]].rstrip() if found else ""), bool(found)
        starts = [s for k, s in (("marker", fmt.marker.strip()), ("fenced_json", FENCED_JSON),
                                 ("fenced_xml", FENCED_XML), ("function_tag", FUNCTION_TAG)) if k in openings]
        cut = max((n for s in starts for n in range(1, min(len(s), len(text)) + 1) if s.startswith(text[-n:])),
                  default=0)
        text = text[:len(text) - cut]
    return text.rstrip().rstrip("\ufffd").rstrip(), False


__all__ = ["END_THINK", "OPENINGS", "THINK", "CallFormat", "FunctionCall", "canonical_json", "get_call_format", "get_openings_at",
           "parse_turn", "read_call", "read_envelope", "read_opening", "split_reasoning", "split_stream_text"]
