"""Rendering with the model's own chat template (impl/agent/render.py, templates.py).

The tiny model runs under a transformers tokenizer built in memory (bytes as
the tiny model's ids, then the template's special tokens), so a template
that is not ChatML drives a real episode with no files: forget == reset
holds under it, a template that rewrites earlier turns is refused before
any work, and roles the template lacks are mapped as documented.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import weakref

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from unsee.impl.agent.episode import EpisodeError, Settings, episode_to_json, parse_episode
from unsee.impl.agent.render import CHATML, TemplateError, get_renderer, render
from unsee.impl.agent.runtime import AgentRuntime, run_episode
from unsee.impl.agent.templates import HISTORY_KEPT, TOOL_ROLE_MAPPED, TOOL_ROLE_NATIVE
from unsee.impl.engines.files import ByteTokenizer
from unsee.impl.engines.registry import make_engine
from unsee.properties.differential import compare_forget_with_reset

#: Gemma-style: BOS once, no system role (the system prompt is folded into the
#: first user turn), strict user/model alternation enforced by the template.
GEMMA_STYLE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] + '\\n\\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for m in turns -%}"
    "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('roles must alternate user/assistant') }}{%- endif -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' }}"
    "{{ (prefix if loop.first else '') + m['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}")
GEMMA_SPECIALS = ("<bos>", "<end_of_turn>", "<start_of_turn>")

#: ChatML, with a default system prompt where the conversation has none (as SmolLM2's).
CHATML_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if loop.first and m['role'] != 'system' -%}{{ '<|im_start|>system\\nDefault.<|im_end|>\\n' }}{%- endif -%}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")

#: Not append-only: an earlier assistant turn's text is dropped once a later turn follows.
DROPS_EARLIER_TURNS = CHATML_TEMPLATE.replace(
    "m['content'] + '<|im_end|>", "(m['content'] if m['role'] != 'assistant' or loop.last else '') + '<|im_end|>")
#: Not append-only: earlier reasoning blocks are dropped (as some reasoning models' templates do); served
#: with the model's turns kept as written (impl/agent/history.py).
DROPS_EARLIER_REASONING = CHATML_TEMPLATE.replace(
    "m['content'] + '<|im_end|>",
    "(m['content'] if m['role'] != 'assistant' or loop.last else m['content'].split('</think>')[-1]) + '<|im_end|>")

STEPS = [
    {"id": "s1", "kind": "user", "text": "hello, I am Ana 12"},
    {"id": "s2", "kind": "tool", "tool": "search", "fields": [{"source": "secret", "text": "lives at 4417 Elm"}]},
    {"id": "s3", "kind": "memory", "records": [{"source": "m1", "text": "likes tea 7"}]},
    {"id": "s4", "kind": "user", "text": "what now 3"},
    {"id": "s5", "kind": "remember"},
    {"id": "s6", "kind": "compact"},
    {"id": "s7", "kind": "session"},
    {"id": "s8", "kind": "plan", "tool": "send_message", "text": "email Bob 55"},
]


def build_byte_tokenizer(specials, bos: str, eos: str, template: str | None) -> PreTrainedTokenizerFast:
    """A transformers tokenizer built in memory, no files: ids 0..255 are the
    bytes of UTF-8 (byte-level, no merges: the tiny model's ids, decoded as
    its byte tokenizer decodes them), then ``specials`` in order, each
    written in a text encoded as its single id."""
    core = Tokenizer(models.BPE(vocab={ch: b for b, ch in enumerate(get_byte_chars())}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=bos, eos_token=eos)
    tokenizer.chat_template = template
    return tokenizer


def get_byte_chars() -> list[str]:
    """The character byte-level BPE writes for each byte 0..255: printable
    bytes stand for themselves, the others for 256, 257, ... in byte order."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    shifted = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


