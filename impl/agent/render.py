"""How the runtime renders its prompt blocks: the model's own chat template, or ChatML.

Every block the runtime prefills is rendered here: observations (user, tool,
plan steps), the memory store, the scaffold's instructions (summary request,
note request) and the assistant header of a model turn. A :class:`Renderer`
renders one block at a time (one prefill per block, one per model turn), so
checkpoints and restores fall on turn boundaries whatever the template.

Which renderer a runtime uses (:func:`get_renderer`, docs/templates.md):

* the episode's ``settings.template``: ``"chatml"``, ``"model"`` (the
  tokenizer's own template, rendered as it is even where it is ChatML) or a
  Jinja template string;
* else the tokenizer's chat template (:attr:`ModelInfo.chat_template`),
  checked append-only by :mod:`unsee.impl.agent.templates`; a template whose
  segments are ChatML's is rendered by the built-in ChatML renderer, which
  keeps the tokens this runtime always produced (it writes nothing between a
  model turn's last token and the next block, where the template has ``\\n``);
* else ChatML (the tiny models' byte tokenizer has no template).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence

import attrs

from unsee.impl.agent.episode import Step
from unsee.impl.agent.provenance import DERIVED_TYPES, RuntimeBlock
from unsee.impl.agent.templates import (
    TOOL_CALL_MAPPED,
    TOOL_DEFINITIONS_NONE,
    TOOL_ROLE_MAPPED,
    Render,
    Segment,
    Segments,
    TemplateError,
    build_segments,
    compile_template,
    render_first_with_tools,
)
from unsee.impl.engines.protocol import ModelInfo

START, END = "<|im_start|>", "<|im_end|>"
SUMMARY_REQUEST = "List the facts from this conversation."
#: The summary turn opens its list: small models then extract facts from the
#: context instead of writing a generic reply (measured on SmolLM2-135M, which
#: answers a plain "summarize" request with boilerplate).
SUMMARY_OPENING = "1."
NOTE_REQUEST = "Write one short note about the user worth remembering for future sessions."
#: the override values that are not Jinja templates
TEMPLATE_NAMES = ("chatml", "model")


def render(role: str, text: str) -> str:
    """One ChatML message."""
    return f"{START}{role}\n{text}{END}\n"


def render_header(suffix: str = "") -> str:
    """The ChatML assistant header a model turn is decoded after (``suffix`` opens the turn)."""
    return f"{START}assistant\n{suffix}"


def get_observation_message(step: Step) -> tuple[str, str]:
    """``(role, text)`` of an observation's block (or of a scaffold
    instruction): tool results are user turns prefixed ``[result of tool X]``,
    the memory store a system block."""
    if step.kind in ("user", "plan"):
        return "user", "\n".join(i.text for i in step.items)
    if step.kind == "tool":
        body = "\n".join(i.text for i in step.items)
        return "user", f"[result of tool {step.tool}]\n{body}"
    if step.kind == "memory":
        return "system", get_memory_text([i.text for i in step.items])
    if step.kind == "compact":
        return "user", SUMMARY_REQUEST
    if step.kind == "remember":
        return "user", NOTE_REQUEST
    raise ValueError(f"step {step.id!r}: kind {step.kind!r} has no observation block")


def get_memory_text(records: Sequence[str]) -> str:
    """The memory store's text (a system block)."""
    return "Memory notes:\n" + "\n".join(f"- {r}" for r in records)


def render_observation(step: Step) -> str:
    """The ChatML block of an observation (or of a scaffold instruction)."""
    return render(*get_observation_message(step))


def render_memory(records: Sequence[str]) -> str:
    """The memory store as one ChatML system block."""
    return render("system", get_memory_text(records))


