"""The OpenAI objects this server answers with, as plain dicts: conversation
items, conversations, responses and their server-sent events, chat completions.
Field names and event names follow the OpenAI API reference (Conversations,
Responses, streaming events, Chat Completions)."""

from __future__ import annotations

import json
import time


def input_item(item_id: str, text: str, kind: str, tool: dict | None) -> dict:
    """A user message, or (a tool step's field) a function_call_output item."""
    if kind == "tool":
        tool = tool or {}
        return {"id": item_id, "type": "function_call_output", "call_id": tool.get("call_id", item_id),
                "output": text, "status": "completed", "role": "tool"}
    return {"id": item_id, "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_text", "text": text}]}


def output_message(item_id: str, text: str, complete: bool) -> dict:
    return {"id": item_id, "type": "message", "role": "assistant",
            "status": "completed" if complete else "incomplete",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


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
             previous_response_id: str | None, settings, metadata: dict, usage: dict | None,
             created_at: float | None = None) -> dict:
    incomplete = status == "incomplete"
    return {"id": response_id, "object": "response", "created_at": created_at or time.time(), "status": status,
            "model": model, "output": [public_item(i) for i in output], "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": None, "metadata": metadata, "parallel_tool_calls": False,
            "temperature": settings.temperature if settings else None, "top_p": None,
            "max_output_tokens": settings.max_new_tokens if settings else None, "tool_choice": "none", "tools": [],
            "conversation": {"id": conversation_id} if conversation_id else None,
            "previous_response_id": previous_response_id, "store": True, "usage": usage,
            "text": {"format": {"type": "text"}}, "truncation": "disabled"}


def usage(input_tokens: int, output_tokens: int) -> dict:
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}


def sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


def split_text(text: str) -> list[str]:
    """Deltas of ``text`` (words with their leading space), joined back to ``text``."""
    pieces, start = [], 0
    for i in range(1, len(text)):
        if text[i] == " " and text[i - 1] != " ":
            pieces.append(text[start:i])
            start = i
    return pieces + [text[start:]] if text else []


def message_events(item: dict, output_index: int) -> list[dict]:
    """The events of one output message: added, its text part's deltas, done."""
    text = item["content"][0]["text"]
    empty = {**item, "status": "in_progress", "content": []}
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    where = {"item_id": item["id"], "output_index": output_index, "content_index": 0}
    return ([{"type": "response.output_item.added", "output_index": output_index, "item": empty},
             {"type": "response.content_part.added", **where, "part": part}]
            + [{"type": "response.output_text.delta", **where, "delta": d, "logprobs": []} for d in split_text(text)]
            + [{"type": "response.output_text.done", **where, "text": text, "logprobs": []},
               {"type": "response.content_part.done", **where, "part": {**part, "text": text}},
               {"type": "response.output_item.done", "output_index": output_index, "item": item}])


def numbered(events: list[dict], start: int) -> list[dict]:
    return [{**e, "sequence_number": start + i} for i, e in enumerate(events)]


def chat_completion(completion_id: str, model: str, text: str, finish: str, usage_: dict) -> dict:
    return {"id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                         "finish_reason": finish, "logprobs": None}],
            "usage": usage_}


def chat_chunks(completion_id: str, model: str, text: str, finish: str) -> list[dict]:
    base = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    body = [{**base, "choices": [{"index": 0, "delta": {"content": d}, "finish_reason": None}]}
            for d in split_text(text)]
    last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
    return [first, *body, last]
