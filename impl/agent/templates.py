"""A model's own chat template (Jinja) as per-turn segments, checked append-only.

The runtime prefills one chunk per block (docs/templates.md), so a block's
text must be what the template adds when that turn is added: the difference
between rendering turns ``1..k+1`` and turns ``1..k``. :func:`build_segments`
renders a probe conversation both ways, turn by turn, and keeps the result
only if every turn is appended, in token ids as well as in text, without
rewriting an earlier turn (Lemma 1's prefix sharing rests on that). From the
same probe it reads each role's *segment* (the text around a turn's
content), the assistant header a model turn is decoded after, and the
closing the template puts after a model turn's content.

Roles are mapped, never refused: a template whose system message does not
carry its own text (it folds the system prompt into the first user turn)
gets system blocks as user turns; a system block mid-conversation (memory,
summaries) becomes a user turn where the template would not render one
there. Turns are rendered segment by segment, so two user turns in a row are
two user segments even where the template's own checks would refuse that
sequence (it never sees it: only the probe is rendered by the template).
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Mapping, Sequence

import attrs

from unsee.impl.agent.history import get_kept_renderings, get_without_trailer

#: The probe conversation's contents: plain words no template rewrites, each
#: unique, so a turn's content can be found in its rendered segment. The
#: assistant turns carry a reasoning block, which templates that drop earlier
#: reasoning rewrite (and are then refused).
PROBE_SYSTEM = "Probe system prompt alpha."
PROBE_USERS = ("Probe user turn one.", "Probe user turn two.", "Probe user turn three.")
PROBE_ASSISTANTS = ("<think>Probe reasoning one.</think>Probe answer one.",
                    "<think>Probe reasoning two.</think>Probe answer two.")
#: the probe's model turns without reasoning, for a template that rewrites earlier turns (impl/agent/history.py)
PROBE_ANSWERS = tuple(a.split("</think>")[1] for a in PROBE_ASSISTANTS)
HISTORY_KEPT = ("kept as the model wrote them, reasoning included: the template would rewrite them "
                "(docs/templates.md, 'Templates that rewrite history')")
PROBE_MEMORY = "Probe memory block."
#: The probe's tool exchange: a call of a tool of this name (no arguments), then its result.
PROBE_TOOL_NAME = "probe_tool_name"
PROBE_TOOL_RESULT = "Probe tool result."
#: The probe's arguments, to find where a call's arguments go (as the template writes them: ``tojson``).
PROBE_ARGUMENTS = {"probe_argument": "Probe argument value."}
TOOL_ROLE_NATIVE = "the template's own: the call in an assistant turn, the result in its tool role"
TOOL_ROLE_MAPPED = "user, prefixed [result of tool NAME]"
TOOL_CALL_NATIVE = "the template's own: the model writes the arguments of a call opened with the tool's name"
TOOL_CALL_MAPPED = "an assistant turn opened with CALL NAME("
#: The probe's tool definition (the function-schema shape chat templates read from ``tools=``).
PROBE_TOOL_DEFINITION = {"type": "function", "function": {
    "name": PROBE_TOOL_NAME, "parameters": {"type": "object", "properties": {"probe_argument": {"type": "string"}},
                                            "required": ["probe_argument"]}}}
TOOL_DEFINITIONS_NATIVE = "the template's own, in the system block (the runtime's tools, where it has any)"
TOOL_DEFINITIONS_NONE = "not rendered: the template has no tool-definition format in its system block"


class TemplateError(ValueError):
    """A chat template the runtime cannot render per turn: the message names
    the model and the first turn that differs."""


@attrs.frozen
class Segment:
    """A turn's text around its content: ``before + content + after``."""

    before: str
    after: str

    def fill(self, text: str) -> str:
        return f"{self.before}{text}{self.after}"


