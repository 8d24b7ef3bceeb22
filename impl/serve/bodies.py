"""Strict readers of request bodies: a decoded JSON value in, plain data out,
or :class:`~unsee.impl.serve.errors.ApiError` (400) naming the field.

An unknown field is refused rather than ignored, and so is a value the
server cannot honour (the table of :mod:`.fields`): a client that sends a
parameter this server does not honour (``top_p`` of 0.5, images, ...) learns
so instead of getting an answer computed without it.

An input item becomes ``{"kind", "id", "role", "text", "call_id", "name",
"arguments"}``: ``kind`` is ``message`` (role ``user``, ``assistant``,
``system`` or ``developer``), ``function_call`` (role ``assistant``; its
``text`` is its arguments) or ``function_call_output`` (role ``tool``). Every
kind is read wherever items are (a conversation's create, its items.create,
a response's input): a client-written item is an observation
(docs/serve.md, "Items and steps"). A chat message becomes ``{"role",
"text", "calls", "call_id"}``. Tools become their definitions in the
chat-template shape, as canonical JSON. Only text is read.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from unsee.impl.agent.tools.native import FunctionCall
from unsee.impl.engines.stops import MAX_STOPS
from unsee.impl.serve.compaction import read_context_management
from unsee.impl.serve.errors import bad_request
from unsee.impl.serve.fields import CHAT_FIELDS, LOGPROBS_INCLUDE, RESPONSE_FIELDS, check_fields

#: at most this many items per request, as the Conversations API allows
MAX_ITEMS = 20
#: at most this many input items in a response (a client's whole history, where it keeps it)
MAX_INPUT_ITEMS = MAX_ITEMS * 10
#: the roles a message item may have
MESSAGE_ROLES = ("user", "assistant", "system", "developer")
SYSTEM_ROLES = ("system", "developer")
#: ids a client may give its items (they name sources in the store and in receipts)
ID_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
MESSAGE_FIELDS = {"type", "role", "content", "id", "status", "phase"}
OUTPUT_FIELDS = {"type", "call_id", "output", "id", "name", "status"}
CALL_FIELDS = {"type", "call_id", "name", "arguments", "id", "status"}
CHAT_MESSAGE_FIELDS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"}
TEXT_PART_TYPES = ("input_text", "text", "output_text")
#: a tool's name, as OpenAI's API allows it
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: the largest output cap a request may name (the model's context refuses less: a 400
#: ``context_length_exceeded`` where the prompt and the cap do not fit)
MAX_OUTPUT_TOKENS = 2**24


def read_object(body: Any, fields: set[str], where: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise bad_request(f"{where}: the body must be a JSON object")
    unknown = sorted(set(body) - fields)
    if unknown:
        raise bad_request(f"{where}: unknown field {unknown[0]!r} (this server reads {sorted(fields)})",
                          param=unknown[0], code="unknown_parameter")
    return body


def read_text(content: Any, param: str) -> str:
    """A message's content: a string, or a list of text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise bad_request(f"{param}: must be a string or a non-empty list of text parts", param=param)
    texts = []
    for i, part in enumerate(content):
        where = f"{param}[{i}]"
        if not isinstance(part, Mapping) or part.get("type") not in TEXT_PART_TYPES:
            raise bad_request(f"{where}: only text parts ({', '.join(TEXT_PART_TYPES)}) are read", param=where)
        unknown = sorted(set(part) - {"type", "text", "annotations", "logprobs"})
        if unknown or not isinstance(part.get("text"), str):
            raise bad_request(f"{where}: a text part is {{'type', 'text'}}"
                              + (f"; unknown field {unknown[0]!r}" if unknown else ""), param=where)
        texts.append(part["text"])
    return "\n".join(texts)


def read_id(raw: Any, param: str) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not ID_PATTERN.match(raw):
        raise bad_request(f"{param}: an item id is 1-64 characters of letters, digits and _.:-", param=param)
    return raw


def new_item(kind: str, role: str, text: str, item_id: str | None = None, call_id: str | None = None,
             name: str | None = None, arguments: str | None = None) -> dict:
    return {"kind": kind, "id": item_id, "role": role, "text": text, "call_id": call_id, "name": name,
            "arguments": arguments}


def read_call_id(raw: Any, param: str) -> str:
    if not isinstance(raw, str) or not raw or len(raw) > 128:
        raise bad_request(f"{param}: a call id is a non-empty string (at most 128 characters)", param=param)
    return raw


