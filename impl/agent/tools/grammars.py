"""The grammars of a turn (issue 49): a call that always parses, a response format that always
matches its schema, written in llguidance's Lark dialect over a template's call format
(:class:`~unsee.impl.agent.tools.native.CallFormat`) and the request's tools.

What a turn may write, by tool choice (the mask is :mod:`unsee.impl.engines.constraints`'):

- ``auto``: free text, until the turn writes one of the openings the model's family uses for a
  call (:data:`~unsee.impl.agent.tools.native.OPENINGS`: the template's own marker, a fenced ``json`` or ``xml`` block, a
  ``<function=NAME>`` tag, a JSON object that opens the turn); from there on the rest of the
  turn is calls in that opening's shape, each naming a tool of the request with arguments
  that match its parameters' schema (a lazy grammar, as llama.cpp's server constrains a call
  once its trigger is seen);
- ``required``: the turn opens with the template's call up to the tool's name (so the model
  writes its own format), and the grammar holds from the first token: a tool's name, its
  arguments, the closing, then more calls where parallel calls are allowed;
- one function: the turn opens with that call up to its arguments; the grammar holds the
  arguments to the schema and closes the call;
- ``none``: the template's call marker is masked (where the model writes it as one token);
- a response format (``json_schema``, ``json_object``): the turn is one JSON value of the
  schema; with tools in ``auto`` it may instead be calls in the template's own format.

A schema llguidance cannot compile is replaced by any JSON object for that tool (the call still
parses; its arguments are not checked), and the request is not refused: clients send schemas
from many generators.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import attrs

from unsee.impl.agent.tools.native import CallFormat
from unsee.impl.engines.constraints import (
    BannedTokens,
    GrammarConstraint,
    LazyConstraint,
    Trigger,
    check_grammar,
    get_lark_literal,
    get_special_id,
)

WS = 'WS: /[ \\t\\r\\n]+/'
ANY_OBJECT = {"type": "object"}


def get_literal(text: str) -> str:
    return get_lark_literal(text.encode("utf-8"))


@attrs.frozen
class Tool:
    """A request's function tool as a grammar sees it: its name and its parameters' schema."""

    name: str
    parameters: Mapping

    @classmethod
    def from_definition(cls, definition: Mapping) -> Tool:
        function = definition["function"]
        return cls(function["name"], get_closed(function.get("parameters") or ANY_OBJECT))


#: the keys of a JSON schema whose values are schemas (a mapping of them, or a list of them)
_SUBSCHEMAS = {"properties": "map", "$defs": "map", "definitions": "map", "items": "one", "not": "one",
               "additionalProperties": "one", "prefixItems": "list", "anyOf": "list", "oneOf": "list",
               "allOf": "list"}


def get_closed(schema):
    """``schema`` with each object that names its ``properties`` and says nothing of others closed
    (``additionalProperties: false``), as llama.cpp's and xgrammar's call grammars read a tool's
    parameters: a small model otherwise writes the schema's own keys into the arguments until its
    output cap cuts the call (SmolLM2-135M under ``required``: 3 of 10 calls). A schema that
    allows other properties, or names none, is kept as it is."""
    if not isinstance(schema, Mapping):
        return schema
    out = {}
    for key, value in schema.items():
        kind = _SUBSCHEMAS.get(key)
        if kind == "map" and isinstance(value, Mapping):
            value = {name: get_closed(sub) for name, sub in value.items()}
        elif kind == "list" and isinstance(value, list):
            value = [get_closed(sub) for sub in value]
        elif kind == "one":
            value = get_closed(value)
        out[key] = value
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def get_tools(definitions: Sequence[Mapping]) -> tuple[Tool, ...]:
    return tuple(Tool.from_definition(d) for d in definitions)


class Grammars:
    """The grammars of one model under one call format: the marker and closing written as the
    model writes them (one special token each, or text); each schema is checked once a process
    (:func:`get_schema`), since a client sends the same tools with every turn."""

    def __init__(self, lm, fmt: CallFormat):
        self.lm = lm
        self.fmt = fmt
        self.tag = fmt.marker.strip()
        self.close_tag = fmt.end.strip()
        # a bracket or a bare object is no marker of its own: never one token to mask or match by id
        own = fmt.shape != "pythonic"
        self.open_id = get_special_id(lm, self.tag) if self.tag and own else None
        self.close_id = get_special_id(lm, self.close_tag) if self.close_tag and own else None

    # --- pieces -----------------------------------------------------------------

    def get_json(self, schema: Mapping) -> str:
        """``%json`` of ``schema`` (:func:`get_schema`)."""
        # not sort_keys: llguidance writes an object's properties in the schema's order
        return f"%json {json.dumps(get_schema(self.lm, schema))}"

    def get_envelope(self, tools: Sequence[Tool], key: str = "arguments") -> str:
        """The JSON object a call is written as: ``{"name": N, KEY: A}``, A of N's schema."""
        options = [{"type": "object", "additionalProperties": False, "required": ["name", key],
                    "properties": {"name": {"const": t.name}, key: get_schema(self.lm, t.parameters)}}
                   for t in tools]
        return self.get_json(options[0] if len(options) == 1 else {"anyOf": options})

    def get_tag(self, token: int | None, text: str) -> str:
        """A marker as a rule item: its special token by id, or its text (nothing where it has none)."""
        return f"<[{token}]>" if token is not None else get_literal(text) if text else ""

    def get_xml_arguments(self, tool: Tool) -> str:
        """Qwen3-Coder's parameters of ``tool``: each property of its schema in order (a required one
        always, another optional), ``<parameter=K>``, a value (one of an enum's strings, else free
        text without ``<``) and the closing; any parameters where the schema names no properties."""
        properties = tool.parameters.get("properties") or {}
        if not properties:
            return '("<parameter=" /[A-Za-z0-9_]+/ ">\\n" XML_VALUE)*'
        required = set(tool.parameters.get("required") or ())
        items = []
        for name, schema in properties.items():
            enum = schema.get("enum") if isinstance(schema, Mapping) else None
            value = "XML_VALUE"
            if enum and all(isinstance(v, str) for v in enum):
                value = "(" + " | ".join(get_literal(f"{v}\n</parameter>\n") for v in enum) + ")"
            item = f"{get_literal(f'<parameter={name}>' + chr(10))} {value}"
            items.append(item if name in required else f"({item})?")
        return " ".join(items)

    def get_arguments(self, tool: Tool) -> str:
        """A call's arguments of ``tool`` in the format's shape, up to the call's own closing."""
        if self.fmt.shape == "xml":
            return f"WS? {self.get_xml_arguments(tool)} {get_literal('</function>')}"
        if self.fmt.shape == "pythonic":
            return f"(py_kwarg (\",\" WS? py_kwarg)*)? {get_literal(')')}"
        json_ = f"WS? {self.get_json(tool.parameters)}"
        return json_ if self.fmt.shape == "name_args" else f"{json_} WS? {get_literal('}')}"

    def get_call(self, tool: Tool) -> str:
        """One call of ``tool`` after the format's opening: its name, what goes between, its arguments."""
        return f"{get_literal(tool.name + self.fmt.between.rstrip())} {self.get_arguments(tool)}"

    def get_native(self, tools: Sequence[Tool]) -> str:
        """``marker_call``: the calls one marker opens, in the format's shape, with its closing."""
        tag, close = self.get_tag(self.open_id, self.tag), self.get_tag(self.close_id, self.close_tag)
        if self.fmt.shape == "envelope":
            return f"{tag} WS? envelope WS? {close}"
        rest = self.fmt.opening[len(self.fmt.marker):]  # what follows the marker up to the name
        one = f"{tag} {get_literal(rest) if rest.strip() else 'WS?'} any_call"
        if self.fmt.shape == "list":
            return f'{tag} WS? "[" WS? envelope (WS? "," WS? envelope)* WS? "]"'
        if self.fmt.shape == "pythonic":
            return '"[" WS? any_call (WS? "," WS? any_call)* WS? "]"'
        return f"{one} WS? {close}" if self.fmt.shape == "xml" else one

    def get_rules(self, tools: Sequence[Tool]) -> str:
        """The rules every call grammar shares: a call in the template's format, in fences, as a tag."""
        functions = " | ".join(f"{get_literal(f'<function={t.name}>')} WS? {self.get_json(t.parameters)} WS? "
                               f"{get_literal('</function>')}" for t in tools)
        any_call = " | ".join(f"({self.get_call(t)})" for t in tools)
        return "\n".join([
            WS,
            # a value and its closing as one lexeme: a value's own newline never competes with the closing's
            'XML_VALUE: /[^<]*\\n<\\/parameter>\\n/',
            'py_kwarg: /[A-Za-z_][A-Za-z0-9_]*/ "=" %json {}',
            f"any_call: {any_call}",
            f"envelope: {self.get_envelope(tools, self.fmt.key)}",
            f"marker_call: {self.get_native(tools)}",
            f'fenced_json: {get_literal("```json")} WS? json_envelope WS? {get_literal("```")}',
            f"json_envelope: {self.get_envelope(tools)}",
            f'fenced_xml: {get_literal("```xml")} WS? marker_call WS? {get_literal("```")}',
            f"function_tag: {functions}",
            "bare_json: json_envelope",
        ])

    def get_calls(self, kind: str, parallel: bool) -> str:
        """The rest of a turn once a call of ``kind`` began: that call, then more where allowed, then
        blanks if the model writes them. Without the trailing blanks a newline after a call would
        commit the turn to another call (qwen2.5-1.5b writes one, and then wrote blanks to its
        output cap instead of ending its turn)."""
        return f"{kind} (WS? {kind})* WS?" if parallel else f"{kind} WS?"

    # --- the grammars ------------------------------------------------------------

    def get_triggers(self, tools: Sequence[Tool], parallel: bool) -> tuple[Trigger, ...]:
        """The lazy grammar of ``auto``: one trigger per opening (native.OPENINGS); the template's
        marker only where it has one (a bare object or list opens the turn instead)."""
        rules = self.get_rules(tools)
        marker = ()
        if self.fmt.shape == "pythonic":
            marker = (Trigger(f"start: {{PREFIX}} WS? {self.get_calls('marker_call', parallel)}\n{rules}",
                              pattern=rb"\A\s*\[", opener=b"["),)
        elif self.tag:
            marker = (Trigger(f"start: {{PREFIX}} {self.get_calls('marker_call', parallel)}\n{rules}",
                              token=self.open_id, pattern=None if self.open_id is not None else self.tag.encode()),)
        texts = {"fenced_json": rb"```json", "fenced_xml": rb"```xml", "function_tag": rb"<function=",
                 "bare_json": rb"\A\s*\{"}
        others = [Trigger(f"start: {{PREFIX}} {'WS? ' if kind == 'bare_json' else ''}{self.get_calls(kind, parallel)}"
                          f"\n{rules}", pattern=pattern, opener=b"{" if kind == "bare_json" else None)
                  for kind, pattern in texts.items() if kind != "bare_json" or self.fmt.key == "arguments"
                  or self.fmt.shape != "envelope"]
        if self.fmt.shape == "envelope" and self.fmt.key != "arguments":  # Llama 3's bare object names `parameters`
            others.append(Trigger(f"start: {{PREFIX}} WS? {self.get_calls('envelope', parallel)}\n{rules}",
                                  pattern=rb"\A\s*\{", opener=b"{"))
        return (*marker, *others)

    def get_required(self, tools: Sequence[Tool], parallel: bool) -> str:
        """``required``: after the call's opening (up to the name), a tool's name, arguments, the
        closing; then more calls in the template's format where allowed."""
        return f"start: first WS?\nfirst: {self.get_first(tools, parallel)}\n{self.get_rules(tools)}"

    def get_first(self, tools: Sequence[Tool], parallel: bool) -> str:
        """The rest of a ``required`` turn after the format's opening."""
        close = self.get_tag(self.close_id, self.close_tag)
        calls = " | ".join(f"({self.get_call(t)})" for t in tools)
        if self.fmt.shape == "list":
            more = ' (WS? "," WS? envelope)*' if parallel else ""
            return f'({calls}){more} WS? "]"'
        if self.fmt.shape == "pythonic":
            more = ' (WS? "," WS? any_call)*' if parallel else ""
            return f'({calls}){more} WS? "]"'
        rest = " (WS? marker_call)*" if parallel else ""
        return f"({calls}) WS? {close}{rest}"

    def get_function(self, tool: Tool) -> str:
        """One function: after the call's opening (up to the arguments), the arguments and the closing."""
        close = self.get_tag(self.close_id, self.close_tag)
        end = {"list": ' WS? "]"', "pythonic": ' WS? "]"'}.get(self.fmt.shape, f" WS? {close}")
        return f"start: WS? {self.get_arguments(tool)}{end} WS?\n{self.get_rules([tool])}"


