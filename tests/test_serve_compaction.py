"""Compaction in ``unsee serve`` (issue 52; docs/serve.md, "Long conversations") on the tiny
model, with the real ``openai`` client.

A conversation run with a low ``compact_threshold`` is compacted before its second and third
turns: each response's output opens with a ``compaction`` item holding the summary the model
wrote, readable, and the items list it. The secret's item, observed in the first turn and read by
both summaries, is deleted: the replay rewrites both summaries without it, and the conversation
equals a twin that never had it (digest, items, next answer). After a restart no file under the
store holds a byte of the secret. Deleting a compaction item is refused with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from unsee import Settings
from unsee.impl.engines.registry import make_engine
from unsee.impl.serve.pool import Pool
from unsee.impl.serve.server import ServerThread

SETTINGS = Settings(max_new_tokens=6)
SECRET = "the vault code is 9-4-7-1"
#: low enough that every turn after the first compacts first
COMPACTION = [{"type": "compaction", "compact_threshold": 8}]


def connect(srv):
    return openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)


def user(item_id: str, text: str) -> dict:
    return {"type": "message", "role": "user", "content": text, "id": item_id}


def digest(client, conv_id: str) -> str:
    return client.conversations.retrieve(conv_id).model_extra["unsee"]["digest"]


def listing(client, conv_id: str) -> list[dict]:
    return [i.model_dump(exclude_none=True) for i in client.conversations.items.list(conv_id, order="asc",
                                                                                     limit=100).data]


def scan(root: Path, text: str) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def run_conversation(client, secret: bool) -> tuple[str, list]:
    """Three turns, the first with the secret's item ``s1`` (where ``secret``); the outputs."""
    conv = client.conversations.create(items=[{"role": "system", "content": "Be brief."}]).id
    first = [user("u1", "Hi, I am Ada."), *([user("s1", SECRET)] if secret else [])]
    outputs = [client.responses.create(model="tiny", conversation=conv, input=first, context_management=COMPACTION)]
    for n, text in ((2, "Go on."), (3, "And then?")):
        outputs.append(client.responses.create(model="tiny", conversation=conv, input=[user(f"u{n}", text)],
                                               context_management=COMPACTION))
    return conv, outputs


def test_a_conversation_compacted_twice_forgets_through_its_summaries(lm, tmp_path):
    with ServerThread(Pool(make_engine(lm), tmp_path, defaults=SETTINGS), "tiny") as srv:
        client = connect(srv)
        conv, outputs = run_conversation(client, secret=True)
        assert [o.type for o in outputs[0].output] == ["message"]  # nothing to summarise yet
        summaries = [o.output[0] for o in outputs[1:]]
        assert all(s.type == "compaction" and s.encrypted_content == "" for s in summaries)
        assert all(o.output[1].type == "message" for o in outputs[1:])  # the answer after its summary
        runtime = srv.pool.get(conv).session.runtime
        assert [s.kind for s in runtime.steps] == ["user", "compact", "user", "compact", "user"]
        cost = outputs[2].model_extra["unsee"]["compaction"]  # what the turn's compaction cost and left
        assert cost["step"] == "turn_4" and cost["context_tokens_after"] < cost["read_tokens"]
        assert cost["summary_tokens"] == len(runtime.graph["turn_4/answer"].tokens)
        # each summary read the secret's item (provenance), and the second read the first
        assert all("s1" in runtime.graph[f"turn_{t}/answer"].source_ids for t in (2, 4))
        items = listing(client, conv)
        listed = [i for i in items if i["type"] == "compaction"]
        assert [i["id"] for i in listed] == [s.id for s in summaries]
        assert [i["summary"][0]["text"] for i in listed] == [s.model_extra["summary"][0]["text"] for s in summaries]
        with pytest.raises(openai.BadRequestError, match="compaction summary"):
            client.conversations.items.delete(summaries[0].id, conversation_id=conv)

        gone = client.conversations.items.delete("s1", conversation_id=conv).model_extra
        report = gone["report"]  # the summaries count as transitions: T - tau + 1 of them replayed
        assert gone["status"] == "completed" and (report["tau"], report["length"], report["invocations"]) == (1, 5, 5)
        assert {i["id"] for i in gone["rewritten"] if i["type"] == "compaction"} and not (
            {s.id for s in summaries} & {i["id"] for i in listing(client, conv)})  # both summaries rewritten
        after = listing(client, conv)
        assert SECRET not in json.dumps(after)
        twin, twin_outputs = run_conversation(client, secret=False)
        assert [[o.type for o in out.output] for out in twin_outputs] == [
            [o.type for o in out.output] for out in outputs]  # the twin compacted at the same turns
        assert digest(client, conv) == digest(client, twin)
        assert after == listing(client, twin)
        nxt = [client.responses.create(model="tiny", conversation=c, input="Who am I?",
                                       context_management=COMPACTION) for c in (conv, twin)]
        assert [o.model_dump() for o in nxt[0].output] == [o.model_dump() for o in nxt[1].output]
        assert nxt[0].output[0].type == "compaction"
        final = digest(client, conv)
    with ServerThread(Pool(make_engine(lm), tmp_path, defaults=SETTINGS), "tiny") as srv:
        assert digest(connect(srv), conv) == final  # a restart: the store, read back
    assert not scan(tmp_path, SECRET) and not scan(tmp_path, "9-4-7-1")