@attrs.frozen
class Segments:
    """What a template renders per turn (see the module docstring).

    ``first``: the first block of a context (opening text such as BOS and the
    system prompt's segment, or a user segment where system maps to user);
    ``system``: a system block mid-conversation, None where it maps to user;
    ``closing``: what the template puts after a model turn's content;
    ``after_eos``: by EOS id, the rest of ``closing`` after that id (a turn
    that ended on it already holds the id itself)."""

    first: Segment
    user: Segment
    system: Segment | None
    header: str
    closing: str
    after_eos: tuple[tuple[int, str], ...]
    roles: tuple[tuple[str, str], ...]
    #: the template's own tool format, where it has one (else None: a result is a user turn):
    #: an assistant turn calling a tool (around its name) and the tool role's result (around its text)
    tool_call: Segment | None = None
    tool_result: Segment | None = None
    #: whether the template renders tool definitions (``tools=``) in its system block, append-only,
    #: leaving every later turn as it is (the first block is then the template's own rendering)
    tool_definitions: bool = False
    #: where a call's arguments go: the call of tool N with arguments A renders as
    #: ``tool_call.before + N + tool_arguments.fill(json(A))`` (None where the template has no
    #: tool format, or writes arguments no way the probe could find)
    tool_arguments: Segment | None = None


#: ``render(messages, add_generation_prompt, tools=None)``: a compiled chat template
Render = Callable[..., str]


