"""How the model families other than Hermes / Qwen2.5 write a call's text (issue 51), read and written.

A call format (:class:`~unsee.impl.agent.tools.native.CallFormat`) has a *shape*:

- ``envelope``: ``marker`` then the JSON object ``{"name": N, KEY: A}`` (Hermes, Qwen2.5 and Qwen3's
  ``<tool_call>``; Llama 3.x's bare object with ``parameters``, which ``<|python_tag|>`` may open;
  the generic fallback's bare object);
- ``name_args``: ``marker N between A``, calls one after the other (Mistral's newer
  ``[TOOL_CALLS]name[ARGS]{...}``, Devstral, Mistral-Small 3.2);
- ``list``: ``marker`` then one JSON list of envelopes (Mistral's older ``[TOOL_CALLS][{...}]``,
  Granite's ``<|tool_call|>[{...}]``);
- ``xml``: Qwen3-Coder's ``<tool_call>\\n<function=N>\\n<parameter=K>\\nV\\n</parameter>\\n</function>\\n</tool_call>``,
  a value that is a string written as it is, any other as JSON;
- ``pythonic``: ``[f(a=1, b="x"), g()]`` (Llama 3.2's and Gemma's pythonic prompts), values as Python literals.

The readers return ``(calls, end)`` of the calls written at a position, or None where none parse
there; the writers give the text a template writes for calls (what a turn with calls is
prefilled as when a client sends its history back).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Collection, Sequence

SHAPES = ("envelope", "name_args", "list", "xml", "pythonic")
_SPACE = re.compile(r"\s*")
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_XML_FUNCTION = re.compile(r"<function=([A-Za-z0-9_.:-]{1,64})>\s*")
_XML_PARAMETER = re.compile(r"<parameter=([A-Za-z0-9_.:-]{1,64})>\n?(.*?)\n?</parameter>\s*", re.DOTALL)


def dump(value) -> str:
    """A JSON value as templates write it (``tojson``: spaces after separators, no escaping of non-ASCII)."""
    return json.dumps(value, ensure_ascii=False)


def read_object(text: str, pos: int):
    """The JSON value at ``pos`` (after whitespace) and where it ends, or None."""
    try:
        return json.JSONDecoder().raw_decode(text, _SPACE.match(text, pos).end())
    except ValueError:
        return None


def get_envelope_call(envelope, names: Collection[str]) -> tuple[str, str] | None:
    """``(name, arguments)`` of a call's JSON object ``{"name": N, "arguments": A}`` (``parameters``
    read as ``arguments``; A may be a JSON string of the object), or None."""
    if not isinstance(envelope, dict) or set(envelope) not in ({"name", "arguments"}, {"name", "parameters"}):
        return None
    name, arguments = envelope["name"], envelope.get("arguments", envelope.get("parameters"))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(name, str) or name not in names or not isinstance(arguments, dict):
        return None
    return name, dump(arguments)


def read_name_args(text: str, pos: int, marker: str, between: str, names: Collection[str]
                   ) -> tuple[list[tuple[str, str]], int] | None:
    """``marker N between A`` at ``pos``: one call."""
    if not text.startswith(marker, pos):
        return None
    m = _NAME.match(text, pos + len(marker))
    if m is None or m.group() not in names or not text.startswith(between, m.end()):
        return None
    found = read_object(text, m.end() + len(between))
    if found is None or not isinstance(found[0], dict):
        return None
    return [(m.group(), dump(found[0]))], found[1]


def read_list(text: str, pos: int, marker: str, names: Collection[str]) -> tuple[list[tuple[str, str]], int] | None:
    """``marker`` then a JSON list of call objects at ``pos``: every call of the list."""
    if not text.startswith(marker, pos):
        return None
    found = read_object(text, pos + len(marker))
    if found is None or not isinstance(found[0], list) or not found[0]:
        return None
    calls = [get_envelope_call(e, names) for e in found[0]]
    return (calls, found[1]) if all(c is not None for c in calls) else None


def read_xml(text: str, pos: int, marker: str, end: str, names: Collection[str]
             ) -> tuple[list[tuple[str, str]], int] | None:
    """Qwen3-Coder's call at ``pos``: ``marker``, ``<function=N>``, its parameters, ``</function>``,
    ``end`` (which the turn's end may leave out)."""
    if not text.startswith(marker, pos):
        return None
    m = _XML_FUNCTION.match(text, _SPACE.match(text, pos + len(marker)).end())
    if m is None or m.group(1) not in names:
        return None
    arguments, at = {}, m.end()
    while (p := _XML_PARAMETER.match(text, at)) is not None:
        arguments[p.group(1)] = get_xml_value(p.group(2))
        at = p.end()
    if not text.startswith("</function>", at):
        return None
    at = _SPACE.match(text, at + len("</function>")).end()
    if text.startswith(end, at):
        at += len(end)
    elif at != len(text):
        return None
    return [(m.group(1), dump(arguments))], at


def get_xml_value(raw: str):
    """A parameter's value as Qwen3-Coder writes it: JSON where it parses as JSON that is not a
    bare string, else the text itself (a string parameter is written without quotes)."""
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if not isinstance(value, str) else raw


def render_xml_value(value) -> str:
    return value if isinstance(value, str) else dump(value)


def render_xml(name: str, arguments: str) -> str:
    """One call as Qwen3-Coder's template writes it (without the ``<tool_call>`` around it)."""
    params = "".join(f"<parameter={k}>\n{render_xml_value(v)}\n</parameter>\n" for k, v in json.loads(arguments).items())
    return f"<function={name}>\n{params}</function>"


_PY_CONSTANTS = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}


