"""Every request field the server reads, one table per route: honoured, accepted
with no effect (and why), or refused (and why). The table is the code's: a
body's fields are checked against it (:func:`check_fields`: an unknown field
is a 400 naming it, a field given a value the server cannot honour is a 400
naming it), and docs/serve.md's field table is rendered from it
(:func:`render_fields_table`, ``python -m unsee.impl.cli.docs --write``).

Fields the ``openai`` client and the Agents SDK send by default are in it
(the Agents SDK sends ``include: []``, ``instructions``, ``tools`` with
``strict: true``; LangChain sends ``stream: false``). Honoured fields are read
by :mod:`.bodies`; this module only refuses the values a field marked
accepted or refused cannot take. No fastapi here: the docs command renders it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from unsee.impl.serve.errors import bad_request

HONOURED, ACCEPTED, REFUSED = "honoured", "accepted, no effect", "refused"


def _any(value: Any) -> bool:
    return True


def _absent(value: Any) -> bool:
    """The values that ask for nothing: null, false, 0, an empty list or object."""
    return value in (None, False, 0, [], {})


def _one_of(*values: Any) -> Callable[[Any], bool]:
    return lambda value: value is None or (not isinstance(value, bool) and value in values)


def _flag(value: Any) -> bool:
    return value is None or isinstance(value, bool)


def _string(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _object_of(keys: Mapping[str, Callable[[Any], bool]]) -> Callable[[Any], bool]:
    """An object (or null) with only ``keys``, each value accepted by its check."""
    def check(value: Any) -> bool:
        return value is None or (isinstance(value, Mapping) and all(k in keys and keys[k](v) for k, v in value.items()))
    return check


#: what ``include`` names to have each output text's log-probabilities returned (with ``top_logprobs``)
LOGPROBS_INCLUDE = "message.output_text.logprobs"
#: what ``include`` may name: the log-probabilities, and output the server never produces (asking
#: for it changes nothing)
INCLUDABLE = (LOGPROBS_INCLUDE, "reasoning.encrypted_content")


def _include(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(v in INCLUDABLE for v in value))


_REASONING = _object_of({"effort": _one_of("none", "minimal", "low", "medium", "high", "xhigh"),
                         "summary": _one_of("auto", "concise", "detailed"),
                         "generate_summary": _one_of("auto", "concise", "detailed")})


@attrs.frozen
class Field:
    """One request field: how this server treats it (``status``), why, and (for a field it does
    not honour) the values it accepts; any other value is a 400 naming the field."""

    name: str
    status: str
    why: str
    accept: Callable[[Any], bool] | None = attrs.field(default=None, eq=False)


RESPONSE_FIELDS = (
    Field("model", ACCEPTED, "the server runs one model (`GET /v1/models`), whatever the name", _string),
    Field("input", HONOURED, "a string (one user message) or up to 200 items: messages (user, assistant, system, "
                             "developer), `function_call`, `function_call_output`; in a conversation each is an "
                             "observation of the next step (docs/serve.md, 'Items and steps'); without one, an "
                             "input with the model's items is the client's own history, stored nowhere"),
    Field("instructions", HONOURED, "the system text of this response; one that differs from the conversation's "
                                    "current system text re-renders the context under it"),
    Field("conversation", HONOURED, "the conversation this response continues (an id or `{\"id\"}`)"),
    Field("previous_response_id", HONOURED, "continues that response's conversation, if it is the latest"),
    Field("store", HONOURED, "true (the default) stores the turn in a conversation; false computes it as a chat "
                             "completion is, storing nothing (its id cannot be continued)"),
    Field("stream", HONOURED, "server-sent events as tokens are decoded"),
    Field("stream_options", ACCEPTED, "events are not padded (`include_obfuscation` asks for padding against a "
                                      "length side channel on shared networks)",
          _object_of({"include_obfuscation": _flag})),
    Field("tools", HONOURED, "function tools, rendered in the model's own chat template; other tool types are "
                             "refused. A call's arguments are decoded under its parameters' schema, `strict` or "
                             "not"),
    Field("tool_choice", HONOURED, "`auto` (the model decides; a call it starts is held to the tools' grammar), "
                                   "`none` (the tools rendered, the call marker masked), `required` or one "
                                   "function (the turn opens with the template's call, held to the grammar)"),
    Field("parallel_tool_calls", HONOURED, "false keeps a turn's first call only"),
    Field("temperature", HONOURED, "per request, recorded with its turn: a forget's replay decodes the turn with "
                                   "it (default 0: greedy)"),
    Field("seed", HONOURED, "per request, recorded with its turn (the seeded race's; no effect at temperature 0)"),
    Field("max_output_tokens", HONOURED, "per request, recorded with its turn; without it, `--max-output-tokens`, "
                                         "else the rest of the context; one the context cannot hold after the "
                                         "prompt is a 400 `context_length_exceeded`"),
    Field("top_p", HONOURED, "per request, recorded with its turn: the seeded race runs over the nucleus (no "
                             "effect at temperature 0)"),
    Field("stop", HONOURED, "not in OpenAI's Responses API, sent by clients that share Chat Completions' "
                            "parameters: up to 4 texts, recorded with the turn; the turn ends once its text holds "
                            "one, returned without it"),
    Field("metadata", HONOURED, "returned on the response (up to 16 string pairs)"),
    Field("include", HONOURED, "`message.output_text.logprobs` returns each output token's log-probability; "
                               "`reasoning.encrypted_content` is accepted with no effect (a reasoning item carries its "
                               "text, never encrypted); other values (search results, images) are refused", _include),
    Field("user", ACCEPTED, "no abuse monitoring here", _string),
    Field("safety_identifier", ACCEPTED, "no abuse monitoring here", _string),
    Field("prompt_cache_key", ACCEPTED, "a conversation keeps its own KV; the chat prefix cache is partitioned by "
                                        "API key, not by this key", _string),
    Field("prompt_cache_retention", ACCEPTED, "KV is kept under `--kv-budget`, not for a time", _string),
    Field("truncation", HONOURED, "`disabled` (the default): a request past the model's context is a 400 "
                                  "`context_length_exceeded`; `auto`: a conversation's turn that would pass the "
                                  "context is compacted first (a summary, never a dropped item: docs/serve.md, "
                                  "'Long conversations')"),
    Field("text", HONOURED, "`format`: `text`, `json_schema` (strict or not: the answer is decoded under the "
                            "schema's grammar, so it always parses) or `json_object`; `verbosity`: `medium` only"),
    Field("reasoning", ACCEPTED, "a reasoning model's `<think>` block comes back as a reasoning item; "
                               "its effort is the model's own", _REASONING),
    Field("service_tier", ACCEPTED, "one tier", _one_of("auto", "default")),
    Field("background", REFUSED, "a response runs while its request is open", _absent),
    Field("top_logprobs", HONOURED, "0-20 alternatives per output token, with `include: "
                                    "[\"message.output_text.logprobs\"]` (not recorded: not state)"),
    Field("prompt", REFUSED, "no stored prompt templates", _absent),
    Field("context_management", HONOURED, "`[{\"type\": \"compaction\", \"compact_threshold\": N}]`: a "
                                         "conversation's turn whose prompt would pass N tokens is compacted "
                                         "first; the compaction item holds the summary, readable, never "
                                         "encrypted (docs/serve.md, 'Long conversations')"),
    Field("max_tool_calls", REFUSED, "no hosted tools run here", _absent),
)

CHAT_FIELDS = (
    Field("model", ACCEPTED, "the server runs one model, whatever the name", _string),
    Field("messages", HONOURED, "system and developer anywhere (the first one, leading, is the system prompt; each "
                                "other one the template's system message), user, assistant (text and "
                                "`tool_calls`), tool"),
    Field("tools", HONOURED, "function tools, in the model's own chat template, their arguments decoded under "
                             "their schemas (see responses)"),
    Field("tool_choice", HONOURED, "`auto`, `none`, `required` or one function"),
    Field("parallel_tool_calls", HONOURED, "false keeps the first call only"),
    Field("stream", HONOURED, "chunks as tokens are decoded, then `[DONE]`"),
    Field("stream_options", HONOURED, "`include_usage` adds a last chunk with the usage; `include_obfuscation` "
                                      "is accepted with no effect",
          _object_of({"include_usage": _flag, "include_obfuscation": _flag})),
    Field("temperature", HONOURED, "per request (chat completions are stateless)"),
    Field("seed", HONOURED, "per request"),
    Field("max_tokens", HONOURED, "the output cap (or `max_completion_tokens`, not both); without either, "
                                  "`--max-output-tokens`, else the rest of the context"),
    Field("max_completion_tokens", HONOURED, "the output cap"),
    Field("n", ACCEPTED, "1 only: one choice per request", _one_of(1)),
    Field("top_p", HONOURED, "the seeded race runs over the nucleus (no effect at temperature 0)"),
    Field("frequency_penalty", HONOURED, "subtracted from a token's logit once per time the completion wrote it"),
    Field("presence_penalty", HONOURED, "subtracted once from the logit of a token the completion wrote"),
    Field("response_format", HONOURED, "`text`, `json_schema` or `json_object`, decoded under the schema's "
                                       "grammar (see responses' `text`)"),
    Field("store", ACCEPTED, "false or null: completions are not stored", _one_of(False)),
    Field("metadata", ACCEPTED, "completions are not stored", _any),
    Field("user", ACCEPTED, "no abuse monitoring here", _string),
    Field("safety_identifier", ACCEPTED, "no abuse monitoring here", _string),
    Field("prompt_cache_key", ACCEPTED, "the prefix cache is partitioned by API key", _string),
    Field("prompt_cache_retention", ACCEPTED, "KV is kept under `--kv-budget`", _string),
    Field("reasoning_effort", ACCEPTED, "a `<think>` block comes back as `reasoning_content`; its "
                                     "effort is the model's own",
          _one_of("none", "minimal", "low", "medium", "high", "xhigh")),
    Field("verbosity", ACCEPTED, "`medium` only", _one_of("medium")),
    Field("service_tier", ACCEPTED, "one tier", _one_of("auto", "default")),
    Field("modalities", ACCEPTED, "text only", lambda v: v is None or v == ["text"]),
    Field("stop", HONOURED, "up to 4 texts (smolagents and LiteLLM send it on every request): the completion "
                            "ends once its text holds one, returned without it (`finish_reason` `stop`)"),
    Field("logprobs", HONOURED, "each output token's log-probability (after penalties, before temperature)"),
    Field("top_logprobs", HONOURED, "0-20 alternatives per token, with `logprobs: true`"),
    Field("audio", REFUSED, "text only", _absent),
    Field("prediction", REFUSED, "no predicted outputs", _absent),
    Field("web_search_options", REFUSED, "no hosted tools", lambda v: v is None),
)

CONVERSATION_FIELDS = (
    Field("items", HONOURED, "up to 20 items of any kind (messages of any role, `function_call`, "
                             "`function_call_output`); a first `system` or `developer` message is the system "
                             "prompt, the others wait for the next response"),
    Field("metadata", HONOURED, "up to 16 string pairs"),
)

ITEMS_FIELDS = (
    Field("items", HONOURED, "up to 20 items of any kind (messages of any role, `function_call`, "
                             "`function_call_output`), waiting for the next response"),
    Field("include", ACCEPTED, "nothing extra to include", _include),
)

COMPACT_FIELDS = (
    Field("model", ACCEPTED, "the server runs one model, whatever the name", _string),
    Field("previous_response_id", HONOURED, "the conversation to compact (its latest response): a `compact` step "
                                            "runs on it, and the next response continues on the summary "
                                            "(docs/serve.md, 'Long conversations')"),
    Field("input", REFUSED, "a client's own history is not compacted here: a compaction item is not accepted back "
                            "as input; compact a stored conversation by its `previous_response_id`",
          lambda v: v is None or v == []),
    Field("instructions", REFUSED, "the summary request is the runtime's own (the one a replay runs again)", _absent),
    Field("prompt_cache_key", ACCEPTED, "a conversation keeps its own KV", _string),
    Field("prompt_cache_retention", ACCEPTED, "KV is kept under `--kv-budget`, not for a time", _string),
)

#: route -> its fields, in the order docs/serve.md lists them
ROUTES = {"POST /v1/responses": RESPONSE_FIELDS, "POST /v1/responses/compact": COMPACT_FIELDS,
          "POST /v1/chat/completions": CHAT_FIELDS,
          "POST /v1/conversations": CONVERSATION_FIELDS, "POST /v1/conversations/{id}/items": ITEMS_FIELDS}


def check_fields(body: Any, fields: tuple[Field, ...], where: str) -> Mapping[str, Any]:
    """``body`` as an object whose every field the table knows and whose every field the
    server does not honour holds a value it accepts; else a 400 naming the first such field."""
    if not isinstance(body, Mapping):
        raise bad_request(f"{where}: the body must be a JSON object")
    known = {f.name: f for f in fields}
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise bad_request(f"{where}: unknown field {unknown[0]!r} (this server reads {sorted(known)}; "
                          "docs/serve.md lists them)", param=unknown[0], code="unknown_parameter")
    for name, value in body.items():
        field = known[name]
        if field.accept is not None and not field.accept(value):
            raise bad_request(f"{where}: {name}={value!r} is not served ({field.status}: {field.why})", param=name,
                              code="unsupported_value")
    return body


def render_fields_table() -> str:
    """docs/serve.md's field table: each route's fields, how they are treated, and why."""
    rows = ["| route | field | here | why |", "|---|---|---|---|"]
    for route, fields in ROUTES.items():
        for f in fields:
            rows.append(f"| `{route}` | `{f.name}` | {f.status} | {f.why.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


__all__ = ["ACCEPTED", "CHAT_FIELDS", "COMPACT_FIELDS", "CONVERSATION_FIELDS", "HONOURED", "INCLUDABLE", "ITEMS_FIELDS", "LOGPROBS_INCLUDE",
           "REFUSED",
           "RESPONSE_FIELDS", "ROUTES", "Field", "check_fields", "render_fields_table"]