def compile_template(template: str, special_tokens: Mapping[str, str]) -> Render:
    """``render(messages, add_generation_prompt, tools=None)`` of a Jinja chat template,
    in the sandbox and with the names chat templates expect
    (``raise_exception``, ``tojson``, ``bos_token``/``eos_token``)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise TemplateError(f"the chat template refused the probe conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda value, **kw: json.dumps(value, ensure_ascii=False, **kw)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        compiled = env.from_string(template)
    except jinja2.TemplateError as exc:
        raise TemplateError(f"the chat template is not valid Jinja: {exc}") from None
    tokens = dict(special_tokens)

    def render(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False,
               tools: Sequence[Mapping] | None = None) -> str:
        try:
            try:
                return compiled.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                       tools=list(tools) if tools else None, **tokens)
            except TypeError:
                if tools:
                    raise
                # a template written for tools only (Hermes 2 Pro / 3's `tool_use`) iterates them unchecked
                return compiled.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                       tools=[], **tokens)
        except TemplateError:
            raise
        except Exception as exc:  # noqa: BLE001 (a template's own error on a conversation it does not accept)
            raise TemplateError(f"the chat template failed on the probe conversation: {exc}") from None
    return render


def strftime_now(format: str) -> str:
    """The current local time in ``format``, as transformers and llama.cpp's renderers define it for
    templates that date their system prompt (Llama 3.2, Mistral-Small 3.x). A conversation's system
    block is rendered when it starts; a step rendered on another day re-renders the context under
    the new block (as a changed system prompt does), and a twin started that day renders the same."""
    import datetime

    return datetime.datetime.now().strftime(format)


def is_system_first(render: Render) -> bool:
    """Whether the template renders a leading system message with its own
    text, as a prefix of the conversation that follows it (else system
    blocks map to user turns)."""
    try:
        alone = render([_msg("system", PROBE_SYSTEM)], False)
        more = render([_msg("system", PROBE_SYSTEM), _msg("user", PROBE_USERS[0])], False)
    except TemplateError:
        return False
    return PROBE_SYSTEM in alone and more.startswith(alone)


def get_probe(system_first: bool, answers: Sequence[str] = PROBE_ASSISTANTS) -> list[dict[str, str]]:
    """The probe conversation: [system,] user, assistant, user, assistant, user."""
    turns = [_msg("system", PROBE_SYSTEM)] if system_first else []
    for user, assistant in zip(PROBE_USERS, answers):
        turns += [_msg("user", user), _msg("assistant", assistant)]
    return turns + [_msg("user", PROBE_USERS[-1])]


def get_renderings(render: Render, probe: Sequence[Mapping[str, str]]) -> list[tuple[str, str]]:
    """The probe rendered at once up to each turn, in order: ``(label, text)``,
    with the generation prompt before each assistant turn (label ``header k``)."""
    out = [("start", "")]
    for k, message in enumerate(probe, start=1):
        if message["role"] == "assistant":
            out.append((f"header {k}", render(probe[:k - 1], True)))
        out.append((f"turn {k} ({message['role']})", render(probe[:k], False)))
    return out


def check_append_only(renderings: Sequence[tuple[str, str]], encode: Callable[[str], list[int]],
                      model: str) -> None:
    """Each rendering extends the one before, in text and in token ids:
    encoding turns ``1..k`` and then turn ``k+1`` gives the tokens of
    ``1..k+1`` at once. Raises :class:`TemplateError` naming the model, the
    turn added and the first earlier turn it changes."""
    for (_, before), (label, after) in itertools.pairwise(renderings):
        head, whole = encode(before), encode(after)
        if after.startswith(before) and head + encode(after[len(before):]) == whole:
            continue
        i = next((j for j, (a, b) in enumerate(zip(head, whole)) if a != b), min(len(head), len(whole)))
        if after.startswith(before):
            what = f"its tokens merge across the boundary before {label}"
        else:
            offset = next((j for j, (a, b) in enumerate(zip(before, after)) if a != b), len(after))
            what = f"adding {label} rewrites {get_turn_at(renderings, offset)}"
        raise TemplateError(
            f"model {model}: its chat template is not append-only: {what} (rendered at once, the tokens differ "
            f"from token {i}: {head[i:i + 4]} then, {whole[i:i + 4]} at once); a template that rewrites earlier "
            "turns breaks prefix sharing (Lemma 1). Name a template in the episode's settings ('chatml' or a "
            "Jinja string) to run this model")


def get_turn_at(renderings: Sequence[tuple[str, str]], offset: int) -> str:
    """The label of the rendering whose own text holds character ``offset``."""
    for (_, before), (label, after) in itertools.pairwise(renderings):
        if len(before) <= offset < len(after):
            return label
    return renderings[-1][0]


def build_segments(render: Render, encode: Callable[[str], list[int]], eos_ids: Sequence[int],
                   model: str) -> Segments:
    """The template's per-turn segments, from a probe conversation that was
    checked append-only (see the module docstring); :class:`TemplateError`
    where it is not, or where a turn's content is not rendered verbatim."""
    system_first = is_system_first(render)
    probe, kept = get_probe(system_first), False
    renderings = get_renderings(render, probe)
    try:
        check_append_only(renderings, encode, model)
    except TemplateError as strict:  # a template that rewrites earlier turns: served as the runtime keeps them
        probe, kept = get_probe(system_first, PROBE_ANSWERS), True
        renderings = get_kept_renderings(get_without_trailer(render, probe, encode), probe, strict)
        check_append_only(renderings, encode, model)
    texts = dict(renderings)
    answers = [m["content"] for m in probe if m["role"] == "assistant"]
    n = 1 if system_first else 0  # turns before the first user turn
    first = split_turn(texts, f"turn 1 ({probe[0]['role']})", "start", probe[0]["content"], model)
    user = split_turn(texts, f"turn {n + 3} (user)", f"turn {n + 2} (assistant)", PROBE_USERS[1], model)
    header = get_delta(texts, f"header {n + 2}", f"turn {n + 1} (user)")
    closing = split_turn(texts, f"turn {n + 2} (assistant)", f"header {n + 2}", answers[0], model).after
    check_same_turns(texts, n, user, header, closing, model, answers[1])
    system = get_mid_system(render, encode, probe[:n + 2])
    after_eos = get_after_eos(closing, encode, eos_ids)
    tool_call, tool_result = get_tool_segments(render, encode, probe[:n + 2], model)
    arguments = get_call_arguments(render, encode, probe[:n + 2], tool_call, header, model)
    definitions = system_first and has_tool_definitions(render, encode, probe, renderings, model)
    roles = (("system prompt", "system" if system_first else "user"),
             ("system block mid-conversation", "system" if system is not None else "user"),
             ("tool call (a plan)", TOOL_CALL_NATIVE if arguments is not None else TOOL_CALL_MAPPED),
             ("tool result", TOOL_ROLE_NATIVE if tool_result is not None else TOOL_ROLE_MAPPED),
             ("tool definitions", TOOL_DEFINITIONS_NATIVE if definitions else TOOL_DEFINITIONS_NONE),
             ("consecutive turns of one role", "one segment each, never merged"),
             *((("earlier model turns", HISTORY_KEPT),) if kept else ()))
    return Segments(first, user, system, header, closing, after_eos, roles, tool_call, tool_result, definitions,
                    arguments)


