"""Operations (docs/serve.md, "Operations"): ``GET /health``, ``GET /metrics``
(Prometheus text) and one log line per request.

Each application has a registry of its own (tests build several apps in one
process, and the global default registry would mix their counts). Request,
token and forget figures are counted as requests end; what the pool holds
(KV bytes, conversations, waiting requests, evictions) is read from the pool
when Prometheus scrapes, so it is never stale and never counted twice.

The per-request record is one ASGI middleware (:class:`RequestRecorder`)
around every route, the key check included: it sees the status a request
ended with, after a streamed body's last event too, and the route's
template (``/v1/conversations/{conv_id}``), never the raw path, so a client
cannot grow the labels by sending ids. What a route learns while it runs
(the conversation, the tokens) it writes into the request's state
(:func:`note_conversation`, :func:`note_usage`), which the middleware reads
at the end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.routing import Match

ACCESS_LOG = logging.getLogger("unsee.serve.requests")
#: a turn or a forget takes seconds to minutes on a CPU (a waiting item's removal, milliseconds)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, float("inf"))
UNMATCHED = "unmatched"  # the route label of a request no route matched (a 404 probe, say)


class PoolCollector(Collector):
    """The pool's state at scrape time: KV bytes held and the budget, conversations stored and
    resident, requests waiting for the engine or for a busy conversation, evictions, rebuilds,
    and the engine loop's forwards (by the steps each batched) and busy seconds."""

    def __init__(self, pool):
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        pool = self.pool
        state = pool.get_ops_state()
        yield GaugeMetricFamily("unsee_kv_held_bytes", "KV bytes the engine held when the last request "
                                "let the engine go (every lineage: conversations, checkpoints, chat cache)",
                                value=state["held_bytes"])
        if pool.kv_budget is not None:
            yield GaugeMetricFamily("unsee_kv_budget_bytes", "the KV budget (--kv-budget)", value=pool.kv_budget)
        yield GaugeMetricFamily("unsee_conversations", "conversations in the store", value=state["conversations"])
        yield GaugeMetricFamily("unsee_conversations_resident", "conversations whose session is in memory",
                                value=state["resident"])
        waiting = GaugeMetricFamily("unsee_requests_waiting", "requests waiting: for the engine (between "
                                    "forwards included) or for a conversation another request holds",
                                    labels=["on"])
        waiting.add_metric(["engine"], state["waiting_engine"])
        waiting.add_metric(["conversation"], state["waiting_conversation"])
        yield waiting
        yield CounterMetricFamily("unsee_evictions", "sessions evicted to keep the KV under the budget",
                                  value=state["evictions"])
        yield CounterMetricFamily("unsee_rebuilds", "evicted sessions rebuilt from their store",
                                  value=state["rebuilds"])
        stats = pool.get_stats()
        forwards = CounterMetricFamily("unsee_engine_forwards", "forwards the engine's loop ran, by the decode "
                                       "steps each batched (1: a lone step, a prefill or any other forward)",
                                       labels=["steps"])
        for steps, count in sorted(stats["decode_batches"].items()):
            forwards.add_metric([str(steps)], count)
        yield forwards
        yield CounterMetricFamily("unsee_engine_busy_seconds", "seconds the engine's loop spent computing "
                                  "forwards (the rest of its time it waited for work)", value=stats["forward_s"])