@attrs.frozen
class Renderer:
    """Renders blocks one turn at a time from a template's :class:`Segments`.

    ``closes_turns``: whether the next block after a model turn opens with
    the rest of the template's closing (False for the built-in ChatML, which
    has always written nothing there). ``template``: the compiled template,
    kept where it renders tool definitions (the first block with a runtime's
    tools is its own rendering, checked append-only each time)."""

    name: str  # 'chatml' or 'template'
    source: str  # where the template came from, in words
    segments: Segments
    closes_turns: bool = True
    template: Render | None = attrs.field(default=None, eq=False, repr=False)

    def render_first(self, text: str, tools: Sequence[Mapping] = (),
                     encode: Callable[[str], list[int]] | None = None, model: str = "") -> str:
        """The first block of a context: the system prompt, with the definitions of ``tools``
        (function schemas, :meth:`Tool.get_definition`) where the template renders them (they
        are left out where it has no format for them, as before). ``encode`` checks the
        template's rendering with these tools append-only."""
        if not tools or not self.segments.tool_definitions or self.template is None:
            return self.segments.first.fill(text)
        if encode is None:
            raise ValueError("render_first: tool definitions are rendered by the template and need encode= "
                             "to check them append-only")
        return render_first_with_tools(self.template, encode, text, tools, self.segments.user, model)

    def get_message(self, step: Step) -> tuple[str, str]:
        """``(role, text)`` of an observation's block under this renderer: a tool result in the
        template's own tool format where it has one (role ``"tool"``, the text already the
        call's turn and the result's), else :func:`get_observation_message`'s mapping."""
        if step.kind == "tool" and self.segments.tool_result is not None and self.segments.tool_call is not None:
            body = "\n".join(i.text for i in step.items)
            return "tool", self.segments.tool_call.fill(step.tool or "tool") + self.segments.tool_result.fill(body)
        return get_observation_message(step)

    def has_native_calls(self) -> bool:
        """Whether plans are decoded and their results rendered in the template's own tool
        format: it writes a call's arguments where the model can write them
        (:func:`~unsee.impl.agent.templates.get_call_arguments`; a template has that only with a
        tool role, :func:`~unsee.impl.agent.templates.get_tool_segments`)."""
        return self.segments.tool_arguments is not None

    def get_plan_opening(self, tool: str) -> str:
        """What a plan turn is decoded after, past the assistant header: the template's call of
        ``tool`` up to its arguments (the model writes them, as JSON), else ``CALL tool(``.
        Whitespace before the arguments is the model's to write: a tokenizer merges it with
        what follows (`` {"``), and a prompt ending in a lone space token is one the model
        never saw (qwen2.5-1.5b then wrote ``60}`` for a ``pay`` call's arguments)."""
        if not self.has_native_calls():
            return f"CALL {tool}("
        call = self.segments.tool_call
        return (call.before[len(self.segments.header):] + tool + self.segments.tool_arguments.before).rstrip()

    def get_call_result(self, tool: str, call_id: str, body: str) -> tuple[str, str]:
        """``(role, text)`` of a call's result block: the template's tool role after a call in
        its format (:meth:`has_native_calls`), else a user turn naming the tool and the call."""
        if self.has_native_calls():
            return "tool", self.segments.tool_result.fill(body)
        return "user", f"[result of tool {tool} call {call_id}]\n{body}"

    def render_message(self, role: str, text: str) -> str:
        """A block of ``role`` ('user', 'system' or 'assistant') after the first; ``"tool"``:
        ``text`` is a tool exchange :meth:`get_message` rendered in the template's format."""
        if role == "tool":
            return text
        if role == "assistant":
            return f"{self.segments.header}{text}{self.segments.closing}"
        if role == "system" and self.segments.system is not None:
            return self.segments.system.fill(text)
        if role in ("user", "system"):
            return self.segments.user.fill(text)
        raise ValueError(f"role {role!r} is not rendered; expected 'user', 'system' or 'assistant'")

    def render_header(self, suffix: str = "") -> str:
        """The assistant header a model turn is decoded after (``suffix`` opens the turn)."""
        return self.segments.header + suffix

    def render_after(self, last: RuntimeBlock | None, encode: Callable[[str], list[int]], role: str,
                     text: str) -> str:
        """A ``role`` block appended after the context block ``last``: its
        segment, opened by the rest of the template's closing where ``last``
        is a model turn (the type of a block the model wrote, starting with
        the assistant header: a summary's context block is not one)."""
        opening = ""
        if self.closes_turns and last is not None and last.type in DERIVED_TYPES:
            header = tuple(encode(self.render_header()))
            if last.tokens[:len(header)] == header:
                opening = self.get_turn_closing(last.tokens)
        return opening + self.render_message(role, text)

    def get_turn_closing(self, turn: Sequence[int]) -> str:
        """What the block after a model turn of tokens ``turn`` opens with:
        the template's closing, less the EOS id the turn ended on."""
        if not self.closes_turns:
            return ""
        return dict(self.segments.after_eos).get(turn[-1] if turn else None, self.segments.closing)

    def describe(self) -> dict:
        """How episodes are rendered, for the forget report."""
        return {"template": self.name, "source": self.source, "roles": dict(self.segments.roles),
                "header": self.segments.header, "closing": self.segments.closing if self.closes_turns else ""}


_CHATML_ROLES = (("system prompt", "system"), ("system block mid-conversation", "system"),
                 ("tool call (a plan)", TOOL_CALL_MAPPED), ("tool result", TOOL_ROLE_MAPPED),
                 ("tool definitions", TOOL_DEFINITIONS_NONE),
                 ("consecutive turns of one role", "one segment each, never merged"))
