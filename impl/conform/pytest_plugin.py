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
    group.addoption("--unsee-suite-version", metavar="X.Y.Z", default=None,
                    help="instead of generated episodes: release X.Y.Z's vectors, judged by its checks")
    group.addoption("--unsee-baseline", metavar="FILE", default=None,
                    help="with --unsee-suite-version: expected failures (YAML or JSON), as unsee conform --baseline")


def pytest_configure(config) -> None:
    entry, command = config.getoption("unsee_entry"), config.getoption("unsee_command")
    if entry and command:
        raise pytest.UsageError("--unsee-entry and --unsee-command: name one implementation")
    if command:
        import shutil

        words = shlex.split(command)
        if not words or shutil.which(words[0]) is None:
            raise pytest.UsageError(f"--unsee-command {command!r}: no command {words[0] if words else ''!r} found")
    suite, baseline = config.getoption("unsee_suite_version"), config.getoption("unsee_baseline")
    if suite or baseline:
        from unsee.impl.conform.harness import ConformanceInputError
        from unsee.impl.conform.result import read_baseline
        from unsee.impl.conform.suite import get_release

        try:
            if baseline and not suite:
                raise ConformanceInputError("--unsee-baseline: name the release it is for with --unsee-suite-version")
            get_release(suite)
            if baseline:
                read_baseline(Path(baseline), suite)
        except ConformanceInputError as exc:
            raise pytest.UsageError(str(exc)) from None
    if entry:
        from unsee.impl.conform.harness import ConformanceInputError, load_entry_point

        try:
            load_entry_point(entry)
        except ConformanceInputError as exc:
            raise pytest.UsageError(str(exc)) from None


class ConformanceItem(pytest.Item):
    """The one test the plugin adds."""

    def __init__(self, *, entry: str | None, command: list[str] | None, episodes: int | None,
                 suite: str | None = None, baseline: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.entry, self.command, self.episodes = entry, command, episodes
        self.suite, self.baseline = suite, baseline

    def runtest(self) -> None:
        from unsee.impl.conform.harness import conformance_test

        out = Path(tempfile.mkdtemp(prefix="unsee-conform-"))
        if self.suite is not None:
            return self.run_release(out)
        test = conformance_test(command=self.command, entry=self.entry, examples=self.episodes)
        test(out)

    def run_release(self, out: Path) -> None:
        """Release ``suite``'s vectors, the tier and the baseline as ``unsee conform --suite-version`` judges them;
        result.json and badge.svg are written under ``out`` (named in the report)."""
        from unsee.impl.conform.ci import judge_run
        from unsee.impl.conform.harness import make_implementation
        from unsee.impl.conform.result import read_baseline
        from unsee.impl.conform.suite import get_suite_dir
        from unsee.impl.conform.vectors import check_vectors, read_manifest

        vectors = get_suite_dir(self.suite)
        baseline = read_baseline(Path(self.baseline), self.suite) if self.baseline else None
        run = check_vectors(make_implementation(self.command, self.entry), vectors, out / "cases")
        verdict = judge_run(run, self.suite, "vectors", out, baseline, vectors=vectors, manifest=read_manifest(vectors))
        self.user_properties.append(("unsee-tier", verdict.result["tier"]))
        if not verdict.passed:
            raise AssertionError(f"{run.describe()}\n{verdict.text}")

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
                                             episodes=config.getoption("unsee_episodes"),
                                             suite=config.getoption("unsee_suite_version"),
                                             baseline=config.getoption("unsee_baseline")))
