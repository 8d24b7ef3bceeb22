"""Rebuilding a runtime from its session record: the one place that knows
which extension a stored name means.

The record's ``extra`` holds each extension's part under its name
(:attr:`Extension.name`); :data:`EXTENSION_LOADERS` maps that name to the
function that rebuilds it. A name with no loader is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from unsee.impl.agent.extensions import Extension
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.agent.tools.client import CLIENT, ClientToolRuntime, ClientTools
from unsee.impl.agent.tools.layer import TOOLS, ToolLayer
from unsee.impl.agent.tools.runtime import ToolAgentRuntime
from unsee.impl.engines.protocol import Engine

#: Stored extension name -> the loader of its record.
EXTENSION_LOADERS: dict[str, Callable[[dict], Extension]] = {TOOLS: ToolLayer.from_record,
                                                              CLIENT: ClientTools.from_record}


class UnknownExtensionError(ValueError):
    """A session record names an extension this build cannot rebuild."""


def load_extensions(records: Mapping[str, dict]) -> list[Extension]:
    """The extensions of a session record's ``extra``, in name order."""
    unknown = sorted(name for name in records if name not in EXTENSION_LOADERS)
    if unknown:
        raise UnknownExtensionError(f"the session record names extension(s) {unknown} that this build does not "
                                    f"know; known: {sorted(EXTENSION_LOADERS)}")
    return [EXTENSION_LOADERS[name](records[name]) for name in sorted(records)]


def get_runtime_class(extensions: list[Extension]) -> type[AgentRuntime]:
    """The runtime class that presents ``extensions``: a session with a tool
    layer is a :class:`ToolAgentRuntime` (its ``world``, ``calls``... at hand); one with a client's
    tools (a server's conversation) a :class:`ClientToolRuntime`."""
    if any(isinstance(e, ClientTools) for e in extensions):
        return ClientToolRuntime
    return ToolAgentRuntime if any(isinstance(e, ToolLayer) for e in extensions) else AgentRuntime


def load_runtime(engine: Engine, record: dict, runtime_class: type[AgentRuntime] | None = None) -> AgentRuntime:
    """Reopen the session of ``record`` on ``engine`` with its extensions
    (:meth:`AgentRuntime.from_session_record`); ``runtime_class``: the class
    to build (default: :func:`get_runtime_class`)."""
    extensions = load_extensions(record.get("extra", {}))
    cls = runtime_class or get_runtime_class(extensions)
    return cls.from_session_record(engine, record, extensions)


__all__ = ["EXTENSION_LOADERS", "UnknownExtensionError", "get_runtime_class", "load_extensions", "load_runtime"]
