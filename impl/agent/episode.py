"""The episode format: a versioned JSON file any implementation can run.

An episode is a system prompt, settings, a list of steps (one transition
each) and optionally the forget target. See docs/episode-format.md for the
full description; :func:`load_episode` validates and names every problem.

Step kinds and what the transition ``F`` does with them:

============  ================================================================
``user``      prefill the user message, decode an answer
``memory``    prefill memory records (plaintext store re-injected), add them
              to the memory store; no model turn
``tool``      prefill a tool result (one or more fields), decode an answer
``plan``      prefill the user request, decode a pending tool call (a plan)
``remember``  ask for a note, decode it, write it back to the memory store
``compact``   decode a summary of the context, then rewrite the context as
              ``[system, summary, latest tool round]`` on a new cache lineage
              (the round: the trailing answers and tool outputs, where it
              holds a tool output, copied verbatim; else none)
``session``   start a new session: a new lineage with ``[system, memory]``
============  ================================================================
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

FORMAT = "unsee.episode"
#: The version this build writes. Version 2 added the per-step ``independent``
#: label; version 1 files (no labels) are still read.
VERSION = 2
#: The version an episode with an *empty* observed step needs (the
#: counterfactual of a step whose only item was removed: ``"text": null`` on a
#: user or plan step, ``[]`` as a memory step's records or a tool step's
#: fields). The writer uses it only for such episodes, so every other file
#: reads the same in a version 2 reader.
EMPTY_STEPS_VERSION = 3
#: The version an episode that names a chat template (``settings.template``)
#: needs; the writer uses it only for such episodes.
TEMPLATE_VERSION = 4
#: Every version this build reads.
READ_VERSIONS = (1, 2, 3, 4)
STEP_KINDS = ("user", "memory", "tool", "plan", "remember", "compact", "session")
#: kinds whose observation carries external items (source ids)
OBSERVED_KINDS = ("user", "memory", "tool", "plan")
CHECKPOINT_POLICIES = ("every_turn", "before_injection", "session_start")
#: kinds whose transition decodes a model turn (the only steps an
#: ``independent`` label can describe)
MODEL_TURN_KINDS = ("user", "tool", "plan", "remember", "compact")


class EpisodeError(ValueError):
    """A malformed episode: the message names the offending field."""


@attrs.frozen
class Item:
    """External content with a source id (what a forget request names)."""

    source: str
    text: str


@attrs.frozen
class Step:
    id: str
    kind: str
    items: tuple[Item, ...] = ()
    tool: str | None = None
    #: A claim carried by the episode (version 2): this step's model turn does
    #: not depend on the forget target, so it would be the same without it
    #: (the paper's "indep" attribution oracle). Nothing checks the claim; the
    #: runtime's exact forget never reads it, only baselines that trust it do.
    independent: bool = False


@attrs.frozen
class Settings:
    max_new_tokens: int = 24
    temperature: float = 0.0
    seed: int = 0
    checkpoint_policy: str = "every_turn"
    #: the chat template episodes are rendered with (version 4): None (the
    #: model's own, else ChatML), "chatml", "model" or a Jinja template
    #: string (impl/agent/render.py, docs/templates.md)
    template: str | None = None


@attrs.frozen
class Target:
    source: str
    value: str | None = None


@attrs.frozen
class Episode:
    system: str
    steps: tuple[Step, ...]
    settings: Settings = Settings()
    target: Target | None = None
    probes: tuple[str, ...] = ()

    def get_sources(self) -> tuple[str, ...]:
        return tuple(item.source for step in self.steps for item in step.items)

    def to_json(self) -> dict[str, Any]:
        return episode_to_json(self)


def _require(condition: bool, where: str, message: str) -> None:
    if not condition:
        raise EpisodeError(f"{where}: {message}")


def _parse_items(raw: Mapping[str, Any], where: str, version: int) -> tuple[Item, ...]:
    kind = raw["kind"]
    # an empty observed step is the counterfactual of a step whose only item
    # was removed (docs/episode-format.md, version 3)
    empty_ok = version >= EMPTY_STEPS_VERSION
    if kind == "memory":
        records = raw.get("records")
        _require(isinstance(records, list) and (records or empty_ok), where,
                 "a memory step needs a non-empty 'records' list" + ("" if empty_ok else _EMPTY_HINT))
        return tuple(_parse_record(r, f"{where}.records[{i}]") for i, r in enumerate(records))
    if kind == "tool":
        fields = raw.get("fields")
        if fields is None and "text" in raw:
            fields = [{"source": raw.get("source", raw["id"]), "text": raw["text"]}]
        _require("source" not in raw or "fields" not in raw, where, "give 'source' with 'text', not with 'fields'")
        _require(isinstance(fields, list) and (fields or empty_ok), where,
                 "a tool step needs 'fields' (or 'text')" + ("" if empty_ok else _EMPTY_HINT))
        return tuple(_parse_record(r, f"{where}.fields[{i}]") for i, r in enumerate(fields))
    if kind in ("user", "plan"):
        if empty_ok and "text" in raw and raw["text"] is None:
            _require("source" not in raw, where, "an empty step ('text': null) takes no 'source'")
            return ()
        hint = " (or null for an empty step)" if empty_ok else _EMPTY_HINT if "text" in raw and raw["text"] is None else ""
        _require(isinstance(raw.get("text"), str), where, f"a {kind} step needs a string 'text'{hint}")
        source = raw.get("source", raw["id"])
        _require(isinstance(source, str) and source, where, "'source' must be a non-empty string")
        return (Item(source, raw["text"]),)
    _require("text" not in raw, where, f"a {kind} step takes no 'text'")
    return ()


_EMPTY_HINT = f" (an empty step needs version {EMPTY_STEPS_VERSION})"


def _parse_record(raw: Any, where: str) -> Item:
    _require(isinstance(raw, Mapping), where, "must be an object with 'source' and 'text'")
    _require(isinstance(raw.get("source"), str) and raw["source"], where, "needs a non-empty string 'source'")
    _require(isinstance(raw.get("text"), str), where, "needs a string 'text'")
    return Item(raw["source"], raw["text"])


def parse_episode(raw: Any) -> Episode:
    """Validate a decoded JSON object and build an :class:`Episode`."""
    _require(isinstance(raw, Mapping), "episode", "must be a JSON object")
    _require(raw.get("format") == FORMAT, "format", f"must be {FORMAT!r}, got {raw.get('format')!r}")
    _require(_is_int(raw.get("version")) and raw.get("version") in READ_VERSIONS, "version",
             f"unsupported version {raw.get('version')!r}; this build reads versions "
             f"{', '.join(map(str, READ_VERSIONS))}")
    _require(isinstance(raw.get("system"), str), "system", "must be a string")
    settings = _parse_settings(raw.get("settings", {}))
    _require(settings.template is None or raw["version"] >= TEMPLATE_VERSION, "settings.template",
             f"a template needs version {TEMPLATE_VERSION} or later; this file is version {raw['version']}")
    steps_raw = raw.get("steps")
    _require(isinstance(steps_raw, list) and steps_raw, "steps", "must be a non-empty list")
    steps, seen_ids, seen_sources = [], set(), set()
    for i, step_raw in enumerate(steps_raw):
        where = f"steps[{i}]"
        _require(isinstance(step_raw, Mapping), where, "must be an object")
        _require(isinstance(step_raw.get("id"), str) and step_raw["id"], where, "needs a non-empty string 'id'")
        _require(step_raw["id"] not in seen_ids, where, f"duplicate step id {step_raw['id']!r}")
        _require(step_raw.get("kind") in STEP_KINDS, where,
                 f"unknown kind {step_raw.get('kind')!r}; expected one of {STEP_KINDS}")
        items = _parse_items(step_raw, where, raw["version"])
        for item in items:
            _require(item.source not in seen_sources, where, f"duplicate source id {item.source!r}")
            seen_sources.add(item.source)
        seen_ids.add(step_raw["id"])
        tool = step_raw.get("tool")
        _require(tool is None or isinstance(tool, str), where, "'tool' must be a string")
        if step_raw["kind"] in ("tool", "plan"):
            tool = tool or ("fetch" if step_raw["kind"] == "tool" else "send_message")
        independent = _parse_independent(step_raw, raw["version"], where)
        steps.append(Step(step_raw["id"], step_raw["kind"], items, tool, independent))
    target = None
    if raw.get("target") is not None:
        t = raw["target"]
        _require(isinstance(t, Mapping) and isinstance(t.get("source"), str), "target",
                 "must be an object with a string 'source'")
        _require(t["source"] in seen_sources, "target.source", f"unknown source id {t['source']!r}")
        _require(t.get("value") is None or isinstance(t.get("value"), str), "target.value", "must be a string")
        target = Target(t["source"], t.get("value"))
    probes = raw.get("probes", [])
    _require(isinstance(probes, list) and all(isinstance(p, str) for p in probes), "probes",
             "must be a list of strings")
    return Episode(raw["system"], tuple(steps), settings, target, tuple(probes))


def _parse_independent(raw: Mapping[str, Any], version: int, where: str) -> bool:
    """The optional ``independent`` label of a step (version 2 on)."""
    if "independent" not in raw:
        return False
    label = raw["independent"]
    # A version 1 reader ignored the key; refusing it here keeps a file written
    # for version 2 from being read as if it carried no claims.
    _require(version >= 2, f"{where}.independent", f"labels need version 2 or later; this file is version {version}")
    _require(isinstance(label, bool), f"{where}.independent", f"must be true or false, got {label!r}")
    _require(not label or raw["kind"] in MODEL_TURN_KINDS, f"{where}.independent",
             f"a {raw['kind']} step has no model turn to label; only {MODEL_TURN_KINDS} steps have one")
    return label


def _parse_settings(raw: Any) -> Settings:
    _require(isinstance(raw, Mapping), "settings", "must be an object")
    unknown = set(raw) - {f.name for f in attrs.fields(Settings)}
    _require(not unknown, "settings", f"unknown keys {sorted(unknown)}")
    s = Settings(**raw)
    _require(_is_int(s.max_new_tokens) and 1 <= s.max_new_tokens <= 4096, "settings.max_new_tokens",
             "must be an integer in 1..4096")
    _require(isinstance(s.temperature, (int, float)) and not isinstance(s.temperature, bool)
             and math.isfinite(s.temperature) and 0 <= s.temperature <= 100, "settings.temperature",
             "must be a finite number in 0..100")
    _require(_is_int(s.seed), "settings.seed", "must be an integer")
    _require(s.checkpoint_policy in CHECKPOINT_POLICIES, "settings.checkpoint_policy",
             f"must be one of {CHECKPOINT_POLICIES}")
    _require(s.template is None or (isinstance(s.template, str) and s.template.strip()), "settings.template",
             "must be 'chatml', 'model' or a non-empty Jinja template string")
    return s


def _is_int(value: Any) -> bool:
    """JSON integers only: ``true`` and ``1.0`` are not integers here."""
    return isinstance(value, int) and not isinstance(value, bool)


def load_episode(path: str | Path) -> Episode:
    """Read and validate an episode file; errors name the file and the field."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EpisodeError(f"{path}: no such episode file") from None
    except IsADirectoryError:
        raise EpisodeError(f"{path}: is a directory, not an episode file") from None
    except OSError as exc:
        raise EpisodeError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EpisodeError(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise EpisodeError(f"{path}: JSON nested too deeply to be an episode") from None
    try:
        return parse_episode(raw)
    except EpisodeError as exc:
        raise EpisodeError(f"{path}: {exc}") from None


def episode_to_json(episode: Episode) -> dict[str, Any]:
    """The inverse of :func:`parse_episode` (round-trips)."""
    steps = []
    for step in episode.steps:
        raw: dict[str, Any] = {"id": step.id, "kind": step.kind}
        if step.kind == "memory":
            raw["records"] = [{"source": i.source, "text": i.text} for i in step.items]
        elif step.kind == "tool":
            raw["fields"] = [{"source": i.source, "text": i.text} for i in step.items]
        elif step.kind in ("user", "plan") and not step.items:
            raw["text"] = None  # an empty step (version 3)
        elif step.kind in ("user", "plan"):
            raw["text"] = step.items[0].text
            if step.items[0].source != step.id:
                raw["source"] = step.items[0].source
        if step.tool is not None:
            raw["tool"] = step.tool
        if step.independent:  # written only when set: an unlabelled step reads the same in version 1
            raw["independent"] = True
        steps.append(raw)
    empty = any(not s.items for s in episode.steps if s.kind in OBSERVED_KINDS)
    version = TEMPLATE_VERSION if episode.settings.template is not None else EMPTY_STEPS_VERSION if empty else VERSION
    # the template is written only when named: every other file reads the same in a version 2 reader
    settings = attrs.asdict(episode.settings, filter=lambda a, v: a.name != "template" or v is not None)
    out: dict[str, Any] = {"format": FORMAT, "version": version, "system": episode.system,
                           "settings": settings, "steps": steps}
    if episode.target is not None:
        out["target"] = {"source": episode.target.source, "value": episode.target.value}
    if episode.probes:
        out["probes"] = list(episode.probes)
    return out