def with_template(tiny_model, template: str | None, specials=GEMMA_SPECIALS, bos="<bos>", eos="<end_of_turn>"):
    """The tiny model under a byte-level transformers tokenizer with ``template``."""
    tokenizer = build_byte_tokenizer(specials, bos, eos, template)
    return dataclasses.replace(tiny_model, tokenizer=tokenizer, eos_ids=(tokenizer.convert_tokens_to_ids(eos),))


def episode(template: str | None = None, steps=STEPS):
    settings = {"max_new_tokens": 4, "checkpoint_policy": "every_turn"}
    if template is not None:
        settings["template"] = template
    target = {"source": "secret", "value": "4417 Elm"} if steps is STEPS else None
    return parse_episode({"format": "unsee.episode", "version": 4, "system": "You are a helpful agent.",
                          "settings": settings, "steps": steps, "target": target})


@pytest.fixture(scope="module")
def gemma(lm):
    return with_template(lm, GEMMA_STYLE)


def test_own_template_renders_blocks_per_turn_and_forget_equals_reset(gemma):
    engine = make_engine(gemma)
    ep = episode()
    runtime = run_episode(engine, ep)
    assert runtime.renderer.name == "template" and runtime.renderer.source == "the tokenizer's chat template"
    first = runtime.graph["system"].text
    assert first == "<bos><start_of_turn>user\nYou are a helpful agent.<end_of_turn>\n"  # system -> user
    tool = runtime.graph["s2"].text
    closing = runtime.renderer.get_turn_closing(runtime.graph["s1/answer"].tokens)
    assert tool == f"{closing}<start_of_turn>user\n[result of tool search]\nlives at 4417 Elm<end_of_turn>\n"
    header = gemma.encode("<start_of_turn>model\n")
    assert runtime.graph["s1/answer"].tokens[:len(header)] == tuple(header)
    runtime.check_invariants()
    report = compare_forget_with_reset(engine, ep)
    assert report.extra.rendering["template"] == "template"
    assert report.extra.rendering["roles"]["system prompt"] == "user"


def test_role_mapping_for_system_blocks_and_consecutive_user_turns(gemma):
    renderer = get_renderer(gemma)
    roles = renderer.describe()["roles"]
    assert roles == {"system prompt": "user", "system block mid-conversation": "user",
                     "tool call (a plan)": "an assistant turn opened with CALL NAME(",
                     "tool result": "user, prefixed [result of tool NAME]",
                     "tool definitions": "not rendered: the template has no tool-definition format in its system block",
                     "consecutive turns of one role": "one segment each, never merged"}
    # memory after a tool result's answer, then a user turn: two user segments in a row, which the
    # template itself would refuse (it only ever renders the probe conversation)
    assert renderer.render_message("system", "Memory notes:\n- x") == "<start_of_turn>user\nMemory notes:\n- x<end_of_turn>\n"
    runtime = AgentRuntime.start(make_engine(gemma), "sys", Settings(max_new_tokens=2))
    runtime.run(parse_episode({"format": "unsee.episode", "version": 2, "system": "sys", "steps": [
        {"id": "m", "kind": "memory", "records": [{"source": "r", "text": "x"}]},
        {"id": "u", "kind": "user", "text": "hi"}]}).steps)
    assert [runtime.graph[b].text for b in runtime.context[1:3]] == [
        "<start_of_turn>user\nMemory notes:\n- x<end_of_turn>\n", "<start_of_turn>user\nhi<end_of_turn>\n"]


def test_closing_after_a_model_turn_depends_on_how_it_ended(gemma):
    renderer = get_renderer(gemma)
    end = gemma.encode("<end_of_turn>")
    assert renderer.get_turn_closing([5, *end]) == "\n"  # the turn holds <end_of_turn>: its newline follows
    assert renderer.get_turn_closing([5, 6]) == "<end_of_turn>\n"  # cut at max_new_tokens: closed by the block
    assert CHATML.get_turn_closing([5, 258]) == ""