def test_truncation_auto_compacts_a_turn_past_the_context_and_disabled_is_a_400(lm, tmp_path):
    """A turn that would pass the model's context (the tiny model's 4096 tokens) is a 400 by
    default (nothing written) and compacts first with ``truncation: "auto"``; a turn that fits
    never compacts; a bad entry is a 400 naming it."""
    with ServerThread(Pool(make_engine(lm), tmp_path, defaults=SETTINGS), "tiny") as srv:
        client = connect(srv)
        conv = client.conversations.create().id
        long = " ".join(["word"] * 700)  # about 3,500 tokens of the tiny model
        client.responses.create(model="tiny", conversation=conv, input=long)
        out = client.responses.create(model="tiny", conversation=conv, input="Go on.", truncation="auto")
        assert [o.type for o in out.output] == ["message"]
        items = listing(client, conv)
        with pytest.raises(openai.BadRequestError, match="context"):
            client.responses.create(model="tiny", conversation=conv, input=long)
        assert listing(client, conv) == items
        out = client.responses.create(model="tiny", conversation=conv, input=long, truncation="auto")
        assert [o.type for o in out.output] == ["compaction", "message"]
        events = list(client.responses.create(model="tiny", conversation=conv, input="More.", stream=True,
                                              context_management=COMPACTION))
        done = [e.item for e in events if e.type == "response.output_item.done"]
        final = events[-1].response.output
        assert [i.type for i in done] == [i.type for i in final] == ["compaction", "message"]
        assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1]
        assert done[0].model_dump() == final[0].model_dump()
        items = listing(client, conv)  # the summary, then the turn's input and answer
        assert [i["type"] for i in items[-3:]] == ["compaction", "message", "message"]
        assert [items[-3], items[-1]] == [i.model_dump(exclude_none=True) for i in final]
        with pytest.raises(openai.BadRequestError, match="context"):  # no summary makes room: nothing written
            client.responses.create(model="tiny", conversation=conv, input=long + " " + long, truncation="auto")
        assert listing(client, conv) == items
        with pytest.raises(openai.BadRequestError, match="compact_threshold"):
            client.responses.create(model="tiny", conversation=conv, input="x",
                                    context_management=[{"type": "compaction", "compact_threshold": 0}])
        with pytest.raises(openai.BadRequestError, match="truncation"):
            client.responses.create(model="tiny", conversation=conv, input="x", extra_body={"truncation": "middle"})


def test_the_compact_endpoint_compacts_a_stored_conversation_by_its_latest_response(lm, tmp_path):
    """``POST /v1/responses/compact`` with ``previous_response_id``: a compact step on that
    conversation (its compaction item and usage), which the next response continues on; a
    response that is not the latest, a just-compacted conversation and a client's own input are
    400s that name why, and write nothing."""
    with ServerThread(Pool(make_engine(lm), tmp_path, defaults=SETTINGS), "tiny") as srv:
        client = connect(srv)
        first = client.responses.create(model="tiny", input="Hi, I am Ada.")
        second = client.responses.create(model="tiny", input="Go on.", previous_response_id=first.id)
        conv = second.conversation.id
        with pytest.raises(openai.BadRequestError, match="not the latest"):
            client.responses.compact(model="tiny", previous_response_id=first.id)
        with pytest.raises(openai.BadRequestError, match="input"):
            client.responses.compact(model="tiny", input="Hi.")
        assert [i["type"] for i in listing(client, conv)] == ["message"] * 4
        out = client.responses.compact(model="tiny", previous_response_id=second.id)
        assert out.object == "response.compaction" and [o.type for o in out.output] == ["compaction"]
        assert out.usage.output_tokens > 0
        with pytest.raises(openai.BadRequestError, match="just compacted"):
            client.responses.compact(model="tiny", previous_response_id=second.id)
        items = listing(client, conv)
        assert items[-1] == out.output[0].model_dump(exclude_none=True)
        third = client.responses.create(model="tiny", input="And then?", previous_response_id=second.id)
        runtime = srv.pool.get(conv).session.runtime
        assert [s.kind for s in runtime.steps] == ["user", "user", "compact", "user"]
        assert runtime.context[1] == "turn_3/context"  # the next turn ran on the summary
        assert [o.type for o in third.output] == ["message"]



