"""The FastAPI application of ``unsee serve`` (docs/serve.md): routes, auth,
errors in OpenAI's shape, server-sent events.

Every route reads its body strictly (:mod:`.bodies`), then does its work in
a worker thread holding the conversation's lock and the engine's
(:meth:`Pool.hold`, the one way serve takes its locks). Every check that can refuse runs before the first write,
so a refused request changes nothing; an unexpected failure answers 500 with
no trace (it is logged), and the store is as its last commit left it.
``GET /health`` and ``GET /metrics``, the per-request log line and the
figures are :mod:`.metrics`'s.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from unsee.impl.engines.scheduler import Cancelled
from unsee.impl.serve import answers, bodies, shapes, turns
from unsee.impl.serve.compaction import read_compact_request
from unsee.impl.serve.conversation import Conversation
from unsee.impl.serve.errors import ApiError, bad_request, not_found, server_error, unauthorized
from unsee.impl.serve.fields import CONVERSATION_FIELDS, ITEMS_FIELDS, check_fields
from unsee.impl.serve.metrics import Metrics, RequestRecorder, note_conversation, note_usage
from unsee.impl.serve.pool import Pool
from unsee.impl.serve.stream import (
    ChatEvents,
    ResponseEvents,
    TurnStream,
    get_cancelled_error,
    open_stream,
    run_cancellable,
)

log = logging.getLogger("unsee.serve")
LIST_PARAMS = {"limit", "order", "after", "include"}
MAX_BODY_BYTES = 4 * 2**20
#: the routes a request without a key may call: a liveness probe (a load balancer's, an orchestrator's)
#: sends none, and the reply says nothing but that the server is up
OPEN_ROUTES = {"/health"}


def reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def read_json(request: Request, empty_ok: bool = False) -> Any:
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise bad_request(f"the body is {len(body)} bytes; at most {MAX_BODY_BYTES} are read")
    if not body.strip():
        if empty_ok:
            return {}
        raise bad_request("the body must be a JSON object")
    try:
        return json.loads(body, parse_constant=reject_constant)
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"the body is not valid JSON: {str(exc)[:200]}") from None


def check_query(request: Request, allowed: set[str]) -> None:
    unknown = sorted(set(request.query_params) - allowed)
    if unknown:
        raise bad_request(f"unknown query parameter {unknown[0]!r}", param=unknown[0], code="unknown_parameter")


def get_page(items: list[dict], request: Request) -> list[dict]:
    """``order`` (asc/desc, default desc as the API), ``after`` an item id, ``limit`` 1-100 (default 20)."""
    check_query(request, LIST_PARAMS)
    q = request.query_params
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request("order: asc or desc", param="order")
    try:
        limit = int(q.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise bad_request("limit: an integer from 1 to 100", param="limit")
    items = items if order == "asc" else items[::-1]
    if "after" in q:
        ids = [i["id"] for i in items]
        if q["after"] not in ids:
            raise not_found(f"after: no item {q['after']!r}", param="after")
        items = items[ids.index(q["after"]) + 1:]
    return items[:limit + 1]


def get_state(pool: Pool, conv: Conversation) -> dict:
    runtime = conv.session.runtime if conv.session is not None else None
    return {"digest": conv.digest(), "steps": runtime.t if runtime else 0,
            "forgotten": list(runtime.forgotten) if runtime else [], "pending": len(conv.record["pending"]),
            "held": (sum(len(g["items"]) for g in conv.record["held"]) + len(conv.record["held_outputs"])
                     + len(conv.record["held_extra"])),
            "pending_calls": [c["call_id"] for c in conv.get_pending_calls()], "model": pool.engine.lm.name}


def get_owner_of(key: str) -> str:
    """The owner a key's conversations are recorded under (a hash: the sidecar holds no key)."""
    return hashlib.sha256(f"unsee-owner\0{key}".encode()).hexdigest()[:32]


def get_owner(request: Request) -> str:
    return getattr(request.state, "owner", "")


def run_held(pool: Pool, conv: Conversation, work, background: bool = False):
    """``work(conv)`` in a worker thread, holding the conversation and the engine
    (``background``: stepping aside for responses, :meth:`Pool.hold`)."""
    def held():
        with pool.hold(conv, background):
            return work(conv)
    return run_in_threadpool(held)