def get_literal(node: ast.expr):
    """A Python literal's value (JSON's ``true``/``false``/``null`` read as names too), or raise ValueError."""
    if isinstance(node, ast.Name) and node.id in _PY_CONSTANTS:
        return _PY_CONSTANTS[node.id]
    if isinstance(node, ast.List):
        return [get_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {get_literal(k): get_literal(v) for k, v in zip(node.keys, node.values)}
    return ast.literal_eval(node)


def read_pythonic(text: str, pos: int, names: Collection[str]) -> tuple[list[tuple[str, str]], int] | None:
    """``[f(a=1), g(b="x")]`` at ``pos``: every call of the list, keyword arguments only."""
    if not text.startswith("[", pos):
        return None
    depth, at, quote = 0, pos, None
    for at in range(pos, len(text)):  # the list's closing bracket, outside strings
        ch = text[at]
        if quote:
            quote = None if ch == quote and text[at - 1] != "\\" else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
            if depth == 0:
                break
    else:
        return None
    try:
        tree = ast.parse(text[pos:at + 1], mode="eval").body
        if not isinstance(tree, ast.List) or not tree.elts:
            return None
        calls = []
        for call in tree.elts:
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and not call.args
                    and call.func.id in names and all(k.arg for k in call.keywords)):
                return None
            calls.append((call.func.id, dump({k.arg: get_literal(k.value) for k in call.keywords})))
    except (SyntaxError, ValueError, TypeError):
        return None
    return calls, at + 1


def render_pythonic(calls: Sequence[tuple[str, str]]) -> str:
    """Calls as one pythonic list (values as Python literals)."""
    def literal(value) -> str:
        if isinstance(value, bool) or value is None:
            return repr(value)
        if isinstance(value, list):
            return "[" + ", ".join(literal(v) for v in value) + "]"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
        return dump(value)
    return "[" + ", ".join(f"{n}(" + ", ".join(f"{k}={literal(v)}" for k, v in json.loads(a).items()) + ")"
                           for n, a in calls) + "]"


__all__ = ["SHAPES", "dump", "get_envelope_call", "get_xml_value", "read_list", "read_name_args", "read_object",
           "read_pythonic", "read_xml", "render_pythonic", "render_xml"]
