"""The pytest plugin (registered under ``pytest11`` as ``unsee``): run the
conformance contract inside another project's test suite.

``pytest --unsee-entry mypkg.adapter:answer`` (or ``--unsee-command "CMD
ARGS"``) adds one test, ``unsee-conform``, built on
:func:`~unsee.impl.conform.harness.conformance_test`: it checks a twentieth
of the active Hypothesis profile's ``max_examples`` (``--unsee-episodes N``
to say), and fails with the shrunk counterexample. Without either option
the plugin adds nothing.
"""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path

import pytest


def pytest_addoption(parser) -> None:
    group = parser.getgroup("unsee", "unsee conformance (docs/conformance.md)")
    group.addoption("--unsee-entry", metavar="MODULE:FUNCTION", default=None,
                    help="check this implementation of the unsee conformance contract")
    group.addoption("--unsee-command", metavar="CMD", default=None,
                    help="check this command (shell words) as an implementation of the contract")
    group.addoption("--unsee-episodes", type=int, default=None, metavar="N",
                    help="generated episodes (default: a twentieth of the Hypothesis profile's max_examples)")


def pytest_configure(config) -> None:
    entry, command = config.getoption("unsee_entry"), config.getoption("unsee_command")
    if entry and command:
        raise pytest.UsageError("--unsee-entry and --unsee-command: name one implementation")
    if command:
        import shutil

        words = shlex.split(command)
        if not words or shutil.which(words[0]) is None:
            raise pytest.UsageError(f"--unsee-command {command!r}: no command {words[0] if words else ''!r} found")
    if entry:
        from unsee.impl.conform.harness import ConformanceInputError, load_entry_point

        try:
            load_entry_point(entry)
        except ConformanceInputError as exc:
            raise pytest.UsageError(str(exc)) from None


class ConformanceItem(pytest.Item):
    """The one test the plugin adds."""

    def __init__(self, *, entry: str | None, command: list[str] | None, episodes: int | None, **kwargs):
        super().__init__(**kwargs)
        self.entry, self.command, self.episodes = entry, command, episodes

    def runtest(self) -> None:
        from unsee.impl.conform.harness import conformance_test

        test = conformance_test(command=self.command, entry=self.entry, examples=self.episodes)
        test(Path(tempfile.mkdtemp(prefix="unsee-conform-")))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, AssertionError):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"unsee-conform {self.entry or shlex.join(self.command)}"


def pytest_collection_modifyitems(session, config, items) -> None:
    entry, command = config.getoption("unsee_entry"), config.getoption("unsee_command")
    if not entry and not command:
        return
    items.append(ConformanceItem.from_parent(session, name="unsee-conform", entry=entry,
                                             command=shlex.split(command) if command else None,
                                             episodes=config.getoption("unsee_episodes")))
