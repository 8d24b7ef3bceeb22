"""unsee: exact, cheap, provable forgetting for stateful LLM agents.

The public API. Everything a user needs to drive an agent of their own::

    from unsee import AgentRuntime, Item, Step, load_engine

    engine = load_engine("tiny")                      # or "smollm2", backend="llamacpp", ...
    agent = AgentRuntime.start(engine, system="You are a helpful assistant.")
    agent.step(Step("s1", "user", (Item("u1", "I live at 4417 Elm Street."),)))
    report = agent.forget("u1")                       # the state of a twin that never saw u1

The names are imported on first use, so ``import unsee`` (and the pure
reference system ``unsee.spec``) costs no torch import.

The package is one namespace over the project's top-level folders:

- ``unsee.spec``        (spec/)        pure reference transition system, no torch;
- ``unsee.impl``        (impl/)        the runtime, its engines, store, evaluation and CLI;
- ``unsee.properties``  (properties/)  Hypothesis strategies and properties;
- ``unsee.proofs``      (proofs/)      z3 proofs of the paper's statements;
- ``unsee.bench``       (bench/)       efficiency benchmarks.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    # engines
    "Engine": "unsee.impl.engines.protocol",
    "BACKENDS": "unsee.impl.engines.registry",
    "load_engine": "unsee.impl.engines.registry",
    "make_engine": "unsee.impl.engines.registry",
    # the agent runtime
    "AgentRuntime": "unsee.impl.agent.runtime",
    "RuntimeState": "unsee.impl.agent.state",
    "Extension": "unsee.impl.agent.extensions",
    "ForgetReport": "unsee.impl.agent.report",
    "Episode": "unsee.impl.agent.episode",
    "EpisodeError": "unsee.impl.agent.episode",
    "Item": "unsee.impl.agent.episode",
    "Settings": "unsee.impl.agent.episode",
    "Step": "unsee.impl.agent.episode",
    "load_episode": "unsee.impl.agent.episode",
    "parse_episode": "unsee.impl.agent.episode",
    "UnknownSourceError": "unsee.impl.agent.provenance",
    "SessionBusyError": "unsee.impl.util.exclusive",
    # tools
    "ToolAgentRuntime": "unsee.impl.agent.tools",
    "ToolLayer": "unsee.impl.agent.tools",
    "Environment": "unsee.impl.agent.tools",
    "Tool": "unsee.impl.agent.tools",
    "default_tools": "unsee.impl.agent.tools",
    # baselines
    "METHODS": "unsee.impl.methods.baselines",
    "apply_method": "unsee.impl.methods.baselines",
    # persistence and verification
    "PersistentSession": "unsee.impl.store.session",
    "SessionStore": "unsee.impl.store.sqlite",
    "StoreError": "unsee.impl.store.schema",
    "verify_store": "unsee.impl.store.verify",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on demand
    from unsee.impl.agent.episode import Episode, EpisodeError, Item, Settings, Step, load_episode, parse_episode
    from unsee.impl.agent.extensions import Extension
    from unsee.impl.agent.provenance import UnknownSourceError
    from unsee.impl.agent.report import ForgetReport
    from unsee.impl.agent.runtime import AgentRuntime
    from unsee.impl.agent.state import RuntimeState
    from unsee.impl.agent.tools import Environment, Tool, ToolAgentRuntime, ToolLayer, default_tools
    from unsee.impl.engines.protocol import Engine
    from unsee.impl.engines.registry import BACKENDS, load_engine, make_engine
    from unsee.impl.methods.baselines import METHODS, apply_method
    from unsee.impl.store.schema import StoreError
    from unsee.impl.store.session import PersistentSession
    from unsee.impl.store.sqlite import SessionStore
    from unsee.impl.store.verify import verify_store
    from unsee.impl.util.exclusive import SessionBusyError


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'unsee' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return __all__