#: a tool whose only call is ``{}`` (strict, no parameters): a replay's call is the recorded one,
#: so the recorded output answers it
TIDE = {"type": "function", "name": "tide", "description": "The tide table.", "strict": True,
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}


def run_tool_rounds(client, secret: bool) -> tuple[str, list]:
    """Three turns, each but the last a forced call of ``tide`` and its output answered; every
    turn after the first compacts first, so each summary is followed by the round before it.
    The first turn holds the secret's item ``s1`` (where ``secret``)."""
    conv = client.conversations.create(items=[{"role": "system", "content": "Be brief."}]).id
    first = [user("u1", "Hi, I am Ada."), *([user("s1", SECRET)] if secret else [])]
    outputs = []
    for n, items in enumerate((first, [user("u2", "And tomorrow?")], [user("u3", "Thanks.")])):
        forced = {"tool_choice": {"type": "function", "name": "tide"}, "max_output_tokens": 48} if n < 2 else {}
        out = client.responses.create(model="tiny", conversation=conv, input=items, context_management=COMPACTION,
                                      tools=[TIDE], **forced)  # the same tools throughout: one system block
        outputs.append(out)
        if n < 2:
            call = out.output[-1]
            answered = [{"type": "function_call_output", "call_id": call.call_id, "output": f"High tide 0{n}:14."}]
            outputs.append(client.responses.create(model="tiny", conversation=conv, input=answered, tools=[TIDE]))
    return conv, outputs


def test_a_compaction_keeps_the_latest_tool_round_and_a_delete_reaches_it(qwen_style, tmp_path):
    """After a summary the context holds the latest tool round verbatim (the call, its output, the
    answer: their tokens, their sources), so the next turn follows an answered round; deleting the
    item that led to the kept calls replays both compactions, which keep the rounds the replay finds,
    and the conversation equals its twin (digest, items, next answer); no file holds the secret."""
    with ServerThread(Pool(make_engine(qwen_style), tmp_path, defaults=SETTINGS), "tiny") as srv:
        client = connect(srv)
        conv, outputs = run_tool_rounds(client, secret=True)
        runtime = srv.pool.get(conv).session.runtime
        assert [s.kind for s in runtime.steps] == ["user", "tool", "compact", "user", "tool", "compact", "user"]
        assert [o.type for o in outputs[2].output] == ["compaction", "function_call"]
        kept = [runtime.graph[b] for b in runtime.context[2:5]]
        originals = [runtime.graph[b] for b in ("turn_4/answer", "turn_5", "turn_5/answer")]
        assert runtime.context[:2] == ["turn_6/system", "turn_6/context"]
        assert [b.id for b in kept] == [f"turn_6/context/{n}" for n in (1, 2, 3)]
        assert [b.tokens for b in kept] == [b.tokens for b in originals]  # verbatim
        assert [b.type for b in kept] == ["answer", "tool", "answer"] and "High tide 01:14." in kept[1].text
        assert all("s1" in b.source_ids for b in kept)  # the round read the secret's item, so a forget reaches it
        assert runtime.graph["turn_7"].parents[2:5] == tuple(b.id for b in kept)
        cost = outputs[4].model_extra["unsee"]["compaction"]  # the round counted in what the compaction left
        assert cost["kept_tokens"] == sum(len(b.tokens) for b in kept)
        assert cost["context_tokens_after"] == kept[-1].token_span[1]

        gone = client.conversations.items.delete("s1", conversation_id=conv).model_extra
        report = gone["report"]
        assert gone["status"] == "completed" and (report["tau"], report["length"], report["invocations"]) == (1, 7, 7)
        twin, twin_outputs = run_tool_rounds(client, secret=False)
        assert [[o.type for o in out.output] for out in twin_outputs] == [
            [o.type for o in out.output] for out in outputs]
        assert digest(client, conv) == digest(client, twin)
        assert listing(client, conv) == listing(client, twin)
        nxt = [client.responses.create(model="tiny", conversation=c, input="Bye.", context_management=COMPACTION,
                                       tools=[TIDE])
               for c in (conv, twin)]
        assert [o.model_dump() for o in nxt[0].output] == [o.model_dump() for o in nxt[1].output]
        final = digest(client, conv)
    with ServerThread(Pool(make_engine(qwen_style), tmp_path, defaults=SETTINGS), "tiny") as srv:
        assert digest(connect(srv), conv) == final
    assert not scan(tmp_path, SECRET) and not scan(tmp_path, "9-4-7-1")
