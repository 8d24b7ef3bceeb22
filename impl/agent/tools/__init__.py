"""Tools, environment snapshots and side-effect-safe replay (assumption A3).

- :mod:`.calls`: :class:`Call`, call IDs and the parse of a plan's arguments;
- :mod:`.environment`: :class:`Environment` and its content-addressed
  :class:`SnapshotStore`;
- :mod:`.catalog`: :class:`Tool` and :func:`default_tools`;
- :mod:`.layer`: :class:`ToolLayer`, the runtime extension (plans become
  calls; replay shadow-executes them);
- :mod:`.records`: the layer's part of the session record;
- :mod:`.runtime`: :class:`ToolAgentRuntime`, a runtime with a tool layer.

See docs/tools.md for the replay modes, the default, the report format and
what cannot be undone.
"""

from __future__ import annotations

from unsee.impl.agent.tools.calls import (
    ADDRESS,
    DEFAULT_READ_MODE,
    DIVERGENCE_KINDS,
    FILLERS,
    MAX_ARG_CHARS,
    READ_MODES,
    Call,
    call_id_for,
    clean_value,
    parse_arguments,
    parse_json_arguments,
    result_source,
)
from unsee.impl.agent.tools.catalog import Tool, default_tools
from unsee.impl.agent.tools.environment import Environment, SnapshotStore, snapshot_id
from unsee.impl.agent.tools.layer import TOOLS, ToolLayer
from unsee.impl.agent.tools.runtime import ToolAgentRuntime

__all__ = [
    "ADDRESS",
    "DEFAULT_READ_MODE",
    "DIVERGENCE_KINDS",
    "FILLERS",
    "MAX_ARG_CHARS",
    "READ_MODES",
    "TOOLS",
    "Call",
    "Environment",
    "SnapshotStore",
    "Tool",
    "ToolAgentRuntime",
    "ToolLayer",
    "call_id_for",
    "clean_value",
    "default_tools",
    "parse_arguments",
    "parse_json_arguments",
    "result_source",
    "snapshot_id",
]