CHATML_SEGMENTS = Segments(Segment(f"{START}system\n", f"{END}\n"), Segment(f"{START}user\n", f"{END}\n"),
                           Segment(f"{START}system\n", f"{END}\n"), render_header(), f"{END}\n", (), _CHATML_ROLES)
CHATML = Renderer("chatml", "built in", CHATML_SEGMENTS, closes_turns=False)


def is_chatml(segments: Segments) -> bool:
    """Whether a template's segments are ChatML's (the EOS split aside)."""
    return attrs.evolve(segments, after_eos=(), roles=_CHATML_ROLES, tool_call=None, tool_result=None,
                        tool_definitions=False, tool_arguments=None) == CHATML_SEGMENTS


def get_renderer(lm: ModelInfo, template: str | None = None) -> Renderer:
    """The renderer for ``lm`` under the override ``template`` (see the
    module docstring). A template that is not append-only raises
    :class:`TemplateError` naming the model and the turn, before any work."""
    if template == "chatml":
        return attrs.evolve(CHATML, source="the episode's settings")
    own = getattr(lm, "chat_template", None)
    if template == "model" and not own:
        raise TemplateError(f"model {lm.name}: settings.template is 'model' but its tokenizer has no chat template")
    text = own if template in (None, "model") else template
    if not text:
        return attrs.evolve(CHATML, source="built in: the tokenizer has no chat template")
    return build_renderer(lm, text, template)


#: built renderers by model, then by (template text, override). Every forget's replay runtime asks
#: again, so they are cached; weakly by model, so that the cache never keeps a dropped model (and
#: its weights) alive, as an lru_cache keyed on the model did.
_RENDERERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def build_renderer(lm: ModelInfo, text: str, template: str | None) -> Renderer:
    """The renderer of the Jinja template ``text`` over ``lm``'s tokenizer (cached per model while
    the model lives; a model that takes no weak reference is not cached)."""
    try:
        per_model = _RENDERERS.setdefault(lm, {})
    except TypeError:
        return compute_renderer(lm, text, template)
    if (text, template) not in per_model:
        per_model[text, template] = compute_renderer(lm, text, template)
    return per_model[text, template]


def compute_renderer(lm: ModelInfo, text: str, template: str | None) -> Renderer:
    """The renderer of the Jinja template ``text`` over ``lm``'s tokenizer (it keeps no reference to ``lm``)."""
    render_fn = compile_template(text, getattr(lm, "special_tokens", None) or {})
    segments = build_segments(render_fn, lm.encode, lm.eos_ids, lm.name)
    own = render_fn if segments.tool_definitions else None  # kept only where it renders tool definitions
    if template is None and is_chatml(segments):
        if segments.tool_result is None and not segments.tool_definitions:
            kept = tuple(r for r in segments.roles if r[0] == "earlier model turns")  # a rewriting template's note
            return attrs.evolve(CHATML, source="the tokenizer's template, recognised as ChatML",
                                segments=attrs.evolve(CHATML_SEGMENTS, roles=_CHATML_ROLES + kept))
        # ChatML's tokens, with the template's own tool format
        return attrs.evolve(CHATML, source="the tokenizer's template, recognised as ChatML with its own tool format",
                            template=own, segments=attrs.evolve(
                                CHATML_SEGMENTS, tool_call=segments.tool_call, tool_result=segments.tool_result,
                                tool_arguments=segments.tool_arguments, tool_definitions=segments.tool_definitions,
                                roles=segments.roles))
    source = "the tokenizer's chat template" if template in (None, "model") else "the episode's settings (Jinja)"
    return Renderer("template", source, segments, template=own)


def get_edit_tokens(graph, renderer, encode, block) -> tuple[int, ...]:
    """The tokens an edit re-prefills ``block`` as: its recorded ones where it
    is the graph's block unchanged, else its text encoded (a model turn with
    its assistant framing)."""
    if block.id in graph and graph[block.id] is block and block.tokens:
        return block.tokens
    text = renderer.render_message("assistant", block.text) if block.type in DERIVED_TYPES else block.text
    return tuple(encode(text))


__all__ = ["CHATML", "END", "NOTE_REQUEST", "START", "SUMMARY_OPENING", "SUMMARY_REQUEST", "TEMPLATE_NAMES",
           "Renderer", "TemplateError", "build_renderer", "compute_renderer", "get_memory_text", "get_observation_message", "get_renderer", "is_chatml",
           "render", "render_header", "render_memory", "render_observation"]