def test_a_template_that_drops_earlier_reasoning_is_served_keeping_the_model_s_turns(lm):
    """Issue 51: a reasoning template is served, each model turn kept as the model wrote it (its
    reasoning included) where the template would drop it; a forget equals its reset."""
    model = with_template(lm, DROPS_EARLIER_REASONING, ByteTokenizer.SPECIALS, "<|im_start|>", "<|im_end|>")
    renderer = get_renderer(model)
    assert dict(renderer.segments.roles)["earlier model turns"] == HISTORY_KEPT
    assert renderer.segments.header == "<|im_start|>assistant\n" and renderer.segments.closing == "<|im_end|>\n"
    report = compare_forget_with_reset(make_engine(model), episode())  # raises on any disagreement
    assert report.extra.rendering["roles"]["earlier model turns"] == HISTORY_KEPT


@pytest.mark.parametrize("template,rewritten", [(DROPS_EARLIER_TURNS, "turn 3 (assistant)")])
def test_non_append_only_template_is_refused_before_any_work(lm, template, rewritten):
    model = with_template(lm, template, ByteTokenizer.SPECIALS, "<|im_start|>", "<|im_end|>")
    model = dataclasses.replace(model, name="tiny-rewriting")
    engine = make_engine(model)
    before = engine.counters.snapshot()
    with pytest.raises(TemplateError, match=rf"model tiny-rewriting: .*not append-only: adding turn 4 \(user\) "
                                            rf"rewrites {rewritten.replace('(', '[(]').replace(')', '[)]')}"):
        run_episode(engine, episode())
    assert engine.budget.lineages == () and engine.counters.snapshot() == before


def test_a_chatml_template_keeps_the_chatml_tokens(lm):
    """SmolLM2's case: a ChatML template (with a default system prompt) is
    rendered by the built-in ChatML renderer, so the tokens and digests are
    those of the byte tokenizer, which has no template; forcing the
    template's own rendering ("model") adds its newline after each model turn."""
    chatml = with_template(lm, CHATML_TEMPLATE, ByteTokenizer.SPECIALS, "<|im_start|>", "<|im_end|>")
    assert get_renderer(chatml).source == "the tokenizer's template, recognised as ChatML"
    plain = run_episode(make_engine(lm), episode())
    same = run_episode(make_engine(chatml), episode())
    assert same.digest() == plain.digest() and same.generated_tokens() == plain.generated_tokens()
    own = run_episode(make_engine(chatml), episode("model"))
    assert own.renderer.name == "template" and own.digest() != plain.digest()
    assert own.graph["s2"].text.startswith(own.renderer.get_turn_closing(own.graph["s1/answer"].tokens) + "<|im_start|>")


def test_episode_override_chatml_and_jinja(gemma, lm):
    assert run_episode(make_engine(gemma), episode("chatml", STEPS[:1])).graph["system"].text == render(
        "system", "You are a helpful agent.")
    jinja = run_episode(make_engine(lm), episode(GEMMA_STYLE.replace("bos_token", "'B'"), STEPS[:1]))
    assert jinja.renderer.source == "the episode's settings (Jinja)"
    assert jinja.graph["system"].text == "B<start_of_turn>user\nYou are a helpful agent.<end_of_turn>\n"


def test_session_record_keeps_the_override(gemma):
    runtime = run_episode(make_engine(gemma), episode("chatml", STEPS[:2]))
    record = runtime.get_session_record()
    assert record["settings"]["template"] == "chatml"
    reopened = AgentRuntime.from_session_record(make_engine(gemma), record)
    assert reopened.renderer.source == "the episode's settings" and reopened.digest() == runtime.digest()
    assert "template" not in run_episode(make_engine(gemma), episode(None, STEPS[:1])).get_session_record()["settings"]


def test_episode_format_template_field():
    ep = episode("chatml")
    raw = episode_to_json(ep)
    assert raw["version"] == 4 and raw["settings"]["template"] == "chatml" and parse_episode(raw) == ep
    plain = episode_to_json(episode())
    assert plain["version"] == 2 and "template" not in plain["settings"]
    with pytest.raises(EpisodeError, match="settings.template: a template needs version 4"):
        parse_episode({**raw, "version": 2})
    with pytest.raises(EpisodeError, match="settings.template: must be"):
        parse_episode({**raw, "settings": {"template": ""}})