def read_arguments(raw: Any, param: str) -> str:
    """A call's arguments: a JSON object's text."""
    try:
        ok = isinstance(raw, str) and isinstance(json.loads(raw), dict)
    except ValueError:
        ok = False
    if not ok:
        raise bad_request(f"{param}: a call's arguments are a JSON object's text", param=param)
    return raw


def read_output_item(raw: Mapping, param: str) -> dict:
    read_object(raw, OUTPUT_FIELDS, param)
    name = raw.get("name")
    if name is not None and (not isinstance(name, str) or not ID_PATTERN.match(name)):
        raise bad_request(f"{param}.name: a function name is 1-64 of letters, digits and _.:-", param=param)
    return new_item("function_call_output", "tool", read_text(raw.get("output"), f"{param}.output"),
                    read_id(raw.get("id"), f"{param}.id"), read_call_id(raw.get("call_id"), f"{param}.call_id"),
                    name or "function")


def read_call_item(raw: Mapping, param: str) -> dict:
    """A ``function_call`` item: its ``text`` is its arguments (what the store observes)."""
    read_object(raw, CALL_FIELDS, param)
    name = raw.get("name")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise bad_request(f"{param}.name: a function name is 1-64 of letters, digits, _ and -", param=f"{param}.name")
    arguments = read_arguments(raw.get("arguments"), f"{param}.arguments")
    return new_item("function_call", "assistant", arguments, read_id(raw.get("id"), f"{param}.id"),
                    read_call_id(raw.get("call_id"), f"{param}.call_id"), name, arguments)


def read_item(raw: Any, param: str) -> dict:
    """One input item of any kind this server reads (a message of any role, a function call,
    a function call's output)."""
    if not isinstance(raw, Mapping):
        raise bad_request(f"{param}: an item must be an object", param=param)
    kind = raw.get("type", "message")
    if kind == "function_call_output":
        return read_output_item(raw, param)
    if kind == "function_call":
        return read_call_item(raw, param)
    if kind != "message":
        raise bad_request(f"{param}.type: {kind!r} items are not read here (message, function_call, "
                          "function_call_output)", param=f"{param}.type")
    read_object(raw, MESSAGE_FIELDS, param)
    if raw.get("role") not in MESSAGE_ROLES:
        raise bad_request(f"{param}.role: {raw.get('role')!r}: expected one of {MESSAGE_ROLES}",
                          param=f"{param}.role")
    return new_item("message", raw["role"], read_text(raw.get("content"), f"{param}.content"),
                    read_id(raw.get("id"), f"{param}.id"))


def read_items(raw: Any, param: str, empty_ok: bool = False, text_ok: bool = False,
               limit: int = MAX_ITEMS) -> list[dict]:
    """A list of at most ``limit`` input items (``text_ok``: a string is one user message, as
    a response's input)."""
    if raw is None and empty_ok:
        return []
    if isinstance(raw, str) and text_ok:
        return [new_item("message", "user", raw)]
    if not isinstance(raw, list) or len(raw) > limit or (not raw and not empty_ok):
        raise bad_request(f"{param}: must be a list of 1 to {limit} items", param=param)
    items = [read_item(r, f"{param}[{i}]") for i, r in enumerate(raw)]
    ids = [i["id"] for i in items if i["id"] is not None]
    if len(set(ids)) != len(ids):
        raise bad_request(f"{param}: duplicate item id", param=param)
    return items


def read_metadata(raw: Any) -> dict:
    if raw is None:
        return {}
    if (not isinstance(raw, Mapping) or len(raw) > 16
            or any(not isinstance(k, str) or len(k) > 64 or not isinstance(v, str) or len(v) > 512
                   for k, v in raw.items())):
        raise bad_request("metadata: up to 16 string keys (64 characters) and string values (512)",
                          param="metadata")
    return dict(raw)


def read_number(body: Mapping, name: str, kind: type, low: float, high: float) -> Any:
    value = body.get(name)
    if value is None:
        return None
    ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not low <= value <= high:
        raise bad_request(f"{name}: must be a{'n integer' if kind is int else ' number'} in [{low}, {high}]",
                          param=name)
    return kind(value)


def read_stop(raw: Any) -> tuple[str, ...]:
    """``stop``: a string or a list of up to :data:`MAX_STOPS` non-empty strings (null: none)."""
    stops = [raw] if isinstance(raw, str) else raw if raw is not None else []
    if (not isinstance(stops, list) or len(stops) > MAX_STOPS
            or any(not isinstance(s, str) or not s for s in stops)):
        raise bad_request(f"stop: a non-empty string or a list of up to {MAX_STOPS} of them", param="stop")
    return tuple(dict.fromkeys(stops))


