"""Each model family's call format, as one table (issue 51): which format a chat template writes,
read from its text, or named by ``--tool-format``.

A family's :class:`ToolFormat` says how the model is told about tools (the template's own ``tools``
handling where it renders them, else a system-prompt description: :func:`describe_tools`), how it
writes a call (a :class:`~unsee.impl.agent.tools.native.CallFormat` in one of
:data:`~unsee.impl.agent.tools.call_shapes.SHAPES`), and so how the call is parsed
(:func:`~unsee.impl.agent.tools.native.parse_turn`) and constrained
(:mod:`unsee.impl.agent.tools.grammars`): one table, no code path per model.

A template is matched to the first family whose every ``detect`` text it holds (:data:`FAMILIES`'
order: Qwen3-Coder's XML before Hermes' ``<tool_call>``, Mistral's newer ``[ARGS]`` before its older
list); one that holds none gets :data:`GENERIC`: the tools described in the system prompt, the call a
JSON object the grammar constrains. Where the template's own rendering of a call was probed and
parses back (:func:`~unsee.impl.agent.tools.native.get_call_format`), that rendering is kept: it is
the template's exact text (Qwen2.5's spacing, for one).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import attrs

from unsee.impl.agent.tools.native import CallFormat, get_call_format


@attrs.frozen
class ToolFormat:
    """One family's call format: its name, the texts a template of the family holds, the call format."""

    name: str
    detect: tuple[str, ...]
    call: CallFormat
    models: str


def _format(name: str, marker: str, opening: str, between: str, after: str, end: str, **kw) -> CallFormat:
    return CallFormat(marker, opening, between, after, end, family=name, **kw)


FAMILIES = (
    ToolFormat("qwen3_coder", ("<function=", "<parameter="),
               _format("qwen3_coder", "<tool_call>\n", "<tool_call>\n<function=", ">\n", "</function>\n</tool_call>",
                       "</tool_call>", shape="xml"), "Qwen3-Coder"),
    ToolFormat("hermes", ("<tool_call>",),
               _format("hermes", "<tool_call>\n", '<tool_call>\n{"name": "', '", "arguments": ', "}\n</tool_call>",
                       "\n</tool_call>"), "Hermes 2 Pro / 3, Qwen2.5, Qwen3, QwQ, SmolLM3"),
    ToolFormat("mistral", ("[TOOL_CALLS]", "[ARGS]"),
               _format("mistral", "[TOOL_CALLS]", "[TOOL_CALLS]", "[ARGS]", "", "", separator="", shape="name_args"),
               "Devstral, Mistral-Small 3.2, Magistral"),
    ToolFormat("mistral_list", ("[TOOL_CALLS]",),
               _format("mistral_list", "[TOOL_CALLS]", '[TOOL_CALLS][{"name": "', '", "arguments": ', "}]", "]",
                       shape="list"), "Mistral-Nemo, Mistral 7B v0.3"),
    ToolFormat("granite", ("<|tool_call|>",),
               _format("granite", "<|tool_call|>", '<|tool_call|>[{"name": "', '", "arguments": ', "}]", "]",
                       shape="list"), "Granite 3.x"),
    ToolFormat("pythonic", ("[func_name1(",),
               _format("pythonic", "[", "[", "(", ")]", "]", shape="pythonic"), "Llama 3.2 / 4 pythonic prompts"),
    ToolFormat("llama3_json", ("<|start_header_id|>", '"parameters"'),
               _format("llama3_json", "<|python_tag|>", '{"name": "', '", "parameters": ', "}", "", key="parameters"),
               "Llama 3.1 / 3.2 / 3.3"),
)
#: the fallback of a template with no tool format: a bare JSON object (fences and tags read too)
GENERIC = ToolFormat("generic", (), _format("generic", "", '{"name": "', '", "arguments": ', "}", ""),
                     "any other template (Gemma, Phi, SmolLM2, DeepSeek-R1 distills)")
BY_NAME = {f.name: f for f in (*FAMILIES, GENERIC)}


def get_family(template: str | None) -> ToolFormat:
    """The family whose every detection text ``template`` holds (the first, in table order), else generic."""
    return next((f for f in FAMILIES if template and all(d in template for d in f.detect)), GENERIC)


def get_tool_format(renderer, template: str | None, override: str | None = None) -> CallFormat:
    """The call format of a model: ``override`` (``--tool-format``) by name, else the family its
    template's text is of; the template's own probed rendering where it is that family's and parses back."""
    if override is not None and override not in BY_NAME:
        raise ValueError(f"--tool-format {override!r}: expected one of {', '.join(BY_NAME)}")
    family = BY_NAME[override] if override else get_family(template)
    probed = get_call_format(renderer.segments, renderer.has_native_calls())
    if probed is not None and probed.shape == family.call.shape and probed.key == family.call.key \
            and probed.marker.strip() == family.call.marker.strip():
        return attrs.evolve(probed, family=family.name, separator=family.call.separator)
    return family.call


def describe_tools(fmt: CallFormat, tools: Sequence[Mapping]) -> str:
    """The system prompt's description of ``tools`` where the template renders none itself: the
    functions' schemas and how to call one in ``fmt`` (what llama.cpp's generic handler tells a model)."""
    from unsee.impl.agent.tools.native import FunctionCall

    lines = [json.dumps(t.get("function", t), ensure_ascii=False) for t in tools]
    example = fmt.render_calls([FunctionCall("tool_name", '{"argument": "value"}')])
    return ("You can call these tools (JSON schemas of their parameters):\n" + "\n".join(lines)
            + f"\nTo call a tool, answer with only the call, written as: {example}")


__all__ = ["BY_NAME", "FAMILIES", "GENERIC", "ToolFormat", "describe_tools", "get_family", "get_tool_format"]