def test_a_template_that_fails_names_the_model(lm):
    broken = dataclasses.replace(with_template(lm, "{{ raise_exception('no') }}"), name="tiny-broken")
    with pytest.raises(TemplateError, match="refused the probe conversation: no"):
        get_renderer(broken)
    with pytest.raises(TemplateError, match="not valid Jinja"):
        get_renderer(with_template(lm, "{% for %}"))


#: ChatML with a tool format of the Qwen2.5 kind (written for this test): an assistant turn
#: calls a tool in <tool_call> JSON, its result is a user turn in <tool_response>.
TOOLS_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if loop.first and m['role'] != 'system' -%}{{ '<|im_start|>system\\nDefault.<|im_end|>\\n' }}{%- endif -%}"
    "{%- if m['role'] == 'tool' -%}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + m['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif m.tool_calls -%}{{ '<|im_start|>assistant' }}"
    "{%- for c in m.tool_calls -%}{{ '\\n<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": '"
    " + c.function.arguments | tojson + '}\\n</tool_call>' }}{%- endfor -%}{{ '<|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")


def test_a_template_with_a_tool_format_renders_tool_calls_and_results_through_it(lm):
    tools = with_template(lm, TOOLS_TEMPLATE, ByteTokenizer.SPECIALS, "<|im_start|>", "<|im_end|>")
    renderer = get_renderer(tools)
    assert renderer.source == "the tokenizer's template, recognised as ChatML with its own tool format"
    engine = make_engine(tools)
    ep = episode()
    runtime = run_episode(engine, ep)
    assert runtime.graph["s2"].text == (
        '<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nlives at 4417 Elm\n</tool_response><|im_end|>\n")
    runtime.check_invariants()
    report = compare_forget_with_reset(engine, ep)  # forget == reset under the tool format
    assert report.extra.rendering["roles"]["tool result"] == TOOL_ROLE_NATIVE
    # the other blocks keep ChatML's tokens: the same as the template without a tool format
    plain = run_episode(make_engine(with_template(lm, CHATML_TEMPLATE, ByteTokenizer.SPECIALS, "<|im_start|>",
                                                  "<|im_end|>")), ep)
    assert runtime.graph["s1"].text == plain.graph["s1"].text and runtime.digest() != plain.digest()


def test_a_template_without_a_tool_format_maps_results_to_user_turns(gemma, lm):
    assert dict(get_renderer(gemma).segments.roles)["tool result"] == TOOL_ROLE_MAPPED
    chatml = with_template(lm, CHATML_TEMPLATE, ByteTokenizer.SPECIALS, "<|im_start|>", "<|im_end|>")
    # a template that renders any role generically writes no call: not a tool format
    assert get_renderer(chatml).segments.tool_result is None


def test_a_tool_format_that_is_not_append_only_is_refused(lm):
    # the tool result rewrites the call's turn before it (drops its <tool_call>)
    rewriting = TOOLS_TEMPLATE.replace("{%- elif m.tool_calls -%}", "{%- elif m.tool_calls and loop.last -%}")
    model = dataclasses.replace(with_template(lm, rewriting, ByteTokenizer.SPECIALS, "<|im_start|>", "<|im_end|>"),
                                name="tiny-tools")
    with pytest.raises(TemplateError, match="model tiny-tools: .*not append-only: adding tool result rewrites"):
        get_renderer(model)


def test_the_renderer_cache_does_not_keep_a_model_alive(lm):
    # issue 28: an lru_cache keyed on the model held every model it had seen (and its weights)
    model = with_template(lm, GEMMA_STYLE)
    first = get_renderer(model)
    assert get_renderer(model) is first  # cached while the model lives
    ref = weakref.ref(model)
    del model, first
    gc.collect()
    assert ref() is None


# --- tool definitions in the system block (issue 27 item 2) -------------------------------------------------

def get_message_body(tools_in_system: str) -> str:
    """A Qwen2.5-style template written for these tests: the system turn lists the tools
    (``tools_in_system``: the Jinja test under which it does), then TOOLS_TEMPLATE's turns."""
    return (
        "{%- if messages[0]['role'] == 'system' -%}{{ '<|im_start|>system\\n' + messages[0]['content'] }}"
        "{%- if " + tools_in_system + " -%}{{ '\\n# Tools\\n<tools>' }}"
        "{%- for t in tools -%}{{ '\\n' + t | tojson }}{%- endfor -%}{{ '\\n</tools>' }}{%- endif -%}"
        "{{ '<|im_end|>\\n' }}{%- endif -%}"
        "{%- for m in messages -%}{%- if not (loop.first and m['role'] == 'system') -%}"
        "{%- if m['role'] == 'user' and tools and not (" + tools_in_system + ") and loop.index0 == 1 -%}"
        "{{ '<|im_start|>user\\n' + tools | map(attribute='function.name') | join(',') + '\\n' + m['content']"
        " + '<|im_end|>\\n' }}"
        "{%- elif m['role'] == 'tool' -%}"
        "{{ '<|im_start|>user\\n<tool_response>\\n' + m['content'] + '\\n</tool_response><|im_end|>\\n' }}"
        "{%- elif m.tool_calls -%}{{ '<|im_start|>assistant' }}"
        "{%- for c in m.tool_calls -%}{{ '\\n<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": '"
        " + c.function.arguments | tojson + '}\\n</tool_call>' }}{%- endfor -%}{{ '<|im_end|>\\n' }}"
        "{%- else -%}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif -%}"
        "{%- endif -%}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")


TOOL_DEFS_TEMPLATE = get_message_body("tools")
#: lists one tool in the system turn, but several in the first user turn (rewriting nothing,
#: yet not the user segment the runtime renders)
ONE_TOOL_IN_SYSTEM = get_message_body("tools and tools | length == 1")


def chatml_model(lm, template: str):
    return with_template(lm, template, ByteTokenizer.SPECIALS, "<|im_start|>", "<|im_end|>")


def get_qwen_template() -> str:
    """The chat template embedded in the catalogue's Qwen2.5 GGUF (its metadata only, no weights),
    or a skip where the file is not in the cache."""
    gguf = pytest.importorskip("gguf")
    from unsee.impl.engines.catalog import CATALOG, get_model_path

    path = get_model_path(CATALOG["qwen2.5-1.5b"])
    if not path.is_file():
        pytest.skip(f"the qwen2.5-1.5b GGUF is not in the cache ({path}); tests/test_realmodel.py fetches it")
    field = gguf.GGUFReader(path).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()


def tool_runtime_episode():
    steps = [{"id": "u1", "kind": "user", "text": "hello 12"},
             {"id": "t1", "kind": "tool", "tool": "fetch", "fields": [{"source": "secret", "text": "lives at 4417 Elm"}]},
             {"id": "u2", "kind": "user", "text": "where now 3"}]
    return episode(steps=steps)


@pytest.mark.parametrize("source", ["written", "qwen2.5-1.5b"])
def test_tool_definitions_render_in_the_system_block_through_the_template(lm, source):
    from unsee.impl.agent.templates import TOOL_DEFINITIONS_NATIVE, compile_template
    from unsee.impl.agent.tools import ToolAgentRuntime, default_tools

    template = TOOL_DEFS_TEMPLATE if source == "written" else get_qwen_template()
    model = chatml_model(lm, template)
    renderer = get_renderer(model)
    assert dict(renderer.describe()["roles"])["tool definitions"] == TOOL_DEFINITIONS_NATIVE
    engine, ep = make_engine(model), tool_runtime_episode()
    runtime = ToolAgentRuntime.from_episode(engine, ep)
    tools = [t.get_definition() for _, t in sorted(default_tools().items())]
    own = compile_template(template, {})([{"role": "system", "content": ep.system}], False, tools=tools)
    assert runtime.graph["system"].text == own and '"name": "send_message"' in own
    # without a tool layer the first block is the template's plain system turn, as before
    assert run_episode(engine, ep).graph["system"].text == renderer.segments.first.fill(ep.system)
    runtime.check_invariants()
    other = ToolAgentRuntime.from_episode(make_engine(model), ep)
    forget, reset = runtime.forget("secret"), other.full_reset("secret")
    assert forget.digest == reset.digest and forget.boundary == 1 and reset.boundary == 0
    assert forget.extra.rendering["roles"]["tool definitions"] == TOOL_DEFINITIONS_NATIVE


def test_a_template_without_tool_definitions_keeps_the_system_block(gemma, lm):
    from unsee.impl.agent.templates import TOOL_DEFINITIONS_NONE
    from unsee.impl.agent.tools import ToolAgentRuntime

    for model in (gemma, chatml_model(lm, TOOLS_TEMPLATE), chatml_model(lm, CHATML_TEMPLATE)):
        renderer = get_renderer(model)
        assert renderer.describe()["roles"]["tool definitions"] == TOOL_DEFINITIONS_NONE
        runtime = ToolAgentRuntime.from_episode(make_engine(model), tool_runtime_episode())
        assert runtime.graph["system"].text == renderer.segments.first.fill("You are a helpful agent.")


def test_tool_definitions_that_leave_the_system_block_are_refused_before_any_work(lm):
    # the probe's one tool goes in the system turn (a definition format), the runtime's four
    # go into the first user turn: the check with the runtime's own tools refuses it
    from unsee.impl.agent.tools import ToolAgentRuntime

    model = dataclasses.replace(chatml_model(lm, ONE_TOOL_IN_SYSTEM), name="tiny-tooldefs")
    assert get_renderer(model).segments.tool_definitions
    with pytest.raises(TemplateError, match="model tiny-tooldefs: .*system prompt with these tools"):
        ToolAgentRuntime.start(make_engine(model), "You are a helpful agent.")


# --- plans as calls in the template's own format (issue 27 item 2) ---------------------------------------------

def plan_episode():
    steps = [{"id": "u1", "kind": "user", "text": "hello 12"},
             {"id": "t1", "kind": "tool", "tool": "fetch",
              "fields": [{"source": "secret", "text": "write to ann@a.test about 4417 Elm"}]},
             {"id": "p1", "kind": "plan", "tool": "send_message", "text": "email Ann 55"},
             {"id": "u2", "kind": "user", "text": "done 3"}]
    return episode(steps=steps)


@pytest.mark.parametrize("source", ["written", "qwen2.5-1.5b"])
def test_a_plan_is_a_call_in_the_template_s_own_format(lm, source):
    """Where the template has a call format with an arguments slot, a plan turn opens with the
    call up to its arguments and the model writes them; a completed call is exactly the
    template's own rendering of it, and the result goes in its tool role. Forget == reset."""
    from unsee.impl.agent.templates import TOOL_CALL_NATIVE, compile_template
    from unsee.impl.agent.tools import ToolAgentRuntime, parse_json_arguments

    template = TOOLS_TEMPLATE if source == "written" else get_qwen_template()
    model = chatml_model(lm, template)
    renderer = get_renderer(model)
    opening = renderer.get_plan_opening("send_message")
    assert renderer.has_native_calls() and opening == '<tool_call>\n{"name": "send_message", "arguments":'
    own = compile_template(template, {})
    head = [{"role": "system", "content": "S."}, {"role": "user", "content": "U."}]
    args = {"to": "ann@a.test", "body": "hi"}
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "send_message", "arguments": args}}]}
    result = {"role": "tool", "name": "send_message", "content": "sent"}
    texts = [own(head, False), own([*head, call], False), own([*head, call, result], False)]
    # the turn the model writes after the opening, in the template's own rendering, parses back to the call
    added = texts[1][len(texts[0]):]
    assert added.startswith(renderer.render_header(opening))
    written = added[len(renderer.render_header(opening)):]
    assert written == f" {json.dumps(args)}{renderer.segments.tool_arguments.after}"
    assert parse_json_arguments(("to", "body"), written) == (args, True)
    assert renderer.get_call_result("send_message", "p1/call", "sent") == ("tool", texts[2][len(texts[1]):])

    ep = plan_episode()
    runtime = ToolAgentRuntime.from_episode(make_engine(model), ep)
    header = model.encode(renderer.render_header(opening))
    assert list(runtime.graph["p1/plan"].tokens[:len(header)]) == header
    assert "<tool_response>" in runtime.graph["p1/call/result"].text
    assert "[result of tool" not in runtime.graph["p1/call/result"].text
    runtime.check_invariants()
    other = ToolAgentRuntime.from_episode(make_engine(model), ep)
    forget, reset = runtime.forget("secret"), other.full_reset("secret")
    assert forget.digest == reset.digest and forget.boundary == 1
    assert forget.extra.rendering["roles"]["tool call (a plan)"] == TOOL_CALL_NATIVE


