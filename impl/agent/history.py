"""Templates that rewrite earlier turns (issue 51): what the runtime keeps instead.

Reasoning templates (Qwen3, QwQ, the DeepSeek-R1 distills) render a model turn one way while it is
the last one (with its ``<think>`` block, or an empty one) and another way once a user turn follows
(the reasoning dropped). Rendered whole at each turn, such a conversation is no longer one growing
token sequence, and prefix sharing (Lemma 1) would not hold for it.

The runtime serves them by keeping the conversation one append-only sequence: each model turn stays
as the model wrote it (the generation prompt, its own tokens, the template's closing), and every
other turn is rendered as the template renders it after a model turn. What the model sees therefore
differs from what its template would render in one place only: an earlier turn keeps the reasoning
(and the generation prompt's opening, such as ``<think>\\n``) the template would drop. A forget's
twin is served by the same rule, so the exactness argument is unchanged: the twin's sequence is the
same function of its turns (docs/templates.md, "Templates that rewrite history").

:func:`get_kept_renderings` derives that sequence from a probe conversation whose model turns carry
no reasoning, from renderings that end on a user turn (append-only among themselves in these
templates) and generation prompts; it raises :class:`~unsee.impl.agent.templates.TemplateError`
where the template is not of that kind either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

#: ``render(messages, add_generation_prompt)``
Render = Callable[..., str]


def get_kept_renderings(render: Render, probe: Sequence[Mapping[str, str]], error: Exception
                        ) -> list[tuple[str, str]]:
    """The probe's renderings as the runtime keeps the conversation (the module docstring), labelled
    as :func:`~unsee.impl.agent.templates.get_renderings` labels them; raises ``error`` where the
    template's renderings ending on a user turn do not extend one another, a model turn's content is
    not written verbatim, the history's header is not where the generation prompt's begins, or the
    closing after a model turn differs between its last and its earlier form."""
    kept, out = "", [("start", "")]
    before = ""  # the template's own rendering up to the last turn that was not the model's
    turn = None  # the last model turn: (the generation prompt's header, its content, its closing)
    for k, message in enumerate(probe, start=1):
        if message["role"] != "assistant":
            whole = render(probe[:k], False)
            if not whole.startswith(before):
                raise error
            delta = whole[len(before):]
            if turn is not None:  # past the model turn, in the history form the template rewrote it to
                delta = get_after_turn(delta, *turn, error)
            kept, before, turn = kept + delta, whole, None
            out.append((f"turn {k} ({message['role']})", kept))
            continue
        prompt = render(probe[:k - 1], True)
        if not prompt.startswith(before):
            raise error
        header = prompt[len(before):]
        closing = get_closing(render(probe[:k], False), before, message["content"], error)
        turn = (header, message["content"], closing)
        out.append((f"header {k}", kept + header))
        kept += header + message["content"] + closing
        out.append((f"turn {k} ({message['role']})", kept))
    return out


def get_closing(last: str, before: str, content: str, error: Exception) -> str:
    """What the template writes after a model turn's ``content`` while the turn is the last one."""
    if not last.startswith(before) or last[len(before):].count(content) != 1:
        raise error
    return last[len(before):].split(content)[1]


def get_after_turn(delta: str, header: str, content: str, closing: str, error: Exception) -> str:
    """The part of ``delta`` (the template's rendering of a model turn in its history form, then the
    next turn) after the model turn. The history form must be a header the generation prompt's
    ``header`` begins with (it may add ``<think>\\n``), the content, then the same ``closing``."""
    if delta.count(content) != 1:
        raise error
    history_header, rest = delta.split(content)
    if not rest.startswith(closing) or not header.startswith(history_header):
        raise error
    return rest[len(closing):]


def get_without_trailer(render: Render, probe: Sequence[Mapping[str, str]], encode: Callable[[str], list[int]]
                        ) -> Render:
    """``render`` less the text a template writes only at the end of a conversation with no
    generation prompt (Phi-3.5's ``<|endoftext|>``): what follows the longest common prefix of the
    first turn rendered with and without the generation prompt (backed off to a token boundary),
    where every rendering ends with it."""
    plain, prompted = render(probe[:1], False), render(probe[:1], True)
    common = next((i for i, (a, b) in enumerate(zip(plain, prompted)) if a != b), min(len(plain), len(prompted)))
    whole = encode(plain)
    common = next((j for j in range(common, -1, -1) if encode(plain[:j]) + encode(plain[j:]) == whole), 0)
    trailer = plain[common:]
    if not trailer or prompted.startswith(plain):
        return render

    def without(messages, add_generation_prompt=False, **kw):
        text = render(messages, add_generation_prompt, **kw)
        return text[:-len(trailer)] if not add_generation_prompt and text.endswith(trailer) else text
    return without


__all__ = ["get_kept_renderings", "get_without_trailer"]