#: whether llguidance compiles a schema (its canonical text), by model name and vocabulary size
_COMPILES: dict[tuple[str, int, str], bool] = {}


def get_schema(lm, schema: Mapping) -> Mapping:
    """``schema`` where llguidance compiles it over ``lm``'s vocabulary, else any object."""
    key = (lm.name, lm.vocab_size, json.dumps(schema, sort_keys=True))
    if key not in _COMPILES:
        _COMPILES[key] = not check_grammar(lm, f"start: %json {json.dumps(schema)}")
    return schema if _COMPILES[key] else ANY_OBJECT


def get_format_schema(response_format: Mapping) -> Mapping:
    """The JSON schema a response format asks for: ``json_schema``'s schema, or any object."""
    if response_format.get("type") == "json_schema":
        return response_format.get("schema") or ANY_OBJECT
    return ANY_OBJECT


def get_constraints(lm, fmt: CallFormat | None, definitions: Sequence[Mapping], choice: str,
                    function: str | None, parallel: bool, response_format: Mapping | None) -> tuple:
    """The constraints of a turn under a step's tool choice and response format (the module
    docstring); () where nothing constrains it."""
    if response_format is not None and response_format.get("type") == "text":
        response_format = None
    tools = get_tools(definitions)
    grammars = Grammars(lm, fmt) if fmt is not None else None
    if response_format is not None:
        answer = f"%json {json.dumps(get_schema(lm, get_format_schema(response_format)))}"
        if tools and grammars is not None and choice == "auto":
            text = (f"start: answer | {grammars.get_calls('marker_call', parallel)}\nanswer: {answer}\n"
                    f"{grammars.get_rules(tools)}")
        else:
            text = f"start: {answer}"
        return (GrammarConstraint(lm, text),)
    if grammars is None or not tools:
        return ()
    if choice == "none":
        return (BannedTokens(lm.vocab_size, [grammars.open_id]),) if grammars.open_id is not None else ()
    if choice == "required":
        return (GrammarConstraint(lm, grammars.get_required(tools, parallel)),)
    if choice == "function":
        tool = next((t for t in tools if t.name == function), None)
        return (GrammarConstraint(lm, grammars.get_function(tool)),) if tool is not None else ()
    return (LazyConstraint(lm, grammars.get_triggers(tools, parallel)),)


__all__ = ["Grammars", "Tool", "get_closed", "get_constraints", "get_format_schema", "get_schema", "get_tools"]