class Metrics:
    """One application's figures, on a registry of its own."""

    def __init__(self, pool):
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("unsee_requests", "requests answered, by route template, method and status",
                                ["route", "method", "status"], registry=self.registry)
        self.duration = Histogram("unsee_request_duration_seconds", "a request's time, from its arrival to its "
                                  "last byte (a stream's last event)", ["route", "method"], buckets=DURATION_BUCKETS,
                                  registry=self.registry)
        self.prompt_tokens = Counter("unsee_prompt_tokens", "prompt tokens of the answers (responses, chat "
                                     "completions)", registry=self.registry)
        self.cached_tokens = Counter("unsee_prompt_cached_tokens", "of those, tokens whose KV was reused, not "
                                     "computed", registry=self.registry)
        self.completion_tokens = Counter("unsee_completion_tokens", "output tokens of the answers",
                                         registry=self.registry)
        self.forget = Histogram("unsee_forget_duration_seconds", "a DELETE of an item, its locks held: 'replayed' "
                                "(Algorithm 1) or 'waiting' (an item nothing was derived from yet)", ["kind"],
                                buckets=DURATION_BUCKETS, registry=self.registry)
        self.registry.register(PoolCollector(pool))

    def note_request(self, route: str, method: str, status: int, seconds: float, usage: dict | None) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.duration.labels(route, method).observe(seconds)
        if usage:
            self.prompt_tokens.inc(usage["prompt_tokens"])
            self.cached_tokens.inc(usage["cached_tokens"])
            self.completion_tokens.inc(usage["completion_tokens"])

    def note_forget(self, kind: str, seconds: float) -> None:
        self.forget.labels(kind).observe(seconds)


def get_usage_record(usage: dict) -> dict:
    """A response's or a chat completion's ``usage`` as one record (the two APIs name them apart)."""
    if "input_tokens" in usage:
        return {"prompt_tokens": usage["input_tokens"], "completion_tokens": usage["output_tokens"],
                "cached_tokens": usage["input_tokens_details"]["cached_tokens"]}
    return {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]}


def note_usage(state, usage: dict | None) -> None:
    """Tell the request's record its tokens (``state``: the request's ``request.state``; any thread)."""
    if usage:
        state.usage = get_usage_record(usage)


def note_conversation(state, conv_id: str | None) -> None:
    """Tell the request's record its conversation (where the path does not name it)."""
    if conv_id:
        state.conversation = conv_id


def format_request_line(method: str, path: str, status: int, seconds: float, conversation: str | None,
                        usage: dict | None) -> str:
    """The log line of one request: ``POST /v1/responses 200 1.234s conversation=conv_... prompt_tokens=...``."""
    parts = [method, path, str(status), f"{seconds:.3f}s"]
    if conversation:
        parts.append(f"conversation={conversation}")
    if usage:
        parts += [f"{k}={usage[k]}" for k in ("prompt_tokens", "cached_tokens", "completion_tokens")]
    return " ".join(parts)


def get_route_template(router, scope) -> str:
    """The template of the route a request reached (``/v1/conversations/{conv_id}``), or would have
    reached where it was refused first (no key); :data:`UNMATCHED` for none."""
    route = scope.get("route")
    if route is None:
        route = next((r for r in router.routes if r.matches(scope)[0] == Match.FULL), None)
    return getattr(route, "path", None) or UNMATCHED


class RequestRecorder:
    """ASGI middleware: one log line and the request figures per HTTP request, once its last byte
    is sent (or it failed: then 500, as the error handler answers)."""

    def __init__(self, app, metrics: Metrics, router):
        self.app = app
        self.metrics = metrics
        self.router = router

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [500]
        done = [False]

        async def watch(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                finish()

        def finish() -> None:
            if done[0]:
                return
            done[0] = True
            state = scope.get("state") or {}
            template = get_route_template(self.router, scope)
            seconds = time.perf_counter() - start
            usage = state.get("usage")
            conversation = state.get("conversation") or (scope.get("path_params") or {}).get("conv_id")
            self.metrics.note_request(template, scope["method"], status[0], seconds, usage)
            ACCESS_LOG.info("%s", format_request_line(scope["method"], scope["path"], status[0], seconds,
                                                      conversation, usage))

        try:
            await self.app(scope, receive, watch)
        finally:
            finish()  # a failure that sent nothing, or a client gone mid-body


__all__ = [
    "ACCESS_LOG",
    "DURATION_BUCKETS",
    "UNMATCHED",
    "Metrics",
    "PoolCollector",
    "RequestRecorder",
    "format_request_line",
    "get_route_template",
    "get_usage_record",
    "note_conversation",
    "note_usage",
]