def has_tool_definitions(render: Render, encode: Callable[[str], list[int]], probe: Sequence[Mapping[str, str]],
                         plain: Sequence[tuple[str, str]], model: str) -> bool:
    """Whether the template renders tool definitions in its system block: the probe rendered with
    a tool (``tools=``) names it in the first block, and every later turn adds what it adds
    without tools (``plain``: the probe's renderings without). Where it does, the probe with the
    tool must be append-only (:class:`TemplateError` otherwise, as for other turns)."""
    try:
        with_tools = get_renderings(functools.partial(render, tools=[PROBE_TOOL_DEFINITION]), probe)
    except TemplateError:
        return False
    if PROBE_TOOL_NAME not in with_tools[1][1] or PROBE_TOOL_NAME in plain[1][1]:
        return False  # a template that ignores tools= (or names the probe tool anyway)
    added = [after[len(before):] for (_, before), (_, after) in itertools.pairwise(with_tools)]
    if added[1:] != [after[len(before):] for (_, before), (_, after) in itertools.pairwise(plain)][1:]:
        return False  # the definitions go elsewhere than the system block (e.g. into a user turn)
    check_append_only(with_tools, encode, model)
    return True


def render_first_with_tools(render: Render, encode: Callable[[str], list[int]], system: str,
                            tools: Sequence[Mapping], user: Segment, model: str) -> str:
    """The first block (the system prompt with ``tools``' definitions) as the template renders it,
    checked append-only with the tools given: a user turn after it adds ``user``'s segment, in
    text and in token ids; :class:`TemplateError` naming the model otherwise."""
    first = render([_msg("system", system)], False, tools=tools)
    whole = render([_msg("system", system), _msg("user", PROBE_USERS[0])], False, tools=tools)
    check_append_only([("start", ""), ("system prompt with tools", first), ("turn 2 (user)", whole)], encode, model)
    if whole[len(first):] != user.fill(PROBE_USERS[0]) or system not in first:
        raise TemplateError(f"model {model}: its chat template renders the system prompt with these tools unlike "
                            "the probe's (a user turn after it is not its user segment, or the prompt is not verbatim)")
    return first


def get_tool_segments(render: Render, encode: Callable[[str], list[int]], head: Sequence[Mapping[str, str]],
                      model: str) -> tuple[Segment | None, Segment | None]:
    """The template's tool call and tool result segments, where it renders both after a model
    turn with the tool's name and the result's text verbatim, append-only (checked as the other
    turns are: :class:`TemplateError` where a call or result rewrites what came before);
    ``(None, None)`` where it has no tool format (a role it renders generically writes no
    call: the name is not in what it adds)."""
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": PROBE_TOOL_NAME, "arguments": {}}}]}
    result = {"role": "tool", "name": PROBE_TOOL_NAME, "content": PROBE_TOOL_RESULT}
    try:
        texts = [render(head, False), render([*head, call], False), render([*head, call, result], False)]
    except TemplateError:
        return None, None
    if not (texts[1].startswith(texts[0]) and texts[1][len(texts[0]):].count(PROBE_TOOL_NAME) == 1):
        return None, None  # no tool call format (a generic role rendering drops the call)
    # it has one: from here on, a format that rewrites a turn is refused, as other turns are
    check_append_only(list(zip(("turns before", "tool call", "tool result"), texts)), encode, model)
    added = [after[len(before):] for before, after in itertools.pairwise(texts)]
    if added[1].count(PROBE_TOOL_RESULT) != 1:
        return None, None
    return Segment(*added[0].split(PROBE_TOOL_NAME)), Segment(*added[1].split(PROBE_TOOL_RESULT))


def get_call_arguments(render: Render, encode: Callable[[str], list[int]], head: Sequence[Mapping[str, str]],
                       tool_call: Segment | None, header: str, model: str) -> Segment | None:
    """Where the template writes a call's arguments, so that the model can write them itself:
    the text between the tool's name and the arguments' JSON, and after it. Only where the
    call turn opens with the assistant header (the model's turn is decoded after the header
    and the call's opening) and the probe's arguments are written once, as JSON (the
    model's own text is parsed as JSON); appended as other turns are (:class:`TemplateError`
    otherwise). None where any of that fails: plans then keep ``CALL NAME(``."""
    if tool_call is None or not tool_call.before.startswith(header):
        return None
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": PROBE_TOOL_NAME, "arguments": PROBE_ARGUMENTS}}]}
    result = {"role": "tool", "name": PROBE_TOOL_NAME, "content": PROBE_TOOL_RESULT}
    try:
        texts = [render(head, False), render([*head, call], False), render([*head, call, result], False)]
    except TemplateError:
        return None
    added = texts[1][len(texts[0]):]
    written = json.dumps(PROBE_ARGUMENTS)
    if not (texts[1].startswith(texts[0]) and added.startswith(tool_call.before + PROBE_TOOL_NAME)
            and added.count(written) == 1):
        return None
    between, after = added[len(tool_call.before + PROBE_TOOL_NAME):].split(written)
    check_append_only(list(zip(("turns before", "tool call with arguments", "tool result"), texts)), encode, model)
    return Segment(between, after)


