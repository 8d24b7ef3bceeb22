"""The OpenAI objects this server answers with, as plain dicts: conversation
items, conversations, responses and their server-sent events, chat completions.
Field names and event names follow the OpenAI API reference (Conversations,
Responses, streaming events, Chat Completions)."""

from __future__ import annotations

import json
import time


def input_item(item_id: str, text: str, kind: str, call_id: str | None) -> dict:
    """A user message, or (a tool step's item) a function_call_output item."""
    if kind == "tool":
        return {"id": item_id, "type": "function_call_output", "call_id": call_id or item_id,
                "output": text, "status": "completed", "role": "tool"}
    return {"id": item_id, "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_text", "text": text}]}


def observed_item(item_id: str, role: str, text: str, call_id: str | None = None, name: str | None = None) -> dict:
    """An item a client wrote, as the API lists it by its role (``user``, ``assistant``,
    ``system``, ``developer``, ``function_call``: ``text`` is its arguments, or
    ``function_call_output``)."""
    if role == "function_call_output":
        return input_item(item_id, text, "tool", call_id)
    if role == "function_call":
        return function_call(item_id, call_id or item_id, name or "function", text)
    if role == "assistant":
        return output_message(item_id, text, True)
    return {"id": item_id, "type": "message", "role": role, "status": "completed",
            "content": [{"type": "input_text", "text": text}]}


def output_message(item_id: str, text: str, complete: bool) -> dict:
    return {"id": item_id, "type": "message", "role": "assistant",
            "status": "completed" if complete else "incomplete",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def reasoning(item_id: str, text: str) -> dict:
    """A Responses reasoning item: the model's ``<think>`` block, as its content's text."""
    return {"id": item_id, "type": "reasoning", "summary": [], "status": "completed",
            "content": [{"type": "reasoning_text", "text": text}]}


def compaction(item_id: str, text: str) -> dict:
    """A Responses compaction item as this server writes it: the summary the model wrote, readable
    (``summary``, the reasoning item's shape); ``encrypted_content`` is empty, as nothing here is
    encrypted (docs/serve.md, "Long conversations")."""
    return {"id": item_id, "type": "compaction", "summary": [{"type": "summary_text", "text": text}],
            "encrypted_content": "", "status": "completed"}


def function_call(item_id: str, call_id: str, name: str, arguments: str) -> dict:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": "completed"}


def public_item(item: dict) -> dict:
    """An item as the API shows it (the internal ``role`` of a tool output is not a field of it)."""
    return {k: v for k, v in item.items() if not (item["type"] == "function_call_output" and k == "role")}


def item_list(items: list[dict]) -> dict:
    data = [public_item(i) for i in items]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": False}


def conversation(record: dict, extra: dict | None = None) -> dict:
    out = {"id": record["id"], "object": "conversation", "created_at": record["created_at"],
           "metadata": record["metadata"]}
    if extra:
        out["unsee"] = extra  # what this server adds: digest, steps, forgotten ids
    return out


def response(response_id: str, model: str, status: str, output: list[dict], *, conversation_id: str | None,
             previous_response_id: str | None, settings, req: dict, usage: dict | None,
             created_at: float | None = None, extra: dict | None = None) -> dict:
    """A Response object; ``req`` (the request as :func:`~.bodies.read_response_request` read it)
    supplies what the response echoes: instructions, tools, tool choice, metadata."""
    incomplete = status == "incomplete"
    tools = [{"type": "function", **json.loads(t)["function"]} for t in req["tools"]]
    choice = ({"type": "function", "name": req["function"]} if req["choice"] == "function" else req["choice"])
    out = {"id": response_id, "object": "response", "created_at": created_at or time.time(), "status": status,
           "model": model, "output": [public_item(i) for i in output], "error": None,
           "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
           "instructions": req["instructions"], "metadata": req["metadata"], "parallel_tool_calls": req["parallel"],
           "temperature": settings.temperature if settings else None, "top_p": req.get("top_p", 1.0),
           "top_logprobs": req.get("logprobs") or 0,
           # the cap the request named (null: the server's default, at most the rest of the context)
           "max_output_tokens": req.get("max_new_tokens"), "tool_choice": choice,
           "tools": tools, "conversation": {"id": conversation_id} if conversation_id else None,
           "previous_response_id": previous_response_id, "store": not req["stateless"], "usage": usage,
           "text": {"format": req.get("format_echo") or {"type": "text"}},
           "truncation": req.get("truncation", "disabled"), "context_management": req.get("context_management")}
    if extra:
        out["unsee"] = extra  # what this server adds (a resumed replay's inputs)
    return out


def usage(input_tokens: int, output_tokens: int) -> dict:
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}


def sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


def message_added(item_id: str, output_index: int) -> list[dict]:
    """The events that open a streamed output message (before its first delta)."""
    empty = output_message(item_id, "", True) | {"status": "in_progress", "content": []}
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    return [{"type": "response.output_item.added", "output_index": output_index, "item": empty},
            {"type": "response.content_part.added", "item_id": item_id, "output_index": output_index,
             "content_index": 0, "part": part}]


def text_delta(item_id: str, output_index: int, delta: str) -> dict:
    return {"type": "response.output_text.delta", "item_id": item_id, "output_index": output_index,
            "content_index": 0, "delta": delta, "logprobs": []}


def message_done(item: dict, output_index: int) -> list[dict]:
    """The events that close a streamed output message, its text whole."""
    text, logprobs = item["content"][0]["text"], item["content"][0].get("logprobs", [])
    where = {"item_id": item["id"], "output_index": output_index, "content_index": 0}
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
    return [{"type": "response.output_text.done", **where, "text": text, "logprobs": logprobs},
            {"type": "response.content_part.done", **where, "part": part},
            {"type": "response.output_item.done", "output_index": output_index, "item": item}]


def call_events(item: dict, output_index: int) -> list[dict]:
    """The events of one function call: added, its arguments (one delta: a call is sent once it
    parses, since a call cut short is text), done."""
    where = {"item_id": item["id"], "output_index": output_index}
    return [{"type": "response.output_item.added", "output_index": output_index,
             "item": {**item, "arguments": "", "status": "in_progress"}},
            {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]},
            {"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"]},
            {"type": "response.output_item.done", "output_index": output_index, "item": item}]


def reasoning_events(item: dict, output_index: int) -> list[dict]:
    """The events of a reasoning item, sent whole at the turn's end: added, its text done, done."""
    return [{"type": "response.output_item.added", "output_index": output_index,
             "item": {**item, "content": [], "status": "in_progress"}},
            {"type": "response.reasoning_text.done", "item_id": item["id"], "output_index": output_index,
             "content_index": 0, "text": item["content"][0]["text"]},
            {"type": "response.output_item.done", "output_index": output_index, "item": item}]


def whole_item_events(item: dict, output_index: int) -> list[dict]:
    """The events of an item sent whole: a reasoning item (at its turn's end) or a compaction item."""
    if item["type"] == "reasoning":
        return reasoning_events(item, output_index)
    return [{"type": "response.output_item.added", "output_index": output_index, "item": item},
            {"type": "response.output_item.done", "output_index": output_index, "item": item}]


def numbered(events: list[dict], start: int) -> list[dict]:
    return [{**e, "sequence_number": start + i} for i, e in enumerate(events)]


def chat_message(text: str | None, calls: list[dict], reasoning_text: str | None = None) -> dict:
    message = {"role": "assistant", "content": text, "refusal": None}
    if reasoning_text:  # vLLM's and llama.cpp's field for a reasoning model's <think> block
        message["reasoning_content"] = reasoning_text
    if calls:
        message["tool_calls"] = calls
    return message


def tool_call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chat_completion(completion_id: str, model: str, message: dict, finish: str, usage_: dict,
                    logprobs: dict | None = None) -> dict:
    return {"id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": logprobs}],
            "usage": usage_}


def chat_chunk(completion_id: str, model: str, delta: dict, finish: str | None = None,
               logprobs: dict | None = None) -> dict:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    if logprobs is not None:  # a stream's log-probabilities come whole, with its last chunk
        choice["logprobs"] = logprobs
    return {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [choice]}


def usage_chunk(completion_id: str, model: str, usage_: dict) -> dict:
    return {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [], "usage": usage_}