def read_sampling(body: Mapping, max_name: str) -> dict:
    """A turn's decoding settings (None, or the neutral value, where not given): temperature,
    seed, the output-token cap, top_p, the penalties (Chat Completions' fields; a Responses body
    has none) and the stop texts. Every one is recorded with the turn (docs/serve.md, "Sampling")."""
    top_p = read_number(body, "top_p", float, 0.0, 1.0)
    return {"temperature": read_number(body, "temperature", float, 0.0, 2.0),
            "seed": read_number(body, "seed", int, 0, 2**62),
            "max_new_tokens": read_number(body, max_name, int, 1, MAX_OUTPUT_TOKENS),
            "top_p": 1.0 if top_p is None else top_p,
            "frequency_penalty": read_number(body, "frequency_penalty", float, -2.0, 2.0) or 0.0,
            "presence_penalty": read_number(body, "presence_penalty", float, -2.0, 2.0) or 0.0,
            "stop": read_stop(body.get("stop"))}


def read_logprobs(body: Mapping, chat: bool) -> int | None:
    """How many alternatives each output token's log-probability lists, or None where none are
    asked for: Chat Completions' ``logprobs: true`` (with ``top_logprobs``, 0-20); the Responses
    API's ``include: ["message.output_text.logprobs"]`` (with ``top_logprobs``)."""
    top = read_number(body, "top_logprobs", int, 0, 20)
    if chat:
        asked = read_flag(body, "logprobs")
        if top and not asked:
            raise bad_request("top_logprobs: needs logprobs: true", param="top_logprobs")
    else:
        asked = LOGPROBS_INCLUDE in (body.get("include") or ())
    return (top or 0) if asked else None


