"""Token streaming (docs/serve.md, "Streaming"): server-sent events as the
model decodes.

The model work runs in a worker thread holding the conversation's lock and
the engine's; a :class:`TurnStream` is the runtime's listener there
(:meth:`~unsee.impl.agent.tools.client.ClientToolRuntime._watch_turn`): after each forward it decodes the
turn's tokens so far and reports the text that can be sent (not the start
of a call, not a cut character), and after each step the answer's items.
Reports cross to the event loop through an asyncio queue
(:func:`open_stream`); :class:`ResponseEvents` and :class:`ChatEvents` turn
them into the Responses API's events or Chat Completions' chunks. The
response generator never holds a lock: the worker alone does, so a later
engine that takes its lock per forward rather than per turn changes nothing
here.

A client that disconnects stops the work too, at the turn's next forward
(:meth:`~unsee.impl.engines.scheduler.Scheduler.cancellable`, as llama.cpp's
server and vLLM stop a request whose client left): the turn fails as any
failed turn does, so the store keeps the conversation as it was before the
request (a step is committed whole or not at all) and a new conversation the
request made is removed. A request that is not streamed is cancelled the same
way when its connection closes (:func:`run_cancellable`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool

from unsee.impl.agent.tools.native import END_THINK, THINK, CallFormat, split_reasoning, split_stream_text
from unsee.impl.engines.scheduler import Cancelled
from unsee.impl.engines.stops import get_sendable
from unsee.impl.serve import shapes
from unsee.impl.serve.conversation import compute_answer_key, get_answer_ids
from unsee.impl.serve.errors import ApiError, server_error
from unsee.impl.util.ids import get_step_id

log = logging.getLogger("unsee.serve")
Emit = Callable[[tuple], None]


class TurnStream:
    """The runtime's listener (worker thread): reports ``("start", info)``, then per turn
    ``("begin", key)``, ``("delta", text)``... and ``("answer", items, sent)``."""

    def __init__(self, lm, call_format: CallFormat | None, emit: Emit):
        self.lm, self.call_format, self.emit = lm, call_format, emit
        self.eos = set(lm.eos_ids)
        self.forced = False  # the turn opens with a call: its text is not streamed
        self.stops: tuple[str, ...] = ()  # the turn's stop texts: neither they nor a start of one is sent
        self.openings: tuple[str, ...] = ()  # where a call may open in the turn (native.OPENINGS)
        self.sent = ""
        #: whether the turn's generation prompt opens a reasoning block (the DeepSeek-R1 distills')
        self.thinking = False
        #: what the start report carries, made from what the work knows then (a response's stub)
        self.describe: Callable[[Any], Any] = lambda info: info

    def start(self, info: Any = None) -> None:
        """Every check passed: the stream opens (an error before this is an HTTP error)."""
        self.emit(("start", self.describe(info)))

    def prepare(self, opening: str, openings: tuple[str, ...] = ()) -> None:
        """The next turn opens with ``opening`` (a call: its text is not streamed), and a call may
        open in it at ``openings`` (native.OPENINGS: text that may yet become a call waits)."""
        self.forced = bool(opening)
        self.openings = openings

    def begin(self, block_id: str, prompt: list[int]) -> None:
        self.sent = ""
        self.emit(("begin", compute_answer_key(get_step_id(block_id), prompt)))

    def tokens(self, ids: list[int]) -> None:
        if self.forced:
            return
        text = self.lm.decode([i for i in ids if i not in self.eos])
        if (self.thinking or text.lstrip().startswith(THINK)) and END_THINK not in text:
            return  # a reasoning block: sent as its own item at the turn's end, never as text
        text = split_reasoning(text)[1]
        visible, _ = split_stream_text(self.call_format, get_sendable(text, self.stops), self.openings)
        if len(visible) > len(self.sent) and visible.startswith(self.sent):
            self.emit(("delta", visible[len(self.sent):]))
            self.sent = visible

    def answer(self, items: list[dict]) -> None:
        self.emit(("answer", items, self.sent))
        self.sent = ""


class ResponseEvents:
    """The Responses API's events of a streamed response, numbered, from the worker's reports
    (the start report carries the response as it starts: in progress, no output)."""

    def __init__(self):
        self.index, self.seq, self.key, self.open, self.start = 0, 0, None, None, {}

    def __call__(self, report: tuple) -> list[dict]:
        kind = report[0]
        if kind == "start":
            self.start = report[1]
            events = [{"type": "response.created", "response": self.start},
                      {"type": "response.in_progress", "response": self.start}]
        elif kind == "begin":
            self.key, events = report[1], []
        elif kind == "delta":
            events = self.open_message(get_answer_ids(self.key, 0)[0]) if self.open is None else []
            events.append(shapes.text_delta(self.open, self.index, report[1]))
        elif kind == "answer":
            events = self.close_answer(report[1], report[2])
        elif kind == "end":
            out = report[1]
            events = [{"type": "response.incomplete" if out["status"] == "incomplete" else "response.completed",
                       "response": out}]
        else:
            error = report[1]
            events = [{"type": "response.failed", "response": {**self.start, "status": "failed",
                                                               "error": {"code": error.code or "server_error",
                                                                         "message": error.message}}}]
        return self.number(events)

    def number(self, events: list[dict]) -> list[dict]:
        out = shapes.numbered(events, self.seq)
        self.seq += len(events)
        return out

    def open_message(self, item_id: str) -> list[dict]:
        self.open = item_id
        return shapes.message_added(item_id, self.index)

    def close_answer(self, items: list[dict], sent: str) -> list[dict]:
        """The rest of a turn's text and its calls, each item closed."""
        events: list[dict] = []
        for item in items:
            if item["type"] in ("reasoning", "compaction"):  # sent whole
                events += shapes.whole_item_events(item, self.index)
            elif item["type"] == "message":
                if self.open is None:
                    events += self.open_message(item["id"])
                text = item["content"][0]["text"]
                rest = text[len(sent):] if text.startswith(sent) else ""
                if rest:
                    events.append(shapes.text_delta(item["id"], self.index, rest))
                events += shapes.message_done(item, self.index)
                self.open = None
            else:
                events += shapes.call_events(item, self.index)
            self.index += 1
        return events


