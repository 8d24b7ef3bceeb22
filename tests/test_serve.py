"""``unsee serve`` driven by the real ``openai`` client on loopback (issue 30):
the forget's conversation equals a twin that never had the item (digest,
items, next answer), ``unsee verify`` accepts its receipt, streaming, tool
outputs, chat completions, eviction under the KV budget and a restart. Issue
38 on the tiny model: tokens streamed as they are decoded, a client that
leaves mid-stream (the turn is committed whole), instructions that change
mid-conversation (the context re-rendered, and a forget across the change
equals a twin and verifies), API keys that each own their conversations and
chat prefix cache, context_length_exceeded before any write, a stateless
response."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from unsee import Settings, verify_store
from unsee.impl.engines.registry import make_engine
from unsee.impl.serve.app import get_owner_of
from unsee.impl.serve.pool import Pool
from unsee.impl.serve.server import ServerThread, read_api_keys

SECRET = "4417 Elm Street"
SETTINGS = Settings(max_new_tokens=6)
KEYS = ("sk-alpha-0123", "sk-beta-4567")


@pytest.fixture(scope="module")
def server(lm, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    with ServerThread(Pool(make_engine(lm), root, defaults=SETTINGS), "tiny") as srv:
        srv.root = root
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


def user(item_id: str, text: str) -> dict:
    return {"type": "message", "role": "user", "content": text, "id": item_id}


def state(client, conv_id: str) -> dict:
    return client.conversations.retrieve(conv_id).model_extra["unsee"]


def texts(client, conv_id: str) -> list[tuple[str, str, str]]:
    out = []
    for item in client.conversations.items.list(conv_id, order="asc", limit=100).data:
        text = item.output if item.type == "function_call_output" else item.content[0].text
        out.append((item.id, item.type, text))
    return out


def test_forget_equals_a_twin_that_never_had_the_item_and_verifies(client, server):
    conv = client.conversations.create(items=[user("u1", "Hi, I am Dana.")])
    client.responses.create(model="tiny", conversation=conv.id)
    leak = client.responses.create(model="tiny", conversation=conv.id, input=[user("u2", f"I live at {SECRET}.")])
    assert leak.status in ("completed", "incomplete") and leak.output[0].role == "assistant"
    # streamed: the events of one output message, then the response
    events = list(client.responses.create(model="tiny", conversation=conv.id, input=[user("u3", "Where do I live?")],
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    final = events[-1].response
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == final.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    before = texts(client, conv.id)

    deleted = client.conversations.items.delete("u2", conversation_id=conv.id)
    extra = deleted.model_extra
    assert extra["mode"] == "exact" and extra["deleted_item_id"] == "u2"
    after = texts(client, conv.id)
    assert "u2" not in [i for i, _, _ in after] and SECRET not in json.dumps(after)
    # the reply lists exactly the items the replay rewrote: in the conversation now, not before
    assert [r["id"] for r in extra["rewritten"]] == [i for i, _, _ in after if i not in {b[0] for b in before}]
    assert extra["report"]["invocations"] == extra["report"]["length"] - extra["report"]["tau"] + 1

    twin = client.conversations.create(items=[user("u1", "Hi, I am Dana.")])
    client.responses.create(model="tiny", conversation=twin.id)
    client.responses.create(model="tiny", conversation=twin.id, input=[])  # the turn u2 was, without it
    client.responses.create(model="tiny", conversation=twin.id, input=[user("u3", "Where do I live?")])
    assert state(client, conv.id)["digest"] == state(client, twin.id)["digest"]
    assert texts(client, conv.id) == texts(client, twin.id)
    nxt = [client.responses.create(model="tiny", conversation=c, input=[user("u4", "Who am I?")]).output_text
           for c in (conv.id, twin.id)]
    assert nxt[0] == nxt[1]

    store = server.pool.get(conv.id).store_path
    # no byte of the secret in any file of the conversation's folder (store and sidecar)
    assert not [p.name for p in store.parent.iterdir() if SECRET.encode() in p.read_bytes()]
    verdict = verify_store(store, extra["receipt"], value=SECRET)
    assert verdict.outcome == "verified", [c for c in verdict.checks if c.status != "ok"]


def test_a_second_delete_of_the_item_is_404(client):
    conv = client.conversations.create(items=[user("a1", "one")])
    client.responses.create(model="tiny", conversation=conv.id)
    client.conversations.items.delete("a1", conversation_id=conv.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.delete("a1", conversation_id=conv.id)


def test_pending_items_are_listed_deleted_and_then_answered(client):
    conv = client.conversations.create(items=[{"role": "system", "content": "Be brief."}, user("p1", "first")])
    added = client.conversations.items.create(conv.id, items=[user("p2", "second"), user("p3", "third")])
    assert [i.id for i in added.data] == ["p2", "p3"]
    client.conversations.items.delete("p2", conversation_id=conv.id)
    assert [i for i, _, _ in texts(client, conv.id)] == ["p1", "p3"]
    response = client.responses.create(model="tiny", conversation=conv.id)
    ids = [i for i, _, _ in texts(client, conv.id)]
    assert ids == ["p1", "p3", response.output[0].id]
    assert client.conversations.items.retrieve("p3", conversation_id=conv.id).content[0].text == "third"


def test_function_call_outputs_are_items_and_forget_exactly(client):
    conv = client.conversations.create()
    client.responses.create(model="tiny", conversation=conv.id, input="Look up the address.")
    out = {"type": "function_call_output", "call_id": "call_1", "output": SECRET, "id": "t1", "name": "lookup"}
    client.responses.create(model="tiny", conversation=conv.id, input=[out])
    item = client.conversations.items.retrieve("t1", conversation_id=conv.id)
    assert (item.type, item.call_id, item.output) == ("function_call_output", "call_1", SECRET)
    client.conversations.items.delete("t1", conversation_id=conv.id)
    assert SECRET not in json.dumps(texts(client, conv.id))


def test_previous_response_id_continues_its_conversation(client):
    first = client.responses.create(model="tiny", input=[{"role": "system", "content": "Terse."}, user("q1", "hi")])
    assert first.conversation is not None
    second = client.responses.create(model="tiny", previous_response_id=first.id, input="and?")
    assert second.conversation.id == first.conversation.id
    with pytest.raises(openai.BadRequestError):  # no branches from an older response
        client.responses.create(model="tiny", previous_response_id=first.id, input="again")


def test_chat_completions_reuse_cached_prefixes(client):
    messages = [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Hello."},
                {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Colour?"}]
    a = client.chat.completions.create(model="tiny", messages=messages)
    b = client.chat.completions.create(model="tiny", messages=messages)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert b.usage.prompt_tokens_details.cached_tokens > 0 and b.usage.prompt_tokens == a.usage.prompt_tokens
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == a.choices[0].message.content


def test_an_evicted_session_is_rebuilt_with_its_digest(lm, tmp_path):
    pool = Pool(make_engine(lm), tmp_path, kv_budget=0, defaults=SETTINGS)
    with ServerThread(pool, "tiny") as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        x, y = c.conversations.create(), c.conversations.create()
        c.responses.create(model="tiny", conversation=x.id, input=[user("x1", "one")])
        digest = state(c, x.id)["digest"]
        c.responses.create(model="tiny", conversation=y.id, input=[user("y1", "two")])
        assert pool.get(x.id).session is None and pool.stats["evictions"] >= 1  # budget 0: x was evicted
        rebuilds = pool.stats["rebuilds"]
        assert state(c, x.id)["digest"] == digest and pool.stats["rebuilds"] == rebuilds + 1
        before = texts(c, x.id)
    # a restart: every conversation reopens from its files, digests and items unchanged
    with ServerThread(Pool(make_engine(lm), tmp_path, defaults=SETTINGS), "tiny") as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        assert state(c, x.id)["digest"] == digest and texts(c, x.id) == before
        c.conversations.delete(x.id)
        with pytest.raises(openai.NotFoundError):
            c.conversations.retrieve(x.id)
        assert not (tmp_path / x.id).exists()


def test_the_load_bench_replays_every_conversation_to_the_servers_digest(one_thread):
    from unsee.bench import serve_load

    out = serve_load.run(serve_load.argparse.Namespace(
        model="tiny", conversations=3, turns=3, workers=3, max_output_tokens=4, kv_budget=65536, deadline=60,
        store=None))
    assert out["forgets"] == 3 and out["requests"] == 3 * 4 and not out["deadline_hit"]
    assert out["kv_budget"] < out["kv_sum_bytes"] and out["evictions"] > 0
    assert out["digests_differ"] == 0


@pytest.mark.parametrize("slots", [1, 4])
def test_eight_concurrent_conversations_on_llamacpp_each_equal_their_serial_replay(one_thread, slots):
    """Issue 40: eight conversations at once through the ``openai`` client (a
    client thread each, streamed and not, each with a forget) against one
    server on llama.cpp's tiny GGUF, under a KV budget that evicts; each
    conversation's digest equals its serial in-process replay. With 4 slots
    their decode steps share forwards, and the replay runs on one slot, each
    step alone."""
    from unsee.bench import serve_load
    from unsee.impl.engines.llamacpp import engine as llamacpp

    if not llamacpp.available():
        pytest.skip("llama-cpp-python is not installed")
    out = serve_load.run(serve_load.argparse.Namespace(
        model="tiny", engine="llamacpp", conversations=8, turns=3, workers=8, max_output_tokens=6,
        kv_budget=65536, deadline=120, store=None, slots=slots))
    assert out["engine"] == "llamacpp" and out["requests"] == 8 * 4 and not out["deadline_hit"]
    assert out["forgets"] == 8 and out["evictions"] > 0
    # the loop lets another request's work run while a forward is computed, so the turns
    # and the replays were interleaved forward by forward (each hand-over parks one lineage's rows)
    assert out["handovers"] > 0
    # several slots: decode steps of several conversations in one forward, none with one
    assert (max(out["decode_batches"], default=0) > 1) == (slots > 1)
    assert out["digests_differ"] == 0


def test_a_langchain_client_by_base_url_chains_responses_and_its_item_forgets(client, server):
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage

    plain = langchain_openai.ChatOpenAI(base_url=server.url, api_key="unused", model="tiny", max_retries=0)
    assert isinstance(plain.invoke("Hello.").content, str)  # over chat completions
    llm = langchain_openai.ChatOpenAI(base_url=server.url, api_key="unused", model="tiny", max_retries=0,
                                      use_responses_api=True, use_previous_response_id=True)
    first = llm.invoke([HumanMessage(f"I live at {SECRET}.", id="lc1")])
    history = [HumanMessage(f"I live at {SECRET}.", id="lc1"), first, HumanMessage("Where do I live?")]
    second = llm.invoke(history)  # sends previous_response_id and only the new message
    conv_id = server.pool.responses[first.response_metadata["id"]]
    assert server.pool.responses[second.response_metadata["id"]] == conv_id
    assert state(client, conv_id)["steps"] == 2
    secret_id = next(i for i, _, text in texts(client, conv_id) if SECRET in text)
    client.conversations.items.delete(secret_id, conversation_id=conv_id)
    assert SECRET not in json.dumps(texts(client, conv_id))


def test_the_readme_client_session_runs(server, capsys):
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme[readme.index("## Serving: the OpenAI API"):]
    code = re.search(r"```text\n(from openai import OpenAI\n.*?)```", section, re.DOTALL).group(1)
    assert len(code.strip().splitlines()) == 6  # the import and five lines: leak, DELETE, clean answer
    code = code.replace("http://127.0.0.1:8000/v1", server.url).replace('model="smollm2"', 'model="tiny"')
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 (the README's own session, run)
    conv_id = namespace["conv"].id
    assert len(capsys.readouterr().out.splitlines()) >= 2
    after = openai.OpenAI(base_url=server.url, api_key="unused").conversations.items.list(conv_id, order="asc")
    assert "venue" not in [i.id for i in after.data] and SECRET not in after.model_dump_json()


def test_a_crash_between_a_steps_commit_and_the_sidecar_loses_and_doubles_nothing(lm, tmp_path):
    from unsee.impl.serve.conversation import SIDECAR, write_json_atomic

    pool = Pool(make_engine(lm), tmp_path, defaults=SETTINGS)
    with ServerThread(pool, "tiny") as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        conv = c.conversations.create(items=[user("k1", "kept")])
        sidecar = json.loads((tmp_path / conv.id / SIDECAR).read_text())  # k1 still waiting here
        c.responses.create(model="tiny", conversation=conv.id)
        digest, items = state(c, conv.id)["digest"], texts(c, conv.id)
    write_json_atomic(tmp_path / conv.id / SIDECAR, sidecar)  # as if the process died before the rename
    with ServerThread(Pool(make_engine(lm), tmp_path, defaults=SETTINGS), "tiny") as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        assert texts(c, conv.id) == items and state(c, conv.id) == {**state(c, conv.id), "digest": digest,
                                                                      "pending": 0}


def test_requests_on_one_conversation_are_serialised(client):
    import concurrent.futures

    conv = client.conversations.create()
    with concurrent.futures.ThreadPoolExecutor(3) as workers:  # the server's busy wait (5 s) covers the queue
        list(workers.map(lambda i: client.responses.create(model="tiny", conversation=conv.id,
                                                           input=[user(f"s{i}", f"message {i}")]), range(3)))
    items = texts(client, conv.id)
    assert state(client, conv.id)["steps"] == 3 and sorted(i for i, _, _ in items if i.startswith("s")) == [
        "s0", "s1", "s2"]
    roles = [i.role for i in client.conversations.items.list(conv.id, order="asc").data]
    assert roles == ["user", "assistant"] * 3  # each input followed by its own answer, never interleaved


def listing(client, conv_id: str) -> list[dict]:
    return [i.model_dump(exclude_none=True) for i in client.conversations.items.list(conv_id, order="asc",
                                                                                     limit=100).data]


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_streamed_turn_sends_its_tokens_as_they_are_decoded(client, server):
    conv = client.conversations.create()
    events = list(client.responses.create(model="tiny", conversation=conv.id, input=[user("s1", "Tell me more.")],
                                          stream=True, max_output_tokens=16))
    final = events[-1].response
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    # more than one delta: the text went out in pieces as it was decoded, not as one block at the end
    assert len(deltas) > 1 and "".join(d.delta for d in deltas) == final.output_text
    message = final.output[0]
    assert {d.item_id for d in deltas} == {message.id}  # the id streamed first is the stored item's
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert listing(client, conv.id)[-1]["id"] == message.id
    # the same turn, not streamed, in a twin: the same answer and digest
    twin = client.conversations.create()
    plain = client.responses.create(model="tiny", conversation=twin.id, input=[user("s1", "Tell me more.")],
                                    max_output_tokens=16)
    assert plain.output_text == final.output_text and state(client, twin.id)["digest"] == state(client, conv.id)[
        "digest"]


def test_chat_completions_stream_tokens_and_the_usage_chunk(client):
    messages = [{"role": "user", "content": "Count to ten."}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, stream=True, max_tokens=16,
                                                 stream_options={"include_usage": True}))
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) > 1 and "".join(texts) == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens and not chunks[-1].choices


#: forwards a turn may still run once its client has left: the disconnect is seen within a poll
#: (0.25 s, at 10 ms a forward here), then the step's roll-back; a turn not stopped runs its hundreds
LEFT_FORWARDS = 30


def test_a_client_that_leaves_mid_stream_stops_the_turn_and_the_conversation_is_as_before(client, server):
    conv = client.conversations.create()
    client.responses.create(model="tiny", conversation=conv.id, input=[user("e0", "Hi.")], max_output_tokens=4)
    before = state(client, conv.id)
    body = {"model": "tiny", "conversation": conv.id, "input": [user("e1", "A long story, please.")], "stream": True,
            "max_output_tokens": 600}
    loop = server.pool.loop
    # every thread's: the server's worker decodes the turn at 10 ms a forward at least
    slow = server.pool.engine.hook_forwards(lambda n, started: time.sleep(0.01), every_thread=True)
    with slow:
        with httpx.Client(timeout=60) as http, http.stream("POST", f"{server.url}/responses", json=body) as reply:
            for line in reply.iter_lines():
                if '"response.output_text.delta"' in line:
                    break  # the first token arrived: the client goes away
            left = loop.forwards
        after = state(client, conv.id)  # waits for the conversation: the worker has stopped
        ran = loop.forwards - left
    assert ran < LEFT_FORWARDS, f"{ran} forwards after the client left"
    assert after == before  # the turn was rolled back: no half-written step
    again = client.responses.create(model="tiny", conversation=conv.id, input=[user("e1", "A long story, please.")],
                                    max_output_tokens=600)
    assert again.usage.output_tokens > LEFT_FORWARDS  # the turn the client left would have run on
    twin = client.conversations.create()
    client.responses.create(model="tiny", conversation=twin.id, input=[user("e0", "Hi.")], max_output_tokens=4)
    client.responses.create(model="tiny", conversation=twin.id, input=[user("e1", "A long story, please.")],
                            max_output_tokens=600)
    assert state(client, conv.id)["digest"] == state(client, twin.id)["digest"]


def test_a_client_that_leaves_a_response_not_streamed_stops_its_turn(client, server):
    conv = client.conversations.create()
    body = {"model": "tiny", "conversation": conv.id, "input": [user("n1", "A long story, please.")],
            "max_output_tokens": 600}
    loop = server.pool.loop
    with server.pool.engine.hook_forwards(lambda n, started: time.sleep(0.01), every_thread=True):
        with httpx.Client(timeout=0.5) as http, pytest.raises(httpx.ReadTimeout):
            http.post(f"{server.url}/responses", json=body)  # the client gives up and closes its connection
        left = loop.forwards
        after = state(client, conv.id)  # waits for the conversation: the worker has stopped
        ran = loop.forwards - left
    assert ran < LEFT_FORWARDS, f"{ran} forwards after the client left"
    assert after["steps"] == 0 and listing(client, conv.id) == []


def test_a_server_stopping_ends_the_turn_in_flight_at_its_next_forward(lm, tmp_path):
    pool = Pool(make_engine(lm), tmp_path, defaults=SETTINGS)
    results, srv = [], ServerThread(pool, "tiny").__enter__()
    other = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
    conv = other.conversations.create()

    def ask():
        try:
            results.append(other.responses.create(model="tiny", conversation=conv.id, max_output_tokens=600,
                                                  input=[user("s1", "A long story, please.")]))
        except openai.APIError as exc:
            results.append(exc)
    with pool.engine.hook_forwards(lambda n, started: time.sleep(0.01), every_thread=True):
        asker = threading.Thread(target=ask)
        asker.start()
        deadline = time.monotonic() + 20
        while pool.loop.forwards < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        stopping, at = pool.loop.forwards, time.monotonic()
        srv.__exit__(None, None, None)  # as SIGTERM does (StoppingServer.handle_exit)
        took, ran = time.monotonic() - at, pool.loop.forwards - stopping
    asker.join(30)
    assert ran < LEFT_FORWARDS, f"{ran} forwards after the server began to stop"
    assert took < 10, f"the server took {took:.1f} s to stop"
    assert results and isinstance(results[0], openai.APIStatusError) and results[0].status_code == 503
    assert not (tmp_path / conv.id / "session.db").exists()  # its first step failed whole: no store was left


def test_a_response_runs_while_another_conversations_forget_replays(client, server):
    """Issue 40: a DELETE's replay is background work; a response on another
    conversation takes the engine at the replay's next forward and runs to its
    end, so it returns while the forget is still replaying."""
    a, b = client.conversations.create(), client.conversations.create()
    for i in range(8):
        client.responses.create(model="tiny", conversation=a.id, input=[user(f"a{i}", f"Fact number {i}.")],
                                max_output_tokens=16)
    client.responses.create(model="tiny", conversation=b.id, input=[user("b0", "Hello.")], max_output_tokens=4)
    done = {}

    def forget():
        client.conversations.items.delete("a0", conversation_id=a.id)
        done["forget"] = time.monotonic()
    # every thread's forwards slowed, so the replay (8 turns) outlasts a 4-token turn by far
    with server.pool.engine.hook_forwards(lambda n, started: time.sleep(0.03), every_thread=True):
        worker = threading.Thread(target=forget)
        worker.start()
        deadline = time.monotonic() + 30
        while not server.pool.get(a.id).lock.locked():  # the DELETE holds its conversation
            assert time.monotonic() < deadline
            time.sleep(0.005)
        time.sleep(0.1)  # well into the replay
        client.responses.create(model="tiny", conversation=b.id, input=[user("b1", "Again.")], max_output_tokens=4)
        done["response"] = time.monotonic()
        still_replaying = "forget" not in done
        worker.join(60)
    assert still_replaying and done["response"] < done["forget"]
    assert "a0" not in [i["id"] for i in listing(client, a.id)]


def test_instructions_that_change_re_render_the_context_and_a_forget_replays_them(client, server):
    def run(conv_id: str, turns) -> None:
        for instructions, items in turns:
            client.responses.create(model="tiny", conversation=conv_id, input=items, instructions=instructions)

    secret = "I was born in Qaanaaq."
    turns = [("Be brief.", [user("i1", secret)]), ("Answer in French.", [user("i2", "Where was I born?")]),
             (None, [user("i3", "Thanks.")])]  # none: the conversation's own system prompt again
    conv = client.conversations.create(items=[{"role": "system", "content": "You are a helper."}])
    run(conv.id, turns)
    runtime = server.pool.get(conv.id).session.runtime
    assert [b for b in runtime.context if b.endswith("/system")] == ["turn_3/system"]  # re-rendered at turns 2, 3
    gone = client.conversations.items.delete("i1", conversation_id=conv.id).model_extra
    assert gone["status"] == "completed" and gone["report"]["tau"] == 1
    twin = client.conversations.create(items=[{"role": "system", "content": "You are a helper."}])
    run(twin.id, [("Be brief.", []), *turns[1:]])
    assert state(client, conv.id)["digest"] == state(client, twin.id)["digest"]
    assert listing(client, conv.id) == listing(client, twin.id)
    store = server.pool.get(conv.id).store_path
    assert verify_store(store, gone["receipt"], value="Qaanaaq").outcome == "verified"


def test_each_key_sees_only_its_own_conversations_and_chat_cache(lm, tmp_path):
    key_file = tmp_path / "keys.txt"
    key_file.write_text("\n".join(KEYS) + "\n")
    pool = Pool(make_engine(lm), tmp_path / "store", defaults=SETTINGS)
    with ServerThread(pool, "tiny", api_keys=read_api_keys(key_file)) as srv:
        alpha, beta = (openai.OpenAI(base_url=srv.url, api_key=k, max_retries=0) for k in KEYS)
        conv = alpha.conversations.create(items=[user("k1", "mine")])
        first = alpha.responses.create(model="tiny", conversation=conv.id)
        for call in (lambda: beta.conversations.retrieve(conv.id), lambda: beta.conversations.items.list(conv.id),
                     lambda: beta.conversations.items.delete("k1", conversation_id=conv.id),
                     lambda: beta.responses.create(model="tiny", conversation=conv.id, input="hi"),
                     lambda: beta.responses.create(model="tiny", previous_response_id=first.id, input="hi"),
                     lambda: beta.conversations.delete(conv.id)):
            with pytest.raises(openai.NotFoundError):  # as if it did not exist: ids leak nothing
                call()
        assert pool.get(conv.id, get_owner_of(KEYS[0])).record["owner"] == get_owner_of(KEYS[0])
        assert KEYS[0] not in (tmp_path / "store" / conv.id / "conversation.json").read_text()
        messages = [{"role": "system", "content": "A long shared prefix " * 8}, {"role": "user", "content": "Hi."}]
        alpha.chat.completions.create(model="tiny", messages=messages)
        again = alpha.chat.completions.create(model="tiny", messages=messages)
        other = beta.chat.completions.create(model="tiny", messages=messages)
        assert again.usage.prompt_tokens_details.cached_tokens > 0
        assert other.usage.prompt_tokens_details.cached_tokens == 0  # a prefix alpha sent is not beta's cache
        assert other.choices[0].message.content == again.choices[0].message.content


def test_a_turn_past_the_context_is_400_context_length_exceeded_and_writes_nothing(client, server):
    conv = client.conversations.create()
    client.responses.create(model="tiny", conversation=conv.id, input=[user("c1", "hello")])
    before = snapshot(server.root)
    too_long = "word " * 1000  # the tiny model's context is 4096 byte tokens
    for call in (lambda: client.responses.create(model="tiny", conversation=conv.id, input=too_long),
                 lambda: client.responses.create(model="tiny", input=too_long),
                 lambda: client.responses.create(model="tiny", input=too_long, store=False),
                 lambda: client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": too_long}])):
        with pytest.raises(openai.BadRequestError) as refused:
            call()
        assert refused.value.body["code"] == "context_length_exceeded", refused.value.body
    assert snapshot(server.root) == before
    assert state(client, conv.id)["steps"] == 1


def test_a_stateless_response_stores_nothing(client, server):
    before = snapshot(server.root)
    history = [{"role": "system", "content": "Terse."}, {"role": "user", "content": "Hi."},
               {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again?"}]
    kept = client.responses.create(model="tiny", input=history)  # the model's own item: nothing stored
    unstored = client.responses.create(model="tiny", input="Hi.", store=False)
    assert kept.conversation is None and not kept.store and unstored.conversation is None
    assert snapshot(server.root) == before
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny", previous_response_id=kept.id, input="more")
    chat = client.chat.completions.create(model="tiny", messages=[{"role": m["role"], "content": m["content"]}
                                                                   for m in history])
    assert kept.output_text == chat.choices[0].message.content  # computed as the chat completion is
    assert json.loads(kept.model_dump_json())["usage"]["input_tokens"] == chat.usage.prompt_tokens


def test_removed_texts_leave_no_file_the_server_keeps_after_a_restart(lm, tmp_path):
    """A tool output forgotten, a waiting item deleted, a conversation deleted: after a restart no
    file under the store root holds a byte of their text (the store, the sidecar's tool records
    and waiting lists, the owner index)."""
    removed = {"o1": "The vault code is 9-4-7-1.", "w1": "My passport number is X1234.",
               "x1": "Deleted along with its conversation."}
    with ServerThread(Pool(make_engine(lm), tmp_path, defaults=SETTINGS), "tiny") as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        conv = c.conversations.create(items=[user("r1", "Look it up.")])
        c.responses.create(model="tiny", conversation=conv.id)
        c.responses.create(model="tiny", conversation=conv.id, input=[
            {"type": "function_call_output", "call_id": "call_9", "output": removed["o1"], "id": "o1", "name": "vault"}])
        c.conversations.items.create(conv.id, items=[user("w1", removed["w1"])])
        for item_id in ("o1", "w1"):
            assert c.conversations.items.delete(item_id, conversation_id=conv.id).model_extra["removed"][0] == item_id
        other = c.conversations.create(items=[user("x1", removed["x1"])])
        c.responses.create(model="tiny", conversation=other.id)
        c.conversations.delete(other.id)
        digest = state(c, conv.id)["digest"]
    with ServerThread(Pool(make_engine(lm), tmp_path, defaults=SETTINGS), "tiny") as srv:
        assert state(openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0), conv.id)["digest"] == digest
    found = [(str(p.relative_to(tmp_path)), k) for p in tmp_path.rglob("*") if p.is_file()
             for k, text in removed.items() if text.encode() in p.read_bytes()]
    assert not found


def test_the_default_kv_budget_is_half_of_what_the_loaded_model_leaves():
    from unsee.impl.serve.budget import compute_default_kv_budget, get_default_kv_budget, get_physical_bytes

    assert compute_default_kv_budget(10 * 2**30, 4 * 2**30) == 3 * 2**30
    assert compute_default_kv_budget(2**30, 2**31) == 0  # a process larger than the machine: no KV kept
    physical = get_physical_bytes()
    if physical is not None:
        assert 0 < get_default_kv_budget() < physical // 2


def test_serve_passes_its_llamacpp_flags_to_the_engine_and_holds_eight_slots_unless_told_otherwise():
    from unsee.impl.engines.llamacpp.model import get_cores
    from unsee.impl.serve.threads import get_llamacpp_options

    every = get_cores()  # prefill on every core; decode threads: the loader's
    assert get_llamacpp_options("llamacpp", None, None, None, {}) == {"slots": 8, "batch_threads": every}
    assert get_llamacpp_options("llamacpp", None, None, None, {"UNSEE_LLAMA_SLOTS": "2"}) == {"batch_threads": every}
    assert get_llamacpp_options("llamacpp", None, None, None, {"UNSEE_LLAMA_BATCH_THREADS": "1"}) == {"slots": 8}
    assert get_llamacpp_options("llamacpp", 2, 4, 3, {}) == {"threads": 2, "batch_threads": 4, "slots": 3}
    assert get_llamacpp_options("transformers", None, None, None, {}) == {}
    with pytest.raises(ValueError, match="--slots"):
        get_llamacpp_options("transformers", None, None, 4, {})
    with pytest.raises(ValueError, match="--threads 0"):
        get_llamacpp_options("llamacpp", 0, None, None, {})
    assert get_cores() >= 1


def test_the_memory_bench_keeps_the_held_kv_under_the_budget(one_thread):
    """bench/serve_memory.py on the tiny model: conversations with long first
    messages under a budget smaller than their KV together; the pool evicts
    and the held bytes stay under it after every response."""
    from unsee.bench import serve_memory

    out = serve_memory.run(serve_memory.argparse.Namespace(
        model="tiny", engine="transformers", conversations=4, history_tokens=200, max_output_tokens=2,
        kv_budget=300_000, store=None), progress=lambda line: None)
    assert out["prompt_tokens"] >= 200 and len(out["rows"]) == 4
    assert out["rows"][-1]["evictions"] > 0 and out["under_budget"]
    assert all(r["held_bytes"] <= 300_000 for r in out["rows"])