def read_flag(body: Mapping, name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{name}: must be true or false", param=name)
    return value


def read_ref(body: Mapping, name: str) -> str | None:
    value = body.get(name)
    if isinstance(value, Mapping) and name == "conversation":  # {"id": ...} is the object form
        read_object(value, {"id"}, name)
        value = value.get("id")
    if value is not None and (not isinstance(value, str) or not value):
        raise bad_request(f"{name}: must be a non-empty string", param=name)
    return value


# --- tools ------------------------------------------------------------------------


def read_tool(raw: Any, param: str, nested: bool) -> str:
    """One function tool as its definition in the chat-template shape (canonical JSON): the
    Responses API's flat ``{"type", "name", ...}``, or (``nested``) Chat Completions'
    ``{"type", "function": {"name", ...}}``."""
    if not isinstance(raw, Mapping) or raw.get("type") != "function":
        kind = raw.get("type") if isinstance(raw, Mapping) else raw
        raise bad_request(f"{param}.type: {kind!r} tools are not served (function tools only: the server runs "
                          "no hosted tool)", param=f"{param}.type")
    spec = raw
    if nested:
        read_object(raw, {"type", "function"}, param)
        spec, param = raw.get("function"), f"{param}.function"
        if not isinstance(spec, Mapping):
            raise bad_request(f"{param}: must be an object", param=param)
    read_object(spec, {"name", "description", "parameters", "strict"} | (set() if nested else {"type"}), param)
    if not isinstance(spec.get("name"), str) or not TOOL_NAME.match(spec["name"]):
        raise bad_request(f"{param}.name: 1-64 letters, digits, _ and -", param=f"{param}.name")
    if spec.get("description") is not None and not isinstance(spec["description"], str):
        raise bad_request(f"{param}.description: must be a string", param=f"{param}.description")
    if spec.get("parameters") is not None and not isinstance(spec["parameters"], Mapping):
        raise bad_request(f"{param}.parameters: must be a JSON schema object", param=f"{param}.parameters")
    if spec.get("strict") not in (None, True, False):
        raise bad_request(f"{param}.strict: must be true or false", param=f"{param}.strict")
    function = {"name": spec["name"]}
    function.update({k: spec[k] for k in ("description", "parameters") if spec.get(k) is not None})
    return json.dumps({"type": "function", "function": function}, ensure_ascii=False)


def read_tools(raw: Any, nested: bool) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > 128:
        raise bad_request("tools: must be a list of at most 128 tools", param="tools")
    tools = tuple(read_tool(t, f"tools[{i}]", nested) for i, t in enumerate(raw))
    names = [json.loads(t)["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise bad_request("tools: two tools share a name", param="tools")
    return tools


def read_tool_choice(raw: Any, tools: tuple[str, ...], nested: bool) -> tuple[str, str | None]:
    """``(choice, function)``: ``auto``/``none``/``required``, or ``function`` and its name."""
    if raw is None:
        return "auto", None
    if raw in ("auto", "none", "required"):
        if raw == "required" and not tools:
            raise bad_request("tool_choice: 'required' needs tools", param="tool_choice")
        return raw, None
    name = None
    if isinstance(raw, Mapping) and raw.get("type") == "function":
        spec = raw.get("function") if nested else raw
        read_object(raw, {"type", "function"} if nested else {"type", "name"}, "tool_choice")
        name = spec.get("name") if isinstance(spec, Mapping) else None
    names = {json.loads(t)["function"]["name"] for t in tools}
    if name not in names:
        raise bad_request(f"tool_choice: {raw!r} is not served: 'auto', 'none', 'required', or a function of "
                          f"tools ({sorted(names)})", param="tool_choice")
    return "function", name


def read_tooling(body: Mapping, nested: bool) -> dict:
    tools = read_tools(body.get("tools"), nested)
    choice, function = read_tool_choice(body.get("tool_choice"), tools, nested)
    return {"tools": tools, "choice": choice, "function": function,
            "parallel": read_flag(body, "parallel_tool_calls", default=True)}


# --- response formats -------------------------------------------------------------

FORMAT_TYPES = ("text", "json_schema", "json_object")


def read_format(raw: Any, param: str, nested: bool) -> str | None:
    """A response format (responses' ``text.format``, chat's ``response_format``, whose schema sits
    under ``json_schema``: ``nested``) as the step records it: ``{"type": "json_schema", "schema":
    ...}`` or ``{"type": "json_object"}`` as JSON text (the schema's key order kept: the grammar
    writes an object's properties in that order), or None for text."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or raw.get("type") not in FORMAT_TYPES:
        raise bad_request(f"{param}.type: one of {list(FORMAT_TYPES)}", param=f"{param}.type")
    kind = raw["type"]
    if kind == "text":
        read_object(raw, {"type"}, param)
        return None
    if kind == "json_object":
        read_object(raw, {"type"}, param)
        return json.dumps({"type": "json_object"})
    spec = raw.get("json_schema") if nested else raw
    read_object(raw, {"type", "json_schema"} if nested else {"type", "name", "schema", "strict", "description"}, param)
    where = f"{param}.json_schema" if nested else param
    if not isinstance(spec, Mapping):
        raise bad_request(f"{where}: must be an object with a schema", param=where)
    if nested:
        read_object(spec, {"name", "schema", "strict", "description"}, where)
    if not isinstance(spec.get("name"), str) or not TOOL_NAME.match(spec["name"]):
        raise bad_request(f"{where}.name: 1-64 letters, digits, _ and -", param=f"{where}.name")
    if not isinstance(spec.get("schema", {}), Mapping):
        raise bad_request(f"{where}.schema: must be a JSON schema object", param=f"{where}.schema")
    if spec.get("strict") not in (None, True, False):
        raise bad_request(f"{where}.strict: must be true or false", param=f"{where}.strict")
    return json.dumps({"type": "json_schema", "schema": spec.get("schema") or {"type": "object"}},
                      ensure_ascii=False)


def get_format_echo(fmt: str | None, raw: Any) -> dict:
    """What a response echoes of its format: the request's own object, or text."""
    return dict(raw) if fmt is not None and isinstance(raw, Mapping) else {"type": "text"}


# --- requests ---------------------------------------------------------------------


def read_instructions(body: Mapping) -> str | None:
    value = body.get("instructions")
    if value is not None and not isinstance(value, str):
        raise bad_request("instructions: must be a string", param="instructions")
    return value


def read_response_request(body: Any) -> dict:
    """A ``POST /v1/responses`` body. ``stateless``: nothing is stored (``store: false``, or a
    client's own history with the model's items in it, without a conversation)."""
    body = check_fields(body, RESPONSE_FIELDS, "responses")
    conversation, previous = read_ref(body, "conversation"), read_ref(body, "previous_response_id")
    if conversation and previous:
        raise bad_request("give conversation or previous_response_id, not both", param="previous_response_id")
    continued = bool(conversation or previous)
    store = read_flag(body, "store", default=True)
    if not store and continued:
        raise bad_request("store: false with a conversation: a stored conversation's every turn is stored (its "
                          "forget needs the log)", param="store")
    items = read_items(body.get("input"), "input", empty_ok=True, text_ok=True, limit=MAX_INPUT_ITEMS)
    # a client's own history (the model's items in it) without a conversation: nothing stored
    stateless = not store or (not continued and any(i["role"] == "assistant" for i in items))
    return {"model": body.get("model"), "conversation": conversation, "previous_response_id": previous,
            "items": items, "stateless": stateless, "instructions": read_instructions(body),
            "stream": read_flag(body, "stream"), "metadata": read_metadata(body.get("metadata")),
            **read_tooling(body, nested=False), **read_sampling(body, "max_output_tokens"),
            **read_text_options(body.get("text")), "logprobs": read_logprobs(body, chat=False),
            **read_context_management(body)}


def read_text_options(raw: Any) -> dict:
    """A response's ``text`` (its format, echoed on the response as the client sent it)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise bad_request("text: must be an object", param="text")
    read_object(raw, {"format", "verbosity"}, "text")
    if raw.get("verbosity") not in (None, "medium"):
        raise bad_request(f"text.verbosity: {raw['verbosity']!r}: `medium` only (the model has no other setting)",
                          param="text.verbosity")
    raw_format = raw.get("format")
    fmt = read_format(raw_format, "text.format", nested=False)
    return {"format": fmt, "format_echo": get_format_echo(fmt, raw_format)}


def read_chat_calls(raw: Any, param: str) -> tuple[tuple[FunctionCall, ...], tuple[str, ...]]:
    """An assistant message's ``tool_calls``: the calls and their ids."""
    if raw is None:
        return (), ()
    if not isinstance(raw, list):
        raise bad_request(f"{param}: must be a list", param=param)
    calls, ids = [], []
    for i, call in enumerate(raw):
        where = f"{param}[{i}]"
        if not isinstance(call, Mapping) or call.get("type", "function") != "function":
            raise bad_request(f"{where}: function calls only", param=where)
        read_object(call, {"id", "type", "function"}, where)
        spec = call.get("function")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
            raise bad_request(f"{where}.function: {{'name', 'arguments'}}", param=where)
        read_object(spec, {"name", "arguments"}, f"{where}.function")
        calls.append(FunctionCall(spec["name"], read_arguments(spec.get("arguments"), f"{where}.function.arguments")))
        ids.append(read_call_id(call.get("id"), f"{where}.id"))
    return tuple(calls), tuple(ids)


def read_chat_message(m: Any, where: str) -> dict:
    if not isinstance(m, Mapping):
        raise bad_request(f"{where}: must be an object", param=where)
    read_object(m, CHAT_MESSAGE_FIELDS, where)
    role = m.get("role")
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise bad_request(f"{where}.role: {role!r} is not read (system, developer, user, assistant, tool)",
                          param=f"{where}.role")
    calls, ids = read_chat_calls(m.get("tool_calls"), f"{where}.tool_calls") if role == "assistant" else ((), ())
    content = m.get("content")
    text = "" if content is None and calls else read_text(content, f"{where}.content")
    call_id = read_call_id(m.get("tool_call_id"), f"{where}.tool_call_id") if role == "tool" else None
    return {"role": role, "text": text, "calls": calls, "call_ids": ids, "call_id": call_id}


def read_chat_request(body: Any) -> dict:
    body = check_fields(body, CHAT_FIELDS, "chat.completions")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages: must be a non-empty list", param="messages")
    out = [read_chat_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
    # system and developer messages anywhere (one per system-prompt part, as Pydantic AI sends them)
    last = next((m for m in reversed(out) if m["role"] not in SYSTEM_ROLES), None)
    if last is None or last["role"] not in ("user", "tool"):
        raise bad_request("messages: the last message other than system ones must be the user's (or tool "
                          "results)", param="messages")
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise bad_request("give max_tokens or max_completion_tokens, not both", param="max_tokens")
    cap = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    options = body.get("stream_options") or {}
    return {"model": body.get("model"), "messages": out, "stream": read_flag(body, "stream"),
            "include_usage": bool(options.get("include_usage")), **read_tooling(body, nested=True),
            **read_sampling(body, cap), "format": read_format(body.get("response_format"), "response_format", True),
            "logprobs": read_logprobs(body, chat=True)}