def split_turn(texts: Mapping[str, str], label: str, before: str, content: str, model: str) -> Segment:
    """The segment around ``content`` in what rendering ``label`` added to ``before``."""
    added = get_delta(texts, label, before)
    parts = added.split(content)
    if len(parts) != 2:
        raise TemplateError(f"model {model}: its chat template does not render the content of {label} verbatim "
                            f"(found {len(parts) - 1} times in {added!r})")
    return Segment(*parts)


def get_delta(texts: Mapping[str, str], label: str, before: str) -> str:
    return texts[label][len(texts[before]):]


def check_same_turns(texts: Mapping[str, str], n: int, user: Segment, header: str, closing: str, model: str,
                     answer: str = PROBE_ASSISTANTS[1]) -> None:
    """The second assistant turn (``answer``) and the third user turn render as the first
    ones did (segments are per role, not per position)."""
    expected = {f"turn {n + 4} (assistant)": header + answer + closing,
                f"turn {n + 5} (user)": user.fill(PROBE_USERS[2])}
    previous = {f"turn {n + 4} (assistant)": f"turn {n + 3} (user)", f"turn {n + 5} (user)": f"turn {n + 4} (assistant)"}
    for label, text in expected.items():
        if get_delta(texts, label, previous[label]) != text:
            raise TemplateError(f"model {model}: its chat template renders {label} unlike the same role's earlier "
                                "turn; its turns are not one segment per role")


def get_mid_system(render: Render, encode: Callable[[str], list[int]],
                   head: Sequence[Mapping[str, str]]) -> Segment | None:
    """The segment of a system block after a model turn, where the template
    renders one there append-only with its own text; else None (it maps to user)."""
    try:
        before = render(head, False)
        after = render([*head, _msg("system", PROBE_MEMORY)], False)
    except TemplateError:
        return None
    added = after[len(before):]
    if not after.startswith(before) or encode(before) + encode(added) != encode(after) or added.count(PROBE_MEMORY) != 1:
        return None
    return Segment(*added.split(PROBE_MEMORY))


def get_after_eos(closing: str, encode: Callable[[str], list[int]], eos_ids: Sequence[int]) -> tuple[tuple[int, str], ...]:
    """For each EOS id the closing's tokens begin with: the closing's text
    after it (what the next block opens with when the turn ended on that id)."""
    tokens = encode(closing)
    if not tokens or tokens[0] not in eos_ids:
        return ()
    for i in range(1, len(closing) + 1):
        if encode(closing[:i]) == tokens[:1] and encode(closing[i:]) == tokens[1:]:
            return ((tokens[0], closing[i:]),)
    return ()


def _msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


__all__ = ["HISTORY_KEPT", "PROBE_ANSWERS", "PROBE_ARGUMENTS", "PROBE_ASSISTANTS", "PROBE_MEMORY", "PROBE_SYSTEM", "PROBE_TOOL_DEFINITION", "PROBE_TOOL_NAME",
           "PROBE_TOOL_RESULT", "PROBE_USERS", "TOOL_CALL_MAPPED", "TOOL_CALL_NATIVE", "TOOL_DEFINITIONS_NATIVE", "TOOL_DEFINITIONS_NONE", "TOOL_ROLE_MAPPED",
           "TOOL_ROLE_NATIVE", "Render", "Segment", "Segments", "TemplateError", "build_segments", "check_append_only",
           "compile_template", "get_call_arguments", "get_probe", "get_renderings", "get_tool_segments", "has_tool_definitions",
           "is_system_first", "render_first_with_tools", "strftime_now"]
