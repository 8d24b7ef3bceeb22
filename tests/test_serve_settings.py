"""Settings per request (issue 49, items 4 and 5) on the tiny models: each request's
temperature, seed, top_p, penalties, output cap and stop texts are recorded with its
turn (the step's config), so a forget's replay decodes each turn as it was, and a
conversation whose turns used different settings equals its twin after a DELETE (after
a restart too); a stop text ends the turn and is not returned; log-probabilities come
back in both APIs' shapes and are not stored; the default output cap is the rest of the
context; ``--ctx-size`` is honoured and refused past the model's trained length; a config
with default settings keeps the record and key it had before."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from unsee import Settings
from unsee.impl.agent.tools.client import ClientToolRuntime, Config, Sampling
from unsee.impl.cli.serve import get_context_options
from unsee.impl.engines.decoding import PLAIN
from unsee.impl.engines.registry import make_engine
from unsee.impl.engines.stops import StopTexts, cut_at_stop, get_sendable
from unsee.impl.serve.pool import Pool
from unsee.impl.serve.server import ServerThread
from unsee.impl.util.ids import ANSWER, compute_block_id

SETTINGS = Settings(max_new_tokens=24)
SECRET = "My locker code is 5-5-2-9."
#: the settings of three turns: sampled with a seed and a stop, greedy with a stop, sampled in a nucleus
TURNS = ({"temperature": 0.8, "max_output_tokens": 8, "extra_body": {"seed": 5, "stop": ["Qi", "zz"]}},
         {"temperature": 0.0, "max_output_tokens": 10, "extra_body": {"stop": "x"}},
         {"temperature": 1.2, "top_p": 0.9, "max_output_tokens": 6, "extra_body": {"seed": 11}})


@pytest.fixture(scope="module")
def server(lm, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-settings")
    with ServerThread(Pool(make_engine(lm), root, defaults=SETTINGS), "tiny") as srv:
        srv.root = root
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


def user(item_id: str, text: str) -> dict:
    return {"type": "message", "role": "user", "content": text, "id": item_id}


def texts(client, conv_id: str) -> list[tuple[str, str, str]]:
    out = []
    for item in client.conversations.items.list(conv_id, order="asc", limit=100).data:
        text = item.output if item.type == "function_call_output" else item.content[0].text
        out.append((item.id, item.type, text))
    return out


def digest(client, conv_id: str) -> str:
    return client.conversations.retrieve(conv_id).model_extra["unsee"]["digest"]


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def configs(pool: Pool, conv_id: str) -> dict[str, dict]:
    """The recorded config of each step, as plain records."""
    runtime = pool.get(conv_id).runtime
    return {k: v.get_record() for k, v in sorted(runtime.client.configs.items())}


def find_stop(text: str) -> str | None:
    """Two printable ASCII characters in ``text`` after its first, to stop at."""
    match = re.search(r"[A-Za-z0-9]{2}", text[1:])
    return match.group(0) if match else None


# --- the record ---------------------------------------------------------------------


def test_a_config_with_default_sampling_keeps_its_record_and_key():
    config = Config("Be brief.", ('{"type": "function", "function": {"name": "f"}}',), "required")
    old = {"system": "Be brief.", "tools": ['{"type": "function", "function": {"name": "f"}}'], "choice": "required",
           "function": None, "parallel": True}  # the record before per-request settings
    assert config.get_record() == old and json.dumps(config.get_record()) == json.dumps(old)
    assert config.get_key() == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:32]
    assert Config.from_record(old) == config
    sampled = attrs_evolve(config, Sampling(temperature=0.5, seed=3, top_p=0.9, stop=("a", "b")))
    record = sampled.get_record()
    assert record["sampling"] == {"temperature": 0.5, "seed": 3, "top_p": 0.9, "stop": ["a", "b"]}
    assert Config.from_record(json.loads(json.dumps(record))) == sampled and sampled.get_key() != config.get_key()


def attrs_evolve(config: Config, sampling: Sampling) -> Config:
    import attrs

    return attrs.evolve(config, sampling=sampling)


def test_a_turn_s_rule_carries_its_nucleus_penalties_and_stops(tiny_engine):
    runtime = ClientToolRuntime.start(tiny_engine, "s", SETTINGS)
    settings, rule = runtime.get_turn_settings(Config("s"))
    assert settings == SETTINGS and rule is PLAIN  # nothing asked: the plain rule and its fast paths
    sampling = Sampling(temperature=0.7, seed=9, max_new_tokens=5, top_p=0.5, frequency_penalty=1.0,
                        presence_penalty=-0.5, stop=("END",))
    settings, rule = runtime.get_turn_settings(Config("s", sampling=sampling))
    assert (settings.temperature, settings.seed, settings.max_new_tokens) == (0.7, 9, 5)
    assert (rule.top_p, rule.frequency_penalty, rule.presence_penalty) == (0.5, 1.0, -0.5)
    assert [type(c) for c in rule.constraints] == [StopTexts] and rule.on_decision is None
    runtime.logprobs = 2
    assert runtime.get_turn_settings(Config("s"))[1].on_decision is not None


def test_stop_texts_read_a_window_and_cut_before_the_stop():
    stop = StopTexts(lambda ids: bytes(ids).decode("utf-8", "replace"), ["END", "\n\n"], eos_ids=[0])
    ids = list(b"some text, then EN")
    assert not stop.is_done(ids) and stop.is_done([*ids, ord("D")]) and stop.is_done([*ids, ord("D"), 0])
    assert stop.window == 4  # the longest stop's bytes and one
    assert cut_at_stop("abc END def \n\n", ["END", "\n\n"]) == "abc "
    assert get_sendable("a text that ends in E", ["END"]) == "a text that ends in "  # maybe a stop: held
    assert get_sendable("a text, END, more", ["END"]) == "a text, "


# --- per request ----------------------------------------------------------------------


def test_each_request_on_a_conversation_runs_with_its_own_settings_recorded_with_its_turn(client, server):
    conv = client.conversations.create()
    first = client.responses.create(model="tiny", conversation=conv.id, input=[user("p1", "Hello there.")])
    second = client.responses.create(model="tiny", conversation=conv.id, input=[user("p2", "Again.")],
                                     temperature=0.9, top_p=0.8, max_output_tokens=5,
                                     extra_body={"seed": 7, "stop": ["zz", "Qi"]})
    assert first.temperature == 0.0 and second.temperature == 0.9 and second.top_p == 0.8
    assert second.max_output_tokens == 5 and first.max_output_tokens is None
    recorded = configs(server.pool, conv.id)
    assert "sampling" not in recorded["turn_1"]  # the session's settings: the record of before
    assert recorded["turn_2"]["sampling"] == {"temperature": 0.9, "seed": 7, "max_new_tokens": 5, "top_p": 0.8,
                                              "stop": ["zz", "Qi"]}
    runtime = server.pool.get(conv.id).runtime
    assert len(runtime.graph[compute_block_id("turn_2", ANSWER)].tokens) <= 5 + len(
        runtime.engine.lm.encode(runtime.renderer.render_header()))
    # a greedy request's seed and nucleus change nothing, so its turn records none
    client.responses.create(model="tiny", conversation=conv.id, input=[user("p3", "More.")], top_p=0.5,
                            extra_body={"seed": 99})
    assert "sampling" not in configs(server.pool, conv.id)["turn_3"]


def test_a_stop_text_ends_the_turn_and_is_not_returned(client, server):
    prompt = [{"role": "user", "content": "Hello there."}]
    plain = client.chat.completions.create(model="tiny", messages=prompt).choices[0]
    stop = find_stop(plain.message.content)
    assert stop is not None, plain.message.content
    cut = client.chat.completions.create(model="tiny", messages=prompt, stop=[stop, "never"]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.message.content == plain.message.content[:plain.message.content.index(stop)].rstrip()
    # streamed: the same text, the stop never sent
    chunks = list(client.chat.completions.create(model="tiny", messages=prompt, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == cut.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    # a conversation's turn: completed, its committed tokens end with the token that completed the stop
    conv = client.conversations.create()
    reply = client.responses.create(model="tiny", conversation=conv.id, input="Hello there.",
                                    extra_body={"stop": stop})
    assert reply.status == "completed" and reply.output_text == cut.message.content
    runtime = server.pool.get(conv.id).runtime
    block = runtime.graph[compute_block_id("turn_1", ANSWER)]
    assert block.text.endswith(stop)


@pytest.fixture
def qwen_style(lm):
    """The tiny model under the Qwen-style template tests/test_render.py writes for its tool tests
    (loaded from its file: the tests are imported in importlib mode, not as a package)."""
    spec = importlib.util.spec_from_file_location("test_render_helpers", Path(__file__).with_name("test_render.py"))
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    return render.chatml_model(lm, render.TOOL_DEFS_TEMPLATE)


def test_stop_sent_the_way_smolagents_sends_it_is_accepted(qwen_style, tmp_path):
    # smolagents' ToolCallingAgent: every step, its tools and these stop sequences
    tools = [{"type": "function", "function": {"name": "final_answer", "description": "The answer.",
                                               "parameters": {"type": "object", "properties": {
                                                   "answer": {"type": "string"}}, "required": ["answer"]}}}]
    with ServerThread(Pool(make_engine(qwen_style), tmp_path, defaults=SETTINGS), "tiny") as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "What is 2+2?"}],
                                               tools=tools, tool_choice="required",
                                               stop=["Observation:", "Calling tools:"])
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_logprobs_come_back_in_both_apis_and_are_not_stored(client, server):
    prompt = [{"role": "user", "content": "Hello there."}]
    chat = client.chat.completions.create(model="tiny", messages=prompt, logprobs=True, top_logprobs=3).choices[0]
    entries = chat.logprobs.content
    assert entries and all(len(e.top_logprobs) == 3 for e in entries)
    # greedy: the chosen token is the most likely one
    assert all(e.logprob == pytest.approx(e.top_logprobs[0].logprob) and e.logprob <= 0 for e in entries)
    assert "".join(e.token for e in entries).strip() == chat.message.content
    assert client.chat.completions.create(model="tiny", messages=prompt).choices[0].logprobs is None
    conv = client.conversations.create()
    reply = client.responses.create(model="tiny", conversation=conv.id, input="Hello there.", top_logprobs=2,
                                    include=["message.output_text.logprobs"])
    logprobs = reply.output[0].content[0].logprobs
    assert [e.token for e in logprobs] == [e.token for e in entries]
    assert all(len(e.top_logprobs) == 2 for e in logprobs)
    assert "sampling" not in configs(server.pool, conv.id)["turn_1"]  # not state: not recorded
    assert client.conversations.items.list(conv.id, order="asc").data[-1].content[0].logprobs == []


@pytest.fixture(params=["tiny", "llamacpp-tiny"])
def build(request, lm, engine_factory):
    """A fresh engine (one per server: a restart builds another) on the tiny model of an engine."""
    if request.param == "tiny":
        return lambda: make_engine(lm)
    pytest.importorskip("llama_cpp")
    return lambda: engine_factory("llamacpp-tiny", n_ctx=1024, slots=1)


def test_a_conversation_whose_turns_used_different_settings_equals_its_twin_after_a_delete(build, tmp_path):
    with ServerThread(Pool(build(), tmp_path, defaults=SETTINGS), "tiny") as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        conv = c.conversations.create(items=[user("s1", SECRET)])
        c.responses.create(model="tiny", conversation=conv.id, **TURNS[0])
        c.responses.create(model="tiny", conversation=conv.id, input=[user("s2", "Second.")], **TURNS[1])
        c.responses.create(model="tiny", conversation=conv.id, input=[user("s3", "Third.")], **TURNS[2])
        recorded = configs(srv.pool, conv.id)
        assert [r.get("sampling", {}).get("temperature") for r in recorded.values()] == [0.8, None, 1.2]

        deleted = c.conversations.items.delete("s1", conversation_id=conv.id).model_extra
        assert deleted["status"] == "completed"
        twin = c.conversations.create()
        c.responses.create(model="tiny", conversation=twin.id, input=[], **TURNS[0])  # the turn s1 was
        c.responses.create(model="tiny", conversation=twin.id, input=[user("s2", "Second.")], **TURNS[1])
        c.responses.create(model="tiny", conversation=twin.id, input=[user("s3", "Third.")], **TURNS[2])
        assert digest(c, conv.id) == digest(c, twin.id)
        assert texts(c, conv.id) == texts(c, twin.id)
        assert configs(srv.pool, conv.id) == configs(srv.pool, twin.id) == recorded  # replayed as recorded
        state = (digest(c, conv.id), texts(c, conv.id))
    files = snapshot(tmp_path)
    with ServerThread(Pool(build(), tmp_path, defaults=SETTINGS), "tiny") as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        assert (digest(c, conv.id), texts(c, conv.id)) == state and digest(c, twin.id) == state[0]
        assert configs(srv.pool, conv.id) == configs(srv.pool, twin.id) == recorded
    assert snapshot(tmp_path) == files  # reopening rewrote nothing
    assert not [str(p) for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]


# --- the output cap and the context -------------------------------------------------


def test_the_default_cap_is_the_rest_of_the_context(lm, tmp_path):
    small = dataclasses.replace(lm, n_ctx=120)  # the tiny model's weights, a context of 120 tokens
    engine = make_engine(small)
    pool = Pool(engine, tmp_path)  # no default cap: the rest of the context
    assert pool.defaults.max_new_tokens == 120
    with ServerThread(pool, "tiny") as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        conv = c.conversations.create()
        reply = c.responses.create(model="tiny", conversation=conv.id, input="Tell me a story.")
        held = len(engine.tokens(pool.get(conv.id).runtime.lineage))
        assert held <= 120 and (reply.status == "completed" or held == 120)
        before = snapshot(tmp_path)
        with pytest.raises(openai.BadRequestError) as refused:  # a cap the request names must fit
            c.responses.create(model="tiny", conversation=conv.id, input="More.", max_output_tokens=100)
        assert refused.value.body["code"] == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=200)
        assert snapshot(tmp_path) == before
        chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Tell me a story."}])
        held = len(engine.tokens(pool.chats[""].handles[-1]))  # the completion's lineage
        assert held <= 120 and (chat.choices[0].finish_reason == "stop" or held == 120)


def test_a_server_default_cap_is_cut_to_the_rest_of_the_context(lm, tmp_path):
    engine = make_engine(dataclasses.replace(lm, n_ctx=100))
    pool = Pool(engine, tmp_path, defaults=Settings(max_new_tokens=50))
    with ServerThread(pool, "tiny") as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "A story, please."}])
        assert chat.usage.prompt_tokens + 50 > 100  # the default cap does not fit: cut, not refused
        assert len(engine.tokens(pool.chats[""].handles[-1])) <= 100


def test_ctx_size_goes_to_each_engine_s_loader():
    assert get_context_options("llamacpp", 2048, 2**34) == {"n_ctx": 2048}
    assert get_context_options("llamacpp", None, 2**34) == {"ctx_memory": 2**32}
    assert get_context_options("vllm", 2048, 2**34) == {"max_model_len": 2048}
    assert get_context_options("transformers", 2048, None) == {"n_ctx": 2048}
    assert get_context_options("transformers", None, 2**34) == {}
    with pytest.raises(ValueError, match="--ctx-size 0"):
        get_context_options("llamacpp", 0, None)


def test_ctx_size_is_honoured_up_to_the_trained_length_on_llamacpp(tmp_path):
    pytest.importorskip("llama_cpp")
    from unsee.impl.engines.llamacpp.model import compute_default_context, load_llamacpp

    lm = load_llamacpp("tiny", threads=1, n_ctx=1024, cache_dir=tmp_path)
    assert (lm.n_ctx, lm.n_ctx_train) == (1024, 4096)
    with pytest.raises(ValueError, match=r"8192 tokens.*1 to 4096"):
        load_llamacpp("tiny", threads=1, n_ctx=8192, cache_dir=tmp_path)
    # by memory: the longest multiple of 256 whose KV fits for every slot, at most the trained length
    assert compute_default_context(32768, 28 * 1024, 8, 2**30) == 4608
    assert compute_default_context(4096, 1024, 1, 2**40) == 4096
    assert compute_default_context(4096, 2**20, 8, 2**20) == 256
    sized = load_llamacpp("tiny", threads=1, slots=2, ctx_memory=3 * 2**20, cache_dir=tmp_path)
    per_token = 2 * 2 * 2 * 2 * 16  # K and V, f16, 2 layers, 2 KV heads of 16
    assert sized.n_ctx == compute_default_context(4096, per_token, 2, 3 * 2**20) == 4096
    small = load_llamacpp("tiny", threads=1, slots=2, ctx_memory=2**20, cache_dir=tmp_path)
    assert small.n_ctx == 2**20 // (per_token * 2) // 256 * 256 == 2048


def test_ctx_size_is_refused_past_the_model_s_positions_on_transformers():
    from unsee.impl.engines.hf.models import check_context

    assert check_context(512, 4096, "tiny") == 512 and check_context(None, 4096, "tiny") is None
    with pytest.raises(ValueError, match=r"5000 tokens.*1 to 4096"):
        check_context(5000, 4096, "tiny")


def test_serve_help_states_the_context_and_cap_defaults(capsys):
    from unsee.impl.cli.parser import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--ctx-size N" in out and "trained length" in out and "a quarter of the machine's memory" in out
    assert "the rest of the context" in out
