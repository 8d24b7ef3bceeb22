"""Strict readers of request bodies: a decoded JSON value in, plain data out,
or :class:`~unsee.impl.serve.errors.ApiError` (400) naming the field.

An unknown field is refused rather than ignored: a client that sends a
parameter this server does not honour (``top_p``, images, ...) learns so
instead of getting an answer computed without it.

An input item becomes ``{"kind", "id", "role", "text", "call_id", "name"}``:
``kind`` is ``message`` or ``function_call_output``. Only text is read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from unsee.impl.serve.errors import bad_request

#: at most this many items per request, as the Conversations API allows
MAX_ITEMS = 20
#: ids a client may give its items (they name sources in the store and in receipts)
ID_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
MESSAGE_FIELDS = {"type", "role", "content", "id", "status", "phase"}
OUTPUT_FIELDS = {"type", "call_id", "output", "id", "name", "status"}
TEXT_PART_TYPES = ("input_text", "text", "output_text")
RESPONSE_FIELDS = {"model", "input", "conversation", "previous_response_id", "stream", "temperature", "seed",
                   "max_output_tokens", "metadata", "store", "instructions", "parallel_tool_calls", "user"}
CHAT_FIELDS = {"model", "messages", "temperature", "seed", "max_tokens", "max_completion_tokens", "stream", "n",
               "user", "stream_options"}
CONVERSATION_FIELDS = {"items", "metadata"}
ITEMS_FIELDS = {"items", "include"}


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


def read_item(raw: Any, param: str, system_ok: bool) -> dict:
    if not isinstance(raw, Mapping):
        raise bad_request(f"{param}: an item must be an object", param=param)
    kind = raw.get("type", "message")
    if kind == "function_call_output":
        read_object(raw, OUTPUT_FIELDS, param)
        if not isinstance(raw.get("call_id"), str) or not raw["call_id"]:
            raise bad_request(f"{param}.call_id: a function_call_output needs a string call_id", param=param)
        name = raw.get("name")
        if name is not None and (not isinstance(name, str) or not ID_PATTERN.match(name)):
            raise bad_request(f"{param}.name: a function name is 1-64 of letters, digits and _.:-", param=param)
        return {"kind": kind, "id": read_id(raw.get("id"), f"{param}.id"), "role": "tool",
                "text": read_text(raw.get("output"), f"{param}.output"), "call_id": raw["call_id"],
                "name": name or "function"}
    if kind != "message":
        raise bad_request(f"{param}.type: {kind!r} items are not read here (message, function_call_output)",
                          param=f"{param}.type")
    read_object(raw, MESSAGE_FIELDS, param)
    roles = ("user", "system", "developer") if system_ok else ("user",)
    if raw.get("role") not in roles:
        why = ("assistant items are the model's own: this server writes them" if raw.get("role") == "assistant"
               else "a system or developer message is read only as the first item of a new conversation"
               if raw.get("role") in ("system", "developer") else f"expected one of {roles}")
        raise bad_request(f"{param}.role: {raw.get('role')!r}: {why}", param=f"{param}.role")
    return {"kind": kind, "id": read_id(raw.get("id"), f"{param}.id"), "role": raw["role"],
            "text": read_text(raw.get("content"), f"{param}.content"), "call_id": None, "name": None}


def read_items(raw: Any, param: str, system_first: bool = False, empty_ok: bool = False,
               text_ok: bool = False) -> list[dict]:
    """A list of input items (``system_first``: its first may be a system
    message; ``text_ok``: a string is one user message, as a response's input)."""
    if raw is None and empty_ok:
        return []
    if isinstance(raw, str) and text_ok:
        return [{"kind": "message", "id": None, "role": "user", "text": raw, "call_id": None, "name": None}]
    if not isinstance(raw, list) or len(raw) > MAX_ITEMS or (not raw and not empty_ok):
        raise bad_request(f"{param}: must be a list of 1 to {MAX_ITEMS} items", param=param)
    items = [read_item(r, f"{param}[{i}]", system_first and i == 0) for i, r in enumerate(raw)]
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


def read_sampling(body: Mapping, max_name: str) -> dict:
    """temperature, seed and the output-token cap (None where not given)."""
    return {"temperature": read_number(body, "temperature", float, 0.0, 2.0),
            "seed": read_number(body, "seed", int, 0, 2**62),
            "max_new_tokens": read_number(body, max_name, int, 1, 4096)}


def read_flag(body: Mapping, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
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


def read_response_request(body: Any) -> dict:
    body = read_object(body, RESPONSE_FIELDS, "responses")
    if body.get("instructions") is not None:
        raise bad_request("instructions: the system prompt is a conversation's, fixed at its creation: "
                          "give it as a system message, the first item", param="instructions")
    if body.get("store") is False:
        raise bad_request("store: every response of this server is stored (its forget needs the log)",
                          param="store")
    if body.get("parallel_tool_calls") not in (None, False, True):
        raise bad_request("parallel_tool_calls: must be true or false", param="parallel_tool_calls")
    conversation, previous = read_ref(body, "conversation"), read_ref(body, "previous_response_id")
    if conversation and previous:
        raise bad_request("give conversation or previous_response_id, not both", param="previous_response_id")
    return {"model": body.get("model"), "conversation": conversation, "previous_response_id": previous,
            "items": read_items(body.get("input"), "input", system_first=not conversation and not previous,
                                empty_ok=True, text_ok=True),
            "stream": read_flag(body, "stream"), "metadata": read_metadata(body.get("metadata")),
            **read_sampling(body, "max_output_tokens")}


def read_chat_request(body: Any) -> dict:
    body = read_object(body, CHAT_FIELDS, "chat.completions")
    if body.get("n") not in (None, 1):
        raise bad_request("n: only n=1 is served", param="n")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages: must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise bad_request(f"{where}: must be an object", param=where)
        read_object(m, {"role", "content", "name"}, where)
        if m.get("role") not in ("system", "developer", "user", "assistant"):
            raise bad_request(f"{where}.role: {m.get('role')!r} is not read (system, developer, user, assistant)",
                              param=f"{where}.role")
        out.append((m["role"], read_text(m.get("content"), f"{where}.content")))
    if out[-1][0] != "user":
        raise bad_request("messages: the last message must be the user's", param="messages")
    if any(role in ("system", "developer") for role, _ in out[1:]):
        raise bad_request("messages: a system message is read only first", param="messages")
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise bad_request("give max_tokens or max_completion_tokens, not both", param="max_tokens")
    cap = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return {"model": body.get("model"), "messages": out, "stream": read_flag(body, "stream"), **read_sampling(body, cap)}