def build_app(pool: Pool, model_name: str, api_keys: Sequence[str] = ()) -> FastAPI:
    """The application over ``pool`` (its model loaded). With ``api_keys``, a conversation stored
    without an owner (made while the server ran without keys) is given to the first key before
    any request (docs/serve.md, "Keys")."""
    app = FastAPI(title="unsee serve", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.pool = pool
    app.state.metrics = metrics = Metrics(pool)
    add_error_handlers(app)
    if api_keys:
        claimed = pool.claim_unowned(get_owner_of(api_keys[0]))
        if claimed:
            log.warning("%d conversation(s) stored without keys now belong to the key file's first key",
                        len(claimed))
        add_auth(app, api_keys)
    app.add_middleware(RequestRecorder, metrics=metrics, router=app.router)  # added last: outermost, so a 401 is recorded too
    add_ops_routes(app, metrics)
    add_conversation_routes(app, pool, model_name)
    add_item_routes(app, pool, metrics)
    add_response_routes(app, pool, model_name)
    add_compact_route(app, pool)
    add_chat_routes(app, pool, model_name)
    return app


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.to_json(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = "no such route" if exc.status_code == 404 else str(exc.detail)
        return JSONResponse(ApiError(exc.status_code, f"{request.method} {request.url.path}: {message}").to_json(),
                            status_code=exc.status_code)

    @app.exception_handler(Cancelled)
    async def on_cancelled(request: Request, exc: Cancelled) -> JSONResponse:
        """Work the server's stop cut short at a forward (a DELETE's replay, a compaction): nothing
        was committed; 503, not a failure to log."""
        error = get_cancelled_error(exc)
        return JSONResponse(error.to_json(), status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(bad_request("the request does not match the route").to_json(), status_code=400)

    @app.exception_handler(Exception)
    async def on_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse(server_error().to_json(), status_code=500)


def add_auth(app: FastAPI, api_keys: Sequence[str]) -> None:
    """Every route but :data:`OPEN_ROUTES` needs ``Authorization: Bearer <key>`` of one of
    ``api_keys`` (each compared in constant time, all of them every time); the request then acts
    as that key's owner."""
    owners = [(f"Bearer {k}".encode(), get_owner_of(k)) for k in api_keys]

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if request.url.path in OPEN_ROUTES:
            return await call_next(request)
        given = request.headers.get("authorization", "").encode()
        matches = [owner for key, owner in owners if hmac.compare_digest(given, key)]
        if not matches:
            why = "no API key given" if not given else "the API key is wrong"
            return JSONResponse(unauthorized(f"{why}: send 'Authorization: Bearer <key>'").to_json(),
                                status_code=401)
        request.state.owner = matches[0]
        return await call_next(request)


def add_ops_routes(app: FastAPI, metrics: Metrics) -> None:
    @app.get("/health")
    async def health() -> dict:
        """Up, with the model loaded (the app is built once it is): no data, no key."""
        return {"status": "ok"}

    @app.get("/metrics")
    async def get_metrics() -> Response:
        """Prometheus text (a key, where the server has keys: docs/serve.md, "Operations")."""
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


def add_conversation_routes(app: FastAPI, pool: Pool, model_name: str) -> None:
    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "unsee"}]}

    @app.post("/v1/conversations")
    async def create_conversation(request: Request) -> dict:
        body = check_fields(await read_json(request, empty_ok=True), CONVERSATION_FIELDS, "conversations")
        items = bodies.read_items(body.get("items"), "items", empty_ok=True)
        metadata = bodies.read_metadata(body.get("metadata"))
        conv = await run_in_threadpool(pool.create, items, metadata, get_owner(request))
        note_conversation(request.state, conv.id)
        return shapes.conversation(conv.record)

    @app.get("/v1/conversations/{conv_id}")
    async def get_conversation(conv_id: str, request: Request) -> dict:
        return await run_held(pool, pool.get(conv_id, get_owner(request)),
                              lambda c: shapes.conversation(c.record, get_state(pool, c)))

    @app.post("/v1/conversations/{conv_id}")
    async def update_conversation(conv_id: str, request: Request) -> dict:
        body = bodies.read_object(await read_json(request), {"metadata"}, "conversations.update")
        metadata = bodies.read_metadata(body.get("metadata"))

        def work(conv: Conversation) -> dict:
            conv.save({**conv.record, "metadata": metadata})
            return shapes.conversation(conv.record)
        return await run_held(pool, pool.get(conv_id, get_owner(request)), work)

    @app.delete("/v1/conversations/{conv_id}")
    async def delete_conversation(conv_id: str, request: Request) -> dict:
        await run_in_threadpool(pool.delete, pool.get(conv_id, get_owner(request)))
        return {"id": conv_id, "object": "conversation.deleted", "deleted": True}


