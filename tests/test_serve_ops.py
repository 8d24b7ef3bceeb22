"""Operations of ``unsee serve`` (issue 49, items 7 and 8), on the tiny model
with the real ``openai`` client: ``/health`` without a key, ``/metrics``
(Prometheus text) with one, one log line per request, ``cached_tokens`` of
a conversation's response (the KV its turn reused), the owner of a
conversation stored without keys once keys are on, an id a DELETE removed
never taken again, the DELETE reply's bookkeeping by value (a replay that
stops at a new call included, on a scripted model), and a context overflow
on an engine shaped as vLLM's a 400, not a 500."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import logging
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from prometheus_client.parser import text_string_to_metric_families

from unsee import Settings
from unsee.impl.engines.registry import make_engine
from unsee.impl.serve.app import get_owner_of
from unsee.impl.serve.pool import Pool
from unsee.impl.serve.server import ServerThread, read_api_keys
from unsee.impl.serve.turns import get_context_length

KEYS = ("sk-alpha-0123", "sk-beta-4567")
SETTINGS = Settings(max_new_tokens=6)
TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def user(item_id: str | None, text: str) -> dict:
    item = {"type": "message", "role": "user", "content": text}
    return {**item, "id": item_id} if item_id else item


def write_keys(path: Path, keys) -> Path:
    path.write_text("\n".join(keys) + "\n")
    return path


@pytest.fixture(scope="module")
def keyed(lm, tmp_path_factory):
    """A server with two keys; ``alpha`` and ``beta`` are clients under each, ``http`` an httpx
    client at the root (no key)."""
    root = tmp_path_factory.mktemp("serve-ops")
    keys = read_api_keys(write_keys(root.parent / "ops-keys.txt", KEYS))
    with ServerThread(Pool(make_engine(lm), root / "store", defaults=SETTINGS, busy_wait=10), "tiny",
                      api_keys=keys) as srv:
        srv.root = root / "store"
        srv.alpha, srv.beta = (openai.OpenAI(base_url=srv.url, api_key=k, max_retries=0) for k in KEYS)
        srv.http = httpx.Client(base_url=srv.url.removesuffix("/v1"))
        yield srv


def scrape(srv, key: str = KEYS[0]) -> dict:
    """``/metrics`` as ``{(sample name, sorted labels): value}``."""
    reply = srv.http.get("/metrics", headers={"Authorization": f"Bearer {key}"})
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain"), reply.text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(reply.text) for s in family.samples}


def requests_of(figures: dict, route: str, method: str, status: int) -> float:
    return figures.get(("unsee_requests_total", (("method", method), ("route", route), ("status", str(status)))), 0)


def forgets_of(figures: dict, kind: str) -> float:
    return figures.get(("unsee_forget_duration_seconds_count", (("kind", kind),)), 0)


def usage_of(response) -> tuple[int, int, int]:
    u = response.usage
    return u.input_tokens, u.input_tokens_details.cached_tokens, u.output_tokens


# --- /health and /metrics ---------------------------------------------------------------------


def test_health_needs_no_key_and_metrics_needs_one(keyed):
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": f"Bearer {KEYS[1]}"}):
        reply = keyed.http.get("/health", headers=headers)
        assert (reply.status_code, reply.json()) == (200, {"status": "ok"})
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
        reply = keyed.http.get("/metrics", headers=headers)
        assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key"
    assert "unsee_requests_total" not in keyed.http.get("/metrics").text
    for key in KEYS:  # any key of the file reads them: server-wide figures, no ids, no text
        figures = scrape(keyed, key)
        assert ("unsee_conversations", ()) in figures and ("unsee_kv_held_bytes", ()) in figures


def test_metrics_count_requests_tokens_forgets_and_what_the_pool_holds(keyed):
    client, pool = keyed.alpha, keyed.pool
    before = scrape(keyed)
    conv = client.conversations.create(items=[user("m1", "Hello there.")])
    answers = [client.responses.create(model="tiny", conversation=conv.id),
               client.responses.create(model="tiny", conversation=conv.id, input=[user("m2", "And again.")])]
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi."}])
    client.conversations.items.create(conv.id, items=[user("m3", "waits")])
    client.conversations.items.delete("m3", conversation_id=conv.id)  # a waiting item
    client.conversations.items.delete("m1", conversation_id=conv.id)  # a replayed forget
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve("conv_nope")
    assert keyed.http.post("/v1/responses", json={"input": "hi"}).status_code == 401
    assert keyed.http.get("/v1/no/such/route", headers={"Authorization": f"Bearer {KEYS[0]}"}).status_code == 404
    after = scrape(keyed)

    def delta(key):
        return after.get(key, 0) - before.get(key, 0)
    item_route = "/v1/conversations/{conv_id}/items/{item_id}"
    assert requests_of(after, "/v1/responses", "POST", 200) - requests_of(before, "/v1/responses", "POST", 200) == 2
    assert requests_of(after, item_route, "DELETE", 200) - requests_of(before, item_route, "DELETE", 200) == 2
    assert requests_of(after, "/v1/conversations/{conv_id}", "GET", 404) - requests_of(
        before, "/v1/conversations/{conv_id}", "GET", 404) == 1
    # refused before routing (no key): counted under the route it would have reached
    assert requests_of(after, "/v1/responses", "POST", 401) - requests_of(before, "/v1/responses", "POST", 401) == 1
    assert requests_of(after, "unmatched", "GET", 404) - requests_of(before, "unmatched", "GET", 404) == 1
    assert not [k for k in after if conv.id in str(k)]  # no conversation id in a label
    prompt = sum(usage_of(a)[0] for a in answers) + chat.usage.prompt_tokens
    cached = sum(usage_of(a)[1] for a in answers) + chat.usage.prompt_tokens_details.cached_tokens
    output = sum(usage_of(a)[2] for a in answers) + chat.usage.completion_tokens
    assert delta(("unsee_prompt_tokens_total", ())) == prompt
    assert delta(("unsee_prompt_cached_tokens_total", ())) == cached > 0
    assert delta(("unsee_completion_tokens_total", ())) == output
    assert forgets_of(after, "waiting") - forgets_of(before, "waiting") == 1
    assert forgets_of(after, "replayed") - forgets_of(before, "replayed") == 1
    assert after[("unsee_conversations", ())] == len(pool.conversations)
    assert after[("unsee_kv_held_bytes", ())] == pool.get_held_bytes() > 0
    assert after[("unsee_requests_waiting", (("on", "engine"),))] == 0
    assert after[("unsee_requests_waiting", (("on", "conversation"),))] == 0
    # the loop's forwards: each answer's prompt is one forward at least, its tokens a step each at most
    forwards = sum(v for (name, _), v in after.items() if name == "unsee_engine_forwards_total") - sum(
        v for (name, _), v in before.items() if name == "unsee_engine_forwards_total")
    assert len(answers) + 1 <= forwards and delta(("unsee_engine_busy_seconds_total", ())) > 0
    assert after[("unsee_engine_forwards_total", (("steps", "1"),))] == pool.get_stats()["decode_batches"][1]


def test_metrics_show_evictions_rebuilds_and_the_budget(keyed):
    client, pool = keyed.alpha, keyed.pool
    first, second = client.conversations.create(), client.conversations.create()
    client.responses.create(model="tiny", conversation=first.id, input="one")
    before = scrape(keyed)
    pool.kv_budget = 1  # every other session is evicted as a request lets go
    try:
        client.responses.create(model="tiny", conversation=second.id, input="two")
        client.responses.create(model="tiny", conversation=first.id, input="three")  # rebuilt
        after = scrape(keyed)
    finally:
        pool.kv_budget = None
    assert after[("unsee_evictions_total", ())] - before[("unsee_evictions_total", ())] >= 1
    assert after[("unsee_evictions_total", ())] == pool.stats["evictions"]
    assert after[("unsee_rebuilds_total", ())] - before[("unsee_rebuilds_total", ())] == 1
    assert after[("unsee_kv_budget_bytes", ())] == 1 and ("unsee_kv_budget_bytes", ()) not in scrape(keyed)
    assert after[("unsee_conversations_resident", ())] == sum(c.session is not None for c in pool.conversations.values())


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_requests_waiting_for_the_engine_or_a_busy_conversation_are_counted_and_a_scrape_waits_for_neither(keyed):
    client, pool = keyed.alpha, keyed.pool
    conv = client.conversations.create()
    held = pool.get(conv.id, get_owner_of(KEYS[0]))

    def waiting(on: str) -> float:
        return scrape(keyed)[("unsee_requests_waiting", (("on", on),))]
    with held.lock:  # another request holds the conversation
        waiter = threading.Thread(target=client.responses.create, kwargs={
            "model": "tiny", "conversation": conv.id, "input": "queued"})
        waiter.start()
        wait_for(lambda: waiting("conversation") == 1)
    waiter.join(30)
    assert waiting("conversation") == 0
    with pool.hold():  # another request holds the engine
        chat = threading.Thread(target=client.chat.completions.create, kwargs={
            "model": "tiny", "messages": [{"role": "user", "content": "queued"}]})
        chat.start()
        wait_for(lambda: waiting("engine") == 1)
    chat.join(30)
    assert waiting("engine") == 0


# --- the log line -----------------------------------------------------------------------------


def test_one_log_line_per_request_with_its_route_status_conversation_and_tokens(keyed, caplog):
    caplog.set_level(logging.INFO, logger="unsee.serve.requests")
    client = keyed.alpha
    conv = client.conversations.create()
    plain = client.responses.create(model="tiny", conversation=conv.id, input="Hi.")
    streamed = list(client.responses.create(model="tiny", conversation=conv.id, input="More.", stream=True))[-1].response
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi."}])
    keyed.http.get("/health")
    # A line is written once the last byte is sent, so the previous test's last scrape of
    # /metrics can land after this test began (CI saw it first); this test never asks /metrics.
    def ours() -> list[str]:
        return [line for line in lines(caplog) if not line.startswith("GET /metrics ")]
    wait_for(lambda: len(ours()) >= 5)
    got = ours()
    assert len(got) == 5, got
    assert got[0].startswith("POST /v1/conversations 200 ") and got[0].endswith(f"conversation={conv.id}")
    for line, response in zip(got[1:3], (plain, streamed)):
        prompt, cached, output = usage_of(response)
        assert line.startswith("POST /v1/responses 200 ") and line.endswith(
            f"conversation={conv.id} prompt_tokens={prompt} cached_tokens={cached} completion_tokens={output}")
    usage = chat.usage
    assert got[3].startswith("POST /v1/chat/completions 200 ") and got[3].endswith(
        f"s prompt_tokens={usage.prompt_tokens} cached_tokens={usage.prompt_tokens_details.cached_tokens} "
        f"completion_tokens={usage.completion_tokens}")
    assert got[4].startswith("GET /health 200 ")
    seconds = float(got[1].split()[3].removesuffix("s"))
    assert 0 < seconds < 60


def test_a_failure_is_one_line_and_one_count_with_status_500(keyed, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="unsee.serve")

    def broken(*args, **kwargs):
        raise RuntimeError("disk gone")
    monkeypatch.setattr(keyed.pool, "create", broken)
    before = requests_of(scrape(keyed), "/v1/conversations", "POST", 500)
    with pytest.raises(openai.InternalServerError):
        keyed.alpha.conversations.create()
    wait_for(lambda: any(line.startswith("POST /v1/conversations 500 ") for line in lines(caplog)))
    assert requests_of(scrape(keyed), "/v1/conversations", "POST", 500) == before + 1
    assert [r for r in caplog.records if r.name == "unsee.serve" and r.exc_info]  # the trace, on the server only


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "unsee.serve.requests"]


# --- cached_tokens ----------------------------------------------------------------------------


def test_cached_tokens_are_the_conversation_s_kv_its_turn_reused(keyed):
    client, pool = keyed.alpha, keyed.pool
    # a system prompt no other conversation of the key has: none of its kept lineages can serve it
    # (tests/test_serve_openings.py: a served system block)
    conv = client.conversations.create(items=[{"type": "message", "role": "system", "content": "Cached-tokens test."}])
    runtime = lambda: pool.get(conv.id, get_owner_of(KEYS[0])).session.runtime
    held = lambda: len(pool.engine.tokens(runtime().lineage))
    first = client.responses.create(model="tiny", conversation=conv.id, input="Hello.")
    assert usage_of(first)[1] == 0  # the store began with this turn: its system block was prefilled
    resident = held()
    second = client.responses.create(model="tiny", conversation=conv.id, input="And then?")
    prompt, cached, _ = usage_of(second)
    assert cached == resident and 0 < cached < prompt  # the context before the turn, not its new input
    resident = held()
    events = list(client.responses.create(model="tiny", conversation=conv.id, input="Streamed.", stream=True))
    assert events[-1].response.usage.input_tokens_details.cached_tokens == resident
    with pool.hold():
        pool.get(conv.id, get_owner_of(KEYS[0])).evict()
    rebuilt = client.responses.create(model="tiny", conversation=conv.id, input="After an eviction.")
    assert usage_of(rebuilt)[1] == 0  # rebuilt from the store: every token computed again
    other = client.responses.create(model="tiny", conversation=conv.id, input="Now terse.", instructions="Terse.")
    assert usage_of(other)[1] == 0  # new instructions: the context re-rendered on a new lineage
    resident = held()
    same = client.responses.create(model="tiny", conversation=conv.id, input="Still terse.", instructions="Terse.")
    assert usage_of(same)[1] == resident > 0


# --- keys -------------------------------------------------------------------------------------


def get_reads(client, conv_id: str, response_id: str) -> list:
    """Every request that reads or changes a conversation, as ``client``."""
    return [lambda: client.conversations.retrieve(conv_id), lambda: client.conversations.items.list(conv_id),
            lambda: client.conversations.items.delete("k1", conversation_id=conv_id),
            lambda: client.responses.create(model="tiny", conversation=conv_id, input="hi"),
            lambda: client.responses.create(model="tiny", previous_response_id=response_id, input="hi"),
            lambda: client.conversations.delete(conv_id)]


def test_a_conversation_made_without_keys_belongs_to_the_first_key_once_keys_are_on(lm, tmp_path):
    root = tmp_path / "store"
    with ServerThread(Pool(make_engine(lm), root, defaults=SETTINGS), "tiny") as srv:
        keyless = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        conv = keyless.conversations.create(items=[user("k1", "made before keys")])
        first = keyless.responses.create(model="tiny", conversation=conv.id)
    sidecar = root / conv.id / "conversation.json"
    assert '"owner": ""' in sidecar.read_text()
    for keys in (KEYS, KEYS[::-1]):  # the first start with keys records the owner; a reordered file moves nothing
        with ServerThread(Pool(make_engine(lm), root, defaults=SETTINGS), "tiny",
                          api_keys=read_api_keys(write_keys(tmp_path / "keys.txt", keys))) as srv:
            alpha, beta = (openai.OpenAI(base_url=srv.url, api_key=k, max_retries=0) for k in KEYS)
            before = snapshot(root)
            for call in get_reads(beta, conv.id, first.id):
                with pytest.raises(openai.NotFoundError):
                    call()
            assert snapshot(root) == before  # refused: nothing written
            assert next(iter(alpha.conversations.items.list(conv.id, order="asc").data)).id == "k1"
            assert alpha.conversations.retrieve(conv.id).model_extra["unsee"]["steps"] == 1
        assert f'"owner": "{get_owner_of(KEYS[0])}"' in sidecar.read_text() and KEYS[0] not in sidecar.read_text()
    with ServerThread(Pool(make_engine(lm), root, defaults=SETTINGS), "tiny") as srv, pytest.raises(
            openai.NotFoundError):  # keys off again: a key's conversation is not everyone's
        openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0).conversations.retrieve(conv.id)


# --- ids --------------------------------------------------------------------------------------


def test_an_id_a_delete_removed_is_never_taken_again(keyed):
    client = keyed.alpha
    conv = client.conversations.create(items=[user("i1", "answered")])
    client.responses.create(model="tiny", conversation=conv.id)
    client.conversations.items.create(conv.id, items=[user("i2", "waiting")])
    client.conversations.items.delete("i1", conversation_id=conv.id)  # replayed
    client.conversations.items.delete("i2", conversation_id=conv.id)  # waiting
    before = snapshot(keyed.root)
    for item_id in ("i1", "i2"):
        for call in (client.conversations.items.create, client.responses.create):
            with pytest.raises(openai.BadRequestError) as refused:
                if call == client.responses.create:
                    call(model="tiny", conversation=conv.id, input=[user(item_id, "again")])
                else:
                    call(conv.id, items=[user(item_id, "again")])
            assert refused.value.body["param"] == "id" and repr(item_id) in refused.value.body["message"]
    assert snapshot(keyed.root) == before


def test_a_server_made_id_after_a_delete_never_equals_the_deleted_one(keyed):
    client = keyed.alpha
    conv = client.conversations.create(items=[user(None, "same text")])
    first = client.conversations.items.list(conv.id).data[0].id
    client.conversations.items.delete(first, conversation_id=conv.id)
    added = client.conversations.items.create(conv.id, items=[user(None, "same text")]).data[0].id
    assert added != first and added.startswith(first)  # the next free one
    client.responses.create(model="tiny", conversation=conv.id)
    client.conversations.items.delete(added, conversation_id=conv.id)  # now a replayed forget
    later = client.responses.create(model="tiny", conversation=conv.id, input=[user(None, "same text")])
    ids = [i.id for i in client.conversations.items.list(conv.id, order="asc", limit=100).data]
    assert not {first, added} & set(ids) and later.output[0].id in ids


# --- the DELETE reply, by value ---------------------------------------------------------------


def listed(client, conv_id: str) -> list[dict]:
    return [i.model_dump(exclude_none=True) for i in client.conversations.items.list(conv_id, order="asc",
                                                                                      limit=100).data]


def public(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in i.items() if v is not None} for i in items]


def test_the_delete_reply_says_what_it_rewrote_and_removed(keyed):
    client = keyed.alpha
    conv = client.conversations.create(items=[user("d1", "first")])
    client.responses.create(model="tiny", conversation=conv.id)
    client.responses.create(model="tiny", conversation=conv.id, input=[user("d2", "second")])
    client.conversations.items.create(conv.id, items=[user("d3", "waiting")])
    waiting = client.conversations.items.delete("d3", conversation_id=conv.id).model_extra
    assert {k: waiting[k] for k in ("rewritten", "removed", "status", "pending_calls", "unreplayed", "receipt",
                                    "report")} == {"rewritten": [], "removed": ["d3"], "status": "completed",
                                                   "pending_calls": [], "unreplayed": [], "receipt": None,
                                                   "report": None}
    client.conversations.items.create(conv.id, items=[user("d4", "still waiting")])
    before = listed(client, conv.id)
    gone = client.conversations.items.delete("d1", conversation_id=conv.id).model_extra
    after = listed(client, conv.id)
    old_answers = [i["id"] for i in before if i["type"] == "message" and i["role"] == "assistant"]
    assert gone["removed"] == ["d1", *old_answers]
    assert public(gone["rewritten"]) == [i for i in after if i["id"] not in {j["id"] for j in before}]
    assert [i["role"] for i in gone["rewritten"]] == ["assistant", "assistant"]
    assert [i["id"] for i in after] == [gone["rewritten"][0]["id"], "d2", gone["rewritten"][1]["id"], "d4"]
    assert (gone["status"], gone["pending_calls"], gone["unreplayed"]) == ("completed", [], [])  # d4: added, not held
    assert {k: gone["report"][k] for k in ("tau", "length", "invocations")} == {"tau": 1, "length": 2,
                                                                                 "invocations": 2}
    assert isinstance(gone["receipt"], str) and gone["digest"] == keyed.alpha.conversations.retrieve(
        conv.id).model_extra["unsee"]["digest"]


def load_render_helpers():
    spec = importlib.util.spec_from_file_location("test_render_helpers", Path(__file__).with_name("test_render.py"))
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    return render


def script_engine(engine) -> None:
    """The engine's turns written by a rule on the prompt (prefilled, as an oracle's draft is):
    a tool output is thanked, "home?" is a call for the user's city (Oslo where the context says
    so, else Paris), anything else is noted. Deterministic, so a replay writes what a twin would."""
    lm = engine.lm

    def generate(lineage, max_new_tokens, *args, **options):  # whatever else a turn passes (a mask, a draft)
        prompt = lm.decode(engine.tokens(lineage))
        last = prompt.split("<|im_start|>")[-2]  # the last input, before the assistant header
        if "Sunny" in last:
            text = "Enjoy."
        elif "home?" in last:
            city = "Oslo" if "Oslo" in prompt else "Paris"
            text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "' + city + '"}}\n</tool_call>'
        else:
            text = "Noted."
        ids = [*lm.encode(text), lm.eos_ids[0]]
        engine.prefill(lineage, ids)
        return ids
    engine.generate = generate


def test_a_delete_whose_replay_stops_at_a_new_call_says_what_waits(lm, tmp_path):
    engine = make_engine(load_render_helpers().chatml_model(lm, load_render_helpers().TOOL_DEFS_TEMPLATE))
    script_engine(engine)
    root = tmp_path / "store"
    with ServerThread(Pool(engine, root, defaults=Settings(max_new_tokens=64)), "tiny") as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        conv = client.conversations.create(items=[user("u1", "I live in Oslo.")]).id
        client.responses.create(model="tiny", conversation=conv, tools=[TOOL])
        call = client.responses.create(model="tiny", conversation=conv, input=[user("u2", "Weather at home?")],
                                       tools=[TOOL]).output[0]
        assert (call.type, call.arguments) == ("function_call", '{"city": "Oslo"}')
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny in Oslo.", "id": "t1"}
        client.responses.create(model="tiny", conversation=conv, input=[output], tools=[TOOL])
        client.responses.create(model="tiny", conversation=conv, input=[user("u3", "Thanks.")], tools=[TOOL])
        before = listed(client, conv)
        gone = client.conversations.items.delete("u1", conversation_id=conv).model_extra
        after = listed(client, conv)
        # the replay: turn 1 answered anew, turn 2 calls for Paris (no recorded output): it stops there
        new = [i for i in after if i["id"] not in {j["id"] for j in before}]
        assert [i["type"] for i in new] == ["message", "function_call"] and public(gone["rewritten"]) == new
        assert gone["removed"] == [i["id"] for i in before if i["id"] not in {j["id"] for j in after}]
        assert gone["removed"][0] == "u1" and "t1" in gone["removed"]  # the Oslo call's output: no call makes it
        assert gone["status"] == "pending" and public(gone["pending_calls"]) == [new[1]]
        assert gone["pending_calls"][0]["arguments"] == '{"city": "Paris"}'
        assert [(i["id"], i["content"][0]["text"]) for i in gone["unreplayed"]] == [("u3", "Thanks.")]
        assert [i["id"] for i in after] == [new[0]["id"], "u2", new[1]["id"], "u3"]
        assert {k: gone["report"][k] for k in ("tau", "length", "invocations")} == {"tau": 1, "length": 2,
                                                                                     "invocations": 2}
        # t1 was removed: its id is not taken again
        paris = {"type": "function_call_output", "call_id": gone["pending_calls"][0]["call_id"], "output": "Sunny.",
                 "id": "t1"}
        stored = snapshot(root)
        with pytest.raises(openai.BadRequestError, match="'t1'"):
            client.responses.create(model="tiny", conversation=conv, input=[paris], tools=[TOOL])
        assert snapshot(root) == stored
        # a held input deleted: removed alone; nothing is held any more, the call still waits
        held = client.conversations.items.delete("u3", conversation_id=conv).model_extra
        assert (held["removed"], held["rewritten"], held["unreplayed"], held["status"]) == (["u3"], [], [],
                                                                                            "completed")
        assert public(held["pending_calls"]) == [new[1]] and held["report"] is None
        done = client.responses.create(model="tiny", conversation=conv, input=[{**paris, "id": "t2"}], tools=[TOOL])
        assert done.output[0].content[0].text == "Enjoy."
        assert [i["id"] for i in listed(client, conv)][-2:] == ["t2", done.output[0].id]


# --- vLLM's context ---------------------------------------------------------------------------


def vllm_shaped(max_model_len: int) -> SimpleNamespace:
    return SimpleNamespace(info={"options": SimpleNamespace(max_model_len=max_model_len)})


def test_the_context_length_is_read_from_each_engine_s_model():
    assert get_context_length(vllm_shaped(4096)) == 4095  # vLLM's engine keeps a position for the logits
    assert get_context_length(SimpleNamespace(n_ctx=2048, info={})) == 2048  # llama.cpp
    assert get_context_length(SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(
        max_position_embeddings=512)), info={})) == 512  # transformers
    assert get_context_length(SimpleNamespace(info={"options": object()})) is None
    assert get_context_length(SimpleNamespace()) is None


def test_an_overflow_on_a_model_shaped_as_vllm_s_is_400_context_length_exceeded(lm, tmp_path):
    """The tiny model with vLLM's ``info["options"].max_model_len`` (vLLM is not installed here): the
    server reads its context from there, so a turn past it is refused before any write."""
    shaped = copy.copy(lm)
    shaped.info = {**lm.info, "options": SimpleNamespace(max_model_len=200)}
    root = tmp_path / "store"
    with ServerThread(Pool(make_engine(shaped), root, defaults=SETTINGS), "tiny") as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        conv = client.conversations.create()
        client.responses.create(model="tiny", conversation=conv.id, input="short")
        before = snapshot(root)
        too_long = "word " * 40  # 200 byte tokens: within the tiny model's 4096, past this context
        for call in (lambda: client.responses.create(model="tiny", conversation=conv.id, input=too_long),
                     lambda: client.responses.create(model="tiny", input=too_long),
                     lambda: client.responses.create(model="tiny", input=too_long, store=False),
                     lambda: client.chat.completions.create(model="tiny",
                                                            messages=[{"role": "user", "content": too_long}])):
            with pytest.raises(openai.BadRequestError) as refused:
                call()
            assert refused.value.body["code"] == "context_length_exceeded" and "199" in refused.value.body["message"]
        assert snapshot(root) == before