def test_a_template_without_a_call_format_keeps_call_syntax(gemma, lm):
    from unsee.impl.agent.templates import TOOL_CALL_MAPPED

    for model in (gemma, chatml_model(lm, CHATML_TEMPLATE)):
        renderer = get_renderer(model)
        assert not renderer.has_native_calls() and renderer.get_plan_opening("send_message") == "CALL send_message("
        assert renderer.get_call_result("fetch", "p1/call", "v") == ("user", "[result of tool fetch call p1/call]\nv")
        assert renderer.describe()["roles"]["tool call (a plan)"] == TOOL_CALL_MAPPED


#: the call turn opens in a role of its own, not after the assistant header the model decodes after
CALL_IN_ITS_OWN_ROLE = TOOLS_TEMPLATE.replace("{%- elif m.tool_calls -%}{{ '<|im_start|>assistant' }}",
                                              "{%- elif m.tool_calls -%}{{ '<|im_start|>call' }}")
#: the arguments as Python writes a dict, not JSON
ARGUMENTS_NOT_JSON = TOOLS_TEMPLATE.replace("c.function.arguments | tojson", "c.function.arguments | string")
#: the arguments written twice (a slot the model's one answer cannot fill)
ARGUMENTS_TWICE = TOOLS_TEMPLATE.replace("c.function.arguments | tojson", "c.function.arguments | tojson + ', ' + "
                                         "c.function.arguments | tojson")


@pytest.mark.parametrize("template", [CALL_IN_ITS_OWN_ROLE, ARGUMENTS_NOT_JSON, ARGUMENTS_TWICE],
                         ids=["own-role", "not-json", "twice"])
def test_a_call_format_without_an_arguments_slot_keeps_call_syntax(lm, template):
    """Each condition of get_call_arguments: where it fails, plans keep ``CALL NAME(`` (and a
    tool step still renders through the template's call format where it has one)."""
    renderer = get_renderer(chatml_model(lm, template))
    assert renderer.segments.tool_call is not None and renderer.segments.tool_arguments is None
    assert renderer.get_plan_opening("send_message") == "CALL send_message("


def test_a_call_format_that_rewrites_a_call_with_arguments_is_refused(lm):
    # a call with arguments is rendered as an empty assistant turn once a result follows it
    rewriting = TOOLS_TEMPLATE.replace("{%- elif m.tool_calls -%}",
                                       "{%- elif m.tool_calls and (loop.last or not m.tool_calls[0].function.arguments) -%}")
    model = dataclasses.replace(chatml_model(lm, rewriting), name="tiny-calls")
    with pytest.raises(TemplateError, match="model tiny-calls: .*not append-only: adding tool result rewrites"):
        get_renderer(model)