class ChatEvents:
    """Chat Completions' chunks of a streamed completion, from the worker's reports."""

    def __init__(self, completion_id: str, model: str, include_usage: bool):
        self.id, self.model, self.include_usage = completion_id, model, include_usage
        self.calls = 0

    def __call__(self, report: tuple) -> list[dict]:
        kind = report[0]
        if kind == "start":
            return [shapes.chat_chunk(self.id, self.model, {"role": "assistant", "content": ""})]
        if kind == "delta":
            return [shapes.chat_chunk(self.id, self.model, {"content": report[1]})]
        if kind == "answer":
            return self.close_answer(report[1], report[2])
        if kind == "end":
            out = report[1]
            chunks = [shapes.chat_chunk(self.id, self.model, {}, out["finish_reason"], out.get("logprobs"))]
            return chunks + ([shapes.usage_chunk(self.id, self.model, out["usage"])] if self.include_usage else [])
        if kind == "error":
            return [report[1].to_json()]
        return []  # a turn begins: chunks carry no item ids

    def close_answer(self, items: list[dict], sent: str) -> list[dict]:
        chunks = []
        for item in items:
            if item["type"] == "reasoning":
                chunks.append(shapes.chat_chunk(self.id, self.model, {"reasoning_content": item["content"][0]["text"]}))
            elif item["type"] == "message":
                text = item["content"][0]["text"]
                if text.startswith(sent) and text[len(sent):]:
                    chunks.append(shapes.chat_chunk(self.id, self.model, {"content": text[len(sent):]}))
            else:
                call = {"index": self.calls, **shapes.tool_call(item["call_id"], item["name"], item["arguments"])}
                chunks.append(shapes.chat_chunk(self.id, self.model, {"tool_calls": [call]}))
                self.calls += 1
        return chunks


def format_sse(event: dict, named: bool) -> str:
    """One server-sent event: the Responses API names its events; Chat Completions' chunks are data only."""
    return shapes.sse(event) if named else f"data: {json.dumps(event)}\n\n"


def get_cancelled_error(exc: Cancelled) -> ApiError:
    """A cancelled request's error (a server shutting down: 503, OpenAI's ``server_error`` type)."""
    return ApiError(503, str(exc), code="cancelled", type_="server_error")


async def run_cancellable(scheduler, is_disconnected: Callable[[], Any], work: Callable[[], Any],
                          every_s: float = 0.25) -> Any:
    """``work()`` in a worker thread, cancelled at its next forward once ``is_disconnected()``
    (a request's, awaited every ``every_s`` seconds) says its client left."""
    cancels: list = []

    def run() -> Any:
        with scheduler.cancellable() as cancel:
            cancels.append(cancel)
            try:
                return work()
            except Cancelled as exc:
                raise get_cancelled_error(exc) from None
    worker = asyncio.ensure_future(run_in_threadpool(run))
    while not (await asyncio.wait({worker}, timeout=every_s))[0]:
        if cancels and await is_disconnected():
            cancels[0].set()
    return worker.result()


async def open_stream(work: Callable[[Emit], Any], events: Callable[[tuple], list[dict]],
                      named: bool, scheduler=None) -> AsyncIterator[str]:
    """Run ``work(emit)`` in a worker thread; once it reports ``start`` (every check passed), the
    server-sent events of its reports. An error before that is raised here (an HTTP error);
    after it, it ends the stream in an error event. A client that leaves before the end cancels
    the work at its next forward (``scheduler``: the engine's loop)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    cancels: list = []

    def emit(report: tuple) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, report)

    def run() -> None:
        with scheduler.cancellable() if scheduler is not None else contextlib.nullcontext() as cancel:
            cancels.append(cancel)
            try:
                emit(("end", work(emit)))
            except ApiError as exc:
                emit(("error", exc))
            except Cancelled as exc:  # the client left, or the server stops: nothing to log
                emit(("error", get_cancelled_error(exc)))
            except BaseException:  # logged, and answered as OpenAI's 500 object
                log.exception("a streamed request failed")
                emit(("error", server_error()))

    worker = asyncio.ensure_future(run_in_threadpool(run))
    first = await queue.get()
    if first[0] == "error":
        raise first[1]
    if first[0] == "end":  # finished without opening (nothing to check): open, then end
        queue.put_nowait(first)
        first = ("start", None)

    async def generate() -> AsyncIterator[str]:
        report = first
        ended = False
        try:
            while True:
                for event in events(report):
                    yield format_sse(event, named)
                if report[0] in ("end", "error"):
                    break
                report = await queue.get()
            if not named:
                yield "data: [DONE]\n\n"
            ended = True
        finally:
            if not ended and cancels and cancels[0] is not None:  # the client left: stop the turn
                cancels[0].set()
            # keep a reference until the worker ends, so its result is collected rather than
            # reported as never retrieved
            _RUNNING.add(worker)
            worker.add_done_callback(_RUNNING.discard)
    return generate()


_RUNNING: set = set()


__all__ = ["ChatEvents", "ResponseEvents", "TurnStream", "format_sse", "get_cancelled_error", "open_stream",
           "run_cancellable"]