def add_item_routes(app: FastAPI, pool: Pool, metrics: Metrics) -> None:
    @app.post("/v1/conversations/{conv_id}/items")
    async def add_items(conv_id: str, request: Request) -> dict:
        check_query(request, {"include"})
        body = check_fields(await read_json(request), ITEMS_FIELDS, "items.create")
        items = bodies.read_items(body.get("items"), "items")
        return await run_held(pool, pool.get(conv_id, get_owner(request)),
                              lambda c: shapes.item_list(c.add_items(items)))

    @app.get("/v1/conversations/{conv_id}/items")
    async def list_items(conv_id: str, request: Request) -> dict:
        page = await run_held(pool, pool.get(conv_id, get_owner(request)), lambda c: get_page(c.get_items(), request))
        limit = int(request.query_params.get("limit", "20"))
        return {**shapes.item_list(page[:limit]), "has_more": len(page) > limit}

    @app.get("/v1/conversations/{conv_id}/items/{item_id}")
    async def get_item(conv_id: str, item_id: str, request: Request) -> dict:
        check_query(request, {"include"})
        return await run_held(pool, pool.get(conv_id, get_owner(request)),
                              lambda c: shapes.public_item(c.get_item(item_id)))

    @app.delete("/v1/conversations/{conv_id}/items/{item_id}")
    async def delete_item(conv_id: str, item_id: str, request: Request) -> dict:
        check_query(request, {"mode"})
        mode = request.query_params.get("mode", "exact")
        if mode != "exact":
            raise bad_request(f"mode: {mode!r} is not offered: a delete here is an exact forget (mode=exact); "
                              "a drop-only delete would leave what the item changed in later answers and caches",
                              param="mode")

        def work(conv: Conversation) -> dict:
            start = time.perf_counter()
            out = turns.forget(conv, item_id)
            metrics.note_forget("waiting" if out["report"] is None else "replayed", time.perf_counter() - start)
            public = {k: [shapes.public_item(i) for i in out[k]] for k in ("rewritten", "pending_calls", "unreplayed")}
            return {**shapes.conversation(conv.record), "deleted_item_id": item_id, "mode": "exact", **out, **public,
                    "digest": conv.digest()}
        # background: the replay steps aside for any response waiting (impl/engines/scheduler.py)
        return await run_held(pool, pool.get(conv_id, get_owner(request)), work, background=True)


def add_response_routes(app: FastAPI, pool: Pool, model_name: str) -> None:
    lm = pool.engine.lm

    @app.post("/v1/responses")
    async def create_response(request: Request):
        req = bodies.read_response_request(await read_json(request))
        owner = get_owner(request)
        if req["stateless"]:
            def work(listener):
                return answers.respond_stateless(pool, model_name, req, owner, listener)
        else:
            conv, previous = answers.get_target(pool, req, owner)

            def work(listener):
                if conv is None:
                    return answers.respond_new(pool, model_name, req, owner, listener)
                return answers.respond(pool, model_name, req, conv, previous, owner, listener)

        def recorded(listener):  # the request's record learns its conversation and tokens (metrics.py)
            out = work(listener)
            note_conversation(request.state, (out["conversation"] or {}).get("id"))
            note_usage(request.state, out["usage"])
            return out
        if not req["stream"]:
            return await run_cancellable(pool.loop, request.is_disconnected, lambda: recorded(None))
        body = await open_stream(lambda emit: recorded(TurnStream(lm, pool.call_format, emit)), ResponseEvents(),
                                 named=True, scheduler=pool.loop)
        return StreamingResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def add_compact_route(app: FastAPI, pool: Pool) -> None:
    @app.post("/v1/responses/compact")
    async def compact_response(request: Request) -> dict:
        previous = read_compact_request(await read_json(request))
        conv = pool.get_by_response(previous, get_owner(request))
        note_conversation(request.state, conv.id)
        return await run_in_threadpool(answers.compact, pool, conv, previous)


def add_chat_routes(app: FastAPI, pool: Pool, model_name: str) -> None:
    lm = pool.engine.lm

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = bodies.read_chat_request(await read_json(request))
        owner, completion_id = get_owner(request), "chatcmpl-" + secrets.token_hex(16)

        def work(listener):
            out = answers.complete_chat(pool, model_name, req, owner, completion_id, listener)
            note_usage(request.state, out["usage"])  # the request's record (metrics.py)
            return out
        if not req["stream"]:
            return (await run_cancellable(pool.loop, request.is_disconnected, lambda: work(None)))["completion"]
        body = await open_stream(lambda emit: work(TurnStream(lm, pool.call_format, emit)),
                                 ChatEvents(completion_id, model_name, req["include_usage"]), named=False,
                                 scheduler=pool.loop)
        return StreamingResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
