"""What one step of the server's client runtime runs under (issue 38, issue 49): a
:class:`Config` (the system text, the tools, the tool choice, the response format) with its
:class:`Sampling` (how its turn is decoded), recorded with the step so a forget's replay runs
the step as it ran; and the context a turn has (:func:`get_context_length`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

import attrs

from unsee.impl.agent.episode import Settings


def get_context_length(lm) -> int | None:
    """The most tokens the model's context holds (llama.cpp's ``n_ctx``; vLLM's ``max_model_len``
    less the one position its engine keeps for the logits' request, the bound its ``prefill`` and
    ``generate`` raise past; a transformers model's ``--ctx-size``, else its position limit), or
    None where the engine does not say."""
    n = getattr(lm, "n_ctx", None)
    if isinstance(n, int) and n > 0:
        return n
    info = getattr(lm, "info", None)
    n = getattr(info.get("options"), "max_model_len", None) if isinstance(info, dict) else None
    if isinstance(n, int) and n > 1:
        return n - 1  # impl/engines/vllm/engine.py, _max_len
    n = getattr(getattr(getattr(lm, "model", None), "config", None), "max_position_embeddings", None)
    return n if isinstance(n, int) and n > 0 else None


@attrs.frozen
class Sampling:
    """How one turn is decoded, where the request said: ``temperature``, ``seed`` and the output
    cap ``max_new_tokens`` (None: the session's :class:`~unsee.impl.agent.episode.Settings`),
    ``top_p``, the penalties and the stop texts (OpenAI's ``stop``). Recorded with the step's
    :class:`Config`, so a forget's replay decodes each turn as it was decoded; a value at its
    default is left out of the record (a config of a store written before per-request settings
    reads back as the default, and keeps its key)."""

    temperature: float | None = None
    seed: int | None = None
    max_new_tokens: int | None = None
    top_p: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: tuple[str, ...] = ()

    def get_record(self) -> dict:
        record = {**attrs.asdict(self), "stop": list(self.stop)}
        defaults = {**attrs.asdict(Sampling()), "stop": []}
        return {k: v for k, v in record.items() if v != defaults[k]}

    @classmethod
    def from_record(cls, record: Mapping) -> Sampling:
        return cls(**{**record, "stop": tuple(record.get("stop", ()))})

    def get_settings(self, session: Settings) -> Settings:
        """The session's settings with this turn's temperature, seed and cap."""
        return attrs.evolve(session, **{k: v for k, v in (("temperature", self.temperature), ("seed", self.seed),
                                                          ("max_new_tokens", self.max_new_tokens)) if v is not None})


@attrs.frozen
class Config:
    """What one step runs under: the system text, the tools' definitions (each as canonical JSON
    in the chat-template shape ``{"type": "function", "function": {...}}``), the tool choice
    (``auto``, ``none``: the tools rendered, no call written, ``required``, or ``function``: the
    tool ``function``), whether a turn may make several calls, the response format (its
    canonical JSON: ``json_schema`` or ``json_object``; None: text) and how the turn is decoded
    (:class:`Sampling`). The grammar a turn is decoded under is a function of these
    (impl/agent/tools/grammars.py), so a replay that runs the step under its recorded config
    decides its tokens as the twin does."""

    system: str
    tools: tuple[str, ...] = ()
    choice: str = "auto"
    function: str | None = None
    parallel: bool = True
    format: str | None = None
    sampling: Sampling = Sampling()

    def get_definitions(self) -> list[dict]:
        return [json.loads(t) for t in self.tools]

    def get_names(self) -> set[str]:
        """The tools a turn may call (none under ``tool_choice: none``)."""
        return set() if self.choice == "none" else {d["function"]["name"] for d in self.get_definitions()}

    def get_format(self) -> dict | None:
        return None if self.format is None else json.loads(self.format)

    def get_record(self) -> dict:
        """The config as stored; a field added since stores were first written (``format``,
        ``sampling``) is left out at its default, so an older step's record (and its key, in the
        state digest) stays as it was."""
        record = {"system": self.system, "tools": list(self.tools), "choice": self.choice,
                  "function": self.function, "parallel": self.parallel}
        if self.format is not None:
            record["format"] = self.format
        sampling = self.sampling.get_record()
        return {**record, "sampling": sampling} if sampling else record

    @classmethod
    def from_record(cls, record: Mapping) -> Config:
        return cls(record["system"], tuple(record["tools"]), record["choice"], record["function"],
                   record["parallel"], record.get("format"), Sampling.from_record(record.get("sampling", {})))

    def get_key(self) -> str:
        return hashlib.sha256(json.dumps(self.get_record(), sort_keys=True).encode()).hexdigest()[:32]


__all__ = ["Config", "Sampling", "get_context_length"]
