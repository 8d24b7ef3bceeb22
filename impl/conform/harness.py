"""The conformance harness: check any implementation of execution-state
unlearning against the contract of docs/conformance.md.

An implementation under test is a command (``CMD ... --episode FILE --out
FILE [--forget SOURCE]``) or a Python entry point (``module:function``,
called as ``function(episode_path, forget)``); it answers one JSON object
(docs/conformance.schema.json). For each generated episode the harness asks
it twice:

1. the episode with a forget request for its target: the plain run, then a
   forget and the implementation's own full reset from that same state;
2. the counterfactual episode, written by the harness (the target's item
   removed where it entered, everything else verbatim: ``o^-z`` of the
   spec, :func:`unsee.spec.counterfactual_stream`), as an ordinary run.

and checks (:func:`check_answers`), with the statement each realises:

- ``tau``: the forget's tau is ``first_entry`` of the spec;
- ``boundary``: the restore boundary is the spec's
  ``get_restore_boundary`` over the checkpoints the episode's policy
  guarantees (:func:`get_policy_checkpoints`);
- ``invocations``: ``T - boundary`` (``replay_cost_is_suffix_length``,
  Corollary 1), and the reset's ``T``;
- ``forget = counterfactual``: the forget's per-turn tokens and state digest
  equal those of the plain run of the counterfactual episode
  (``splice_equals_counterfactual``, Theorem 1). The implementation cannot
  tell the second request is a counterfactual, so it cannot fake this; a
  constant digest still fails wherever the target changed any token;
- ``forget = own reset`` and the reset is the counterfactual too (never
  enough alone: an own reset can be wrong the same way as the forget, as in
  the shipped ``self-consistent`` adapter);
- ``prefix``: the counterfactual's turns before ``tau`` are the original's
  (``prefix_is_shared``, Lemma 1, on tokens);
- ``reference``: when the implementation declares our engine and a model
  we can load, its plain runs' tokens equal our runtime's.

Episodes come from the properties' strategy
(:func:`unsee.impl.conform.episodes.episode_jsons`) through Hypothesis, so a
failure shrinks to a minimal episode, written as a file that reruns it.
"""

from __future__ import annotations

import importlib
import json
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from unsee.impl.agent.episode import (
    MODEL_TURN_KINDS,
    OBSERVED_KINDS,
    Episode,
    Item,
    episode_to_json,
    load_episode,
    parse_episode,
)
from unsee.impl.conform.answers import (
    AnswerContractError,
    ConformanceInputError,
    ImplementationError,
    read_result,
)
from unsee.impl.conform.checks import (
    ANSWERED,
    BOUNDARY,
    DIGEST_BEFORE,
    FORGET_RESET_DIGEST,
    FORGET_RESET_TURNS,
    FORGET_TWIN_DIGEST,
    FORGET_TWIN_TURNS,
    INVOCATIONS,
    PREFIX,
    RESET_INVOCATIONS,
    RESET_TWIN_DIGEST,
    RESET_TWIN_TURNS,
    RUN_REFERENCE,
    TAU,
    TWIN_REFERENCE,
    TWIN_T,
    Check,
    T,
    check_aftermath,
    check_attended,
)
from unsee.impl.conform.contract import REFERENCE_ENGINE, REFERENCE_MODELS

# --- implementations -------------------------------------------------------------

class Implementation:
    """Something that answers a request (an episode file and an optional forget)."""

    def __call__(self, episode: Path, forget: str | None) -> dict:
        raise NotImplementedError

    def get_options(self) -> list[str]:
        """The ``unsee conform`` options that name this implementation again (for the rerun command)."""
        raise NotImplementedError


@attrs.frozen
class CommandImplementation(Implementation):
    """``argv + ["--episode", FILE, "--out", FILE] (+ ["--forget", SOURCE])``, exit 0, JSON in the out file."""

    argv: tuple[str, ...]
    timeout_s: float = 300.0

    def __call__(self, episode: Path, forget: str | None) -> dict:
        with tempfile.TemporaryDirectory(prefix="unsee-conform-") as tmp:
            out = Path(tmp) / "result.json"
            argv = [*self.argv, "--episode", str(episode), "--out", str(out)]
            if forget is not None:
                argv += ["--forget", forget]
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s, check=False)
            except subprocess.TimeoutExpired:
                raise ImplementationError(f"{shlex.join(argv)} ran past {self.timeout_s:g} s") from None
            except OSError as exc:  # not found, not executable: the harness was given a bad command
                raise ConformanceInputError(f"cannot run {self.argv[0]!r}: {exc.strerror or exc}") from None
            if done.returncode != 0:
                raise ImplementationError(f"{shlex.join(argv)} exited with {done.returncode}: "
                                          f"{done.stderr.strip()[-2000:]}")
            try:
                return json.loads(out.read_text(encoding="utf-8"))
            except FileNotFoundError:
                raise ImplementationError(f"{shlex.join(argv)} wrote no {out.name} (--out)") from None
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ImplementationError(f"{shlex.join(argv)} wrote invalid JSON: {exc}") from None

    def get_options(self) -> list[str]:
        return ["--", *self.argv]


@attrs.frozen
class EntryPointImplementation(Implementation):
    """``module:function``, called as ``function(str(episode_path), forget)`` and returning the result dict."""

    entry: str
    function: Callable[[str, str | None], dict] = attrs.field(eq=False, repr=False)

    def __call__(self, episode: Path, forget: str | None) -> dict:
        try:
            result = self.function(str(episode), forget)
        except Exception as exc:  # the implementation's failure, reported and shrunk like a wrong answer
            raise ImplementationError(f"{self.entry} raised {type(exc).__name__}: {exc}") from exc
        # a round trip through JSON: the entry point answers what a command would write
        try:
            return json.loads(json.dumps(result))
        except (TypeError, ValueError) as exc:
            raise ImplementationError(f"{self.entry} returned something that is not JSON: {exc}") from None

    def get_options(self) -> list[str]:
        return ["--entry", self.entry]


def load_entry_point(entry: str) -> EntryPointImplementation:
    """The implementation named ``module:function``; errors name what is missing."""
    module_name, sep, name = entry.partition(":")
    if not sep or not module_name or not name:
        raise ConformanceInputError(f"entry point {entry!r} must be 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConformanceInputError(f"entry point {entry!r}: cannot import {module_name!r} ({exc})") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ConformanceInputError(f"entry point {entry!r}: {module_name} has no function {name!r}")
    return EntryPointImplementation(entry, function)


# --- the counterfactual and the spec's numbers -------------------------------------------

def lift_observations(episode: Episode):
    """The episode's steps as spec observations (kind mapped onto the spec's,
    items as ``(source_id, value)``), for :mod:`unsee.spec`'s definitions."""
    from unsee.spec import Item as SpecItem
    from unsee.spec import Observation

    kinds = {"user": "user", "plan": "user", "memory": "memory", "tool": "tool"}
    return tuple(Observation(kinds.get(s.kind, "event"), tuple(SpecItem(i.source, i.text) for i in s.items))
                 for s in episode.steps)


def get_counterfactual_episode(episode: Episode, target: str) -> Episode:
    """``o^-z`` as an episode file: the spec's counterfactual stream
    (:func:`unsee.spec.counterfactual_stream`: the target's item removed at
    ``tau``, every other step verbatim; a step whose only item was the target
    stays, empty), with the same system prompt and settings and no target."""
    from unsee.spec import counterfactual_stream

    stream = counterfactual_stream(lift_observations(episode), target)
    steps = tuple(attrs.evolve(step, items=tuple(Item(i.source_id, i.value) for i in o.items))
                  for step, o in zip(episode.steps, stream, strict=True))
    return Episode(episode.system, steps, episode.settings, target=None, probes=())


def get_policy_checkpoints(episode: Episode) -> tuple[int, ...]:
    """The boundaries at which the episode's checkpoint policy guarantees a
    checkpoint (docs/episode-format.md): ``every_turn`` all of ``0..T``;
    ``before_injection`` 0 and ``t - 1`` before every step ``t`` that brings
    external content in; ``session_start`` 0 alone."""
    policy, length = episode.settings.checkpoint_policy, len(episode.steps)
    if policy == "every_turn":
        return tuple(range(length + 1))
    if policy == "before_injection":
        return (0,) + tuple(t - 1 for t, s in enumerate(episode.steps, start=1) if s.kind in OBSERVED_KINDS and t > 1)
    return (0,)


@attrs.frozen
class Expected:
    """What the spec says of one forget request."""

    length: int  # T
    tau: int
    boundary: int
    turn_steps: tuple[str, ...]  # the step ids with a model turn
    prefix_steps: tuple[str, ...]  # those of them before tau
    values: tuple[str, ...] = ()  # the target's texts, which no kept byte may hold after the forget
    calls_tools: bool = False  # a plan step names a tool (the effects check applies)
    later_steps: tuple[str, ...] = ()  # the steps after tau with a model turn (they attended to the target)
    later: bool = False  # a step follows tau
    @classmethod
    def of(cls, episode: Episode, target: str) -> Expected:
        from unsee.spec import first_entry, get_restore_boundary

        tau = first_entry(lift_observations(episode), target)
        turns = [(t, s.id) for t, s in enumerate(episode.steps, start=1) if s.kind in MODEL_TURN_KINDS]
        values = {i.text for s in episode.steps for i in s.items if i.source == target and i.text}
        if episode.target is not None and episode.target.value:
            values.add(episode.target.value)
        return cls(len(episode.steps), tau, get_restore_boundary(get_policy_checkpoints(episode), tau),
                   tuple(s for _, s in turns), tuple(s for t, s in turns if t < tau), tuple(sorted(values)),
                   any(s.kind == "plan" and s.tool for s in episode.steps), tuple(s for t, s in turns if t > tau),
                   tau < len(episode.steps))


# --- the checks -------------------------------------------------------------------

def check_answers(expected: Expected, answer: dict, counterfactual: dict,
                  reference: tuple[dict, dict] | None = None, names: Sequence[str] | None = None) -> list[Check]:
    """Every check of one episode (see the module docstring). ``answer`` is
    the forget request's result, ``counterfactual`` the plain run of the
    counterfactual episode, ``reference`` our runtime's turns for both plain
    runs (when the implementation declares our engine and model); ``names``
    the checks a pinned suite version holds (default: all)."""
    run, forget, reset, twin = answer["run"], answer["forget"], answer["reset"], counterfactual["run"]
    before_tau = expected.prefix_steps
    checks = [
        Check(T, run["T"], expected.length),
        Check(TWIN_T, twin["T"], expected.length),
        Check(TAU, forget["tau"], expected.tau),
        Check(BOUNDARY, forget["boundary"], expected.boundary),
        Check(INVOCATIONS, forget["invocations"],
              expected.length - forget["boundary"]),
        Check(RESET_INVOCATIONS, reset["invocations"], expected.length),
        Check(DIGEST_BEFORE, [forget["digest_before"], reset["digest_before"]],
              [run["digest"], run["digest"]]),
        Check(FORGET_TWIN_TURNS, forget["turns"], twin["turns"]),
        Check(FORGET_TWIN_DIGEST, forget["digest_after"], twin["digest"]),
        Check(FORGET_RESET_TURNS, forget["turns"], reset["turns"]),
        Check(FORGET_RESET_DIGEST, forget["digest_after"], reset["digest_after"]),
        Check(RESET_TWIN_TURNS, reset["turns"], twin["turns"]),
        Check(RESET_TWIN_DIGEST, reset["digest_after"], twin["digest"]),
        Check(PREFIX, {s: twin["turns"][s] for s in before_tau},
              {s: run["turns"][s] for s in before_tau}),
    ]
    checks += check_aftermath(answer, counterfactual, list(expected.values), expected.calls_tools)
    if reference is not None:
        checks += [Check(RUN_REFERENCE, run["turns"], reference[0]),
                   Check(TWIN_REFERENCE, twin["turns"], reference[1])]
    checks += check_attended(run, forget, twin, expected.later_steps, expected.later)
    return [c for c in checks if names is None or c.name in names]


# --- one episode ----------------------------------------------------------------------

@attrs.frozen
class Failure:
    """Why one episode failed: the failed checks, or the implementation's error."""

    episode: Episode
    checks: tuple[Check, ...] = ()
    error: str | None = None
    answers: dict = attrs.field(factory=dict)  # what the implementation answered, by request

    def get_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.checks) if self.error is None else (ANSWERED,)

    def describe(self) -> str:
        if self.error is not None:
            return f"  the implementation did not answer: {self.error}"
        return "\n".join(f"  FAILED {c.describe()}" for c in self.checks)


@attrs.frozen
class Record:
    """One episode checked: every check (passed, failed or N/A), or the
    implementation's error, and its answers (what a report lists)."""

    episode: Episode
    checks: tuple[Check, ...] = ()
    error: str | None = None
    answers: dict = attrs.field(factory=dict)


class Harness:
    """Runs episodes through one implementation and checks its answers.

    ``workdir`` holds the episode files the implementation is asked to read.
    ``reference``: compare tokens with our runtime when the implementation
    declares :data:`REFERENCE_ENGINE` and a model of :data:`REFERENCE_MODELS`.
    """

    def __init__(self, implementation: Implementation, workdir: Path, reference: bool = True):
        self.implementation = implementation
        self.workdir = Path(workdir)
        self.reference = reference
        self.records: list[Record] = []  # every episode checked, in order

    def check_episode(self, episode: Episode) -> Failure | None:
        """Ask the forget request and the counterfactual run; None when every check holds."""
        if episode.target is None:
            raise ConformanceInputError("the episode names no target (its 'target.source' is what is forgotten)")
        target = episode.target.source
        expected = Expected.of(episode, target)
        original = self._write("episode.json", episode)
        counterfactual = self._write("run.json", get_counterfactual_episode(episode, target))
        answers: dict = {}
        try:
            answers["forget request"] = answer = read_result(
                self.implementation(original, target), expected.turn_steps, target)
            answers["counterfactual run"] = twin = read_result(
                self.implementation(counterfactual, None), expected.turn_steps, None)
        except ImplementationError as exc:
            self.records.append(Record(episode, error=str(exc), answers=answers))
            return Failure(episode, error=str(exc), answers=answers)
        reference = self._get_reference(answer, twin, original, counterfactual)
        checks = tuple(check_answers(expected, answer, twin, reference))
        self.records.append(Record(episode, checks, answers=answers))
        failed = tuple(c for c in checks if not c.ok)
        return Failure(episode, failed, answers=answers) if failed else None

    def _write(self, name: str, episode: Episode) -> Path:
        path = self.workdir / name
        path.write_text(json.dumps(episode_to_json(episode), indent=1), encoding="utf-8")
        return path

    def _get_reference(self, answer: dict, twin: dict, original: Path, counterfactual: Path):
        declared = {(a["implementation"]["engine"], a["implementation"]["model"]) for a in (answer, twin)}
        if not self.reference or len(declared) != 1:
            return None
        engine, model = declared.pop()
        if engine != REFERENCE_ENGINE or model not in REFERENCE_MODELS:
            return None
        from unsee.impl.conform.adapters import get_reference_turns  # the adapters import this module's constants

        return get_reference_turns(str(original), model), get_reference_turns(str(counterfactual), model)


# --- the search --------------------------------------------------------------------------

@attrs.frozen
class Rerun:
    """The failed episode asked again: where the answers differed (None: every
    field but ``kept`` repeated), and whether a check failed again."""

    differs: str | None
    failed_again: bool

    def describe(self) -> str:
        if self.differs is not None:
            return (f"a rerun of the same episode answered differently {self.differs}: the implementation is "
                    "not deterministic, which the contract requires")
        if self.failed_again:
            return "a rerun of the same episode answered the same and failed again"
        return ("the failure did not repeat on a rerun of the same episode, whose answers agreed in every field "
                "but the kept bytes: the finding stands for the run that made it, and what differs between the "
                "runs is what the implementation kept")


@attrs.frozen
class Outcome:
    """What a conformance run found: pass, or the shrunk failure and where it was written."""

    implementation: Implementation
    examples: int  # episodes checked (shrinking included)
    failure: Failure | None = None
    counterexample: Path | None = None
    answers: Path | None = None
    rerun: Rerun | None = None  # the failed episode asked again, where the failure did not repeat
    records: tuple[Record, ...] = ()  # every episode checked (the reports list them)

    @property
    def flaky(self) -> bool:
        """A rerun of the failed episode answered differently."""
        return self.rerun is not None and self.rerun.differs is not None

    @property
    def passed(self) -> bool:
        return self.failure is None

    def get_rerun(self) -> str:
        return shlex.join(["unsee", "conform", "--episode", str(self.counterexample),
                           *self.implementation.get_options()])

    def describe(self) -> str:
        if self.passed:
            return f"CONFORMS: {self.examples} episode(s) checked, every check held"
        episode = self.failure.episode
        tau = Expected.of(episode, episode.target.source).tau
        lines = [f"REJECTED after {self.examples} episode(s); the shrunk counterexample has T = "
                 f"{len(episode.steps)}, tau = {tau} (target {episode.target.source!r} in a "
                 f"{episode.steps[tau - 1].kind} step, policy {episode.settings.checkpoint_policy}):",
                 self.failure.describe()]
        if self.rerun is not None:
            lines.append(f"  ({self.rerun.describe()})")
        lines += [f"counterexample  {self.counterexample}",
                  json.dumps(episode_to_json(episode), sort_keys=True),
                  f"answers         {self.answers}", f"rerun           {self.get_rerun()}"]
        return "\n".join(lines)


class _Rejected(AssertionError):
    """Raised inside the Hypothesis test so that it shrinks the episode."""


def write_failure(failure: Failure, out: Path) -> tuple[Path, Path]:
    """The counterexample as an episode file that reruns it, and beside it
    the implementation's answers and the failed checks."""
    out.mkdir(parents=True, exist_ok=True)
    episode = out / "counterexample.json"
    episode.write_text(json.dumps(episode_to_json(failure.episode), indent=1) + "\n", encoding="utf-8")
    answers = out / "counterexample.answers.json"
    answers.write_text(json.dumps({"failed": [attrs.asdict(c) for c in failure.checks], "error": failure.error,
                                   "answers": failure.answers}, indent=1) + "\n", encoding="utf-8")
    return episode, answers


def search(implementation: Implementation, out: Path, examples: int = 10, max_steps: int = 6,
           seed: int | None = None, derandomize: bool = True, reference: bool = True) -> Outcome:
    """Check ``examples`` generated episodes (1..``max_steps`` steps); on a
    failure Hypothesis shrinks the episode, and the minimal one is written to
    ``out`` (:func:`write_failure`). ``seed`` (or ``derandomize``) makes the
    search repeatable."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as use_seed

    from unsee.impl.conform.episodes import episode_jsons

    if examples < 1 or max_steps < 1:
        raise ConformanceInputError(f"examples ({examples}) and max_steps ({max_steps}) must be at least 1")
    failures: list[Failure] = []
    refused: list[AnswerContractError] = []
    count = 0
    with tempfile.TemporaryDirectory(prefix="unsee-conform-") as tmp:
        harness = Harness(implementation, Path(tmp), reference)

        @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize and seed is None,
                  phases=(Phase.generate, Phase.shrink), verbosity=Verbosity.quiet, print_blob=False,
                  suppress_health_check=list(HealthCheck))
        @given(episode_jsons(1, max_steps))
        def conforms(raw: dict) -> None:
            nonlocal count
            if refused:  # an answer the contract cannot read ends the search: nothing to shrink
                return
            count += 1
            try:
                failure = harness.check_episode(parse_episode(raw))
            except AnswerContractError as exc:
                refused.append(exc)
                return
            if failure is not None:
                failures.append(failure)
                raise _Rejected(failure.describe())

        if seed is not None:
            conforms = use_seed(seed)(conforms)
        try:
            conforms()
        except ConformanceInputError:
            raise
        except Exception as exc:  # _Rejected, or Hypothesis's report that a failure did not repeat
            if refused:
                raise refused[0] from None
            if not failures:
                raise
            rerun = None if isinstance(exc, _Rejected) else rerun_failure(harness, failures[-1])
            episode, answers = write_failure(failures[-1], out)
            return Outcome(implementation, count, failures[-1], episode, answers, rerun, tuple(harness.records))
        if refused:
            raise refused[0]
    return Outcome(implementation, count, records=tuple(harness.records))


def get_rerun_difference(first: Any, again: Any, path: str = "") -> str | None:
    """The first field where two answers to the same requests differ, ``kept``
    aside (an implementation may keep a random id; the contract requires its
    state, tokens and counts to repeat, not its bytes), or None."""
    if isinstance(first, dict) and isinstance(again, dict):
        for key in sorted(set(first) | set(again)):
            if key == "kept":
                continue
            where = f"{path}.{key}" if path else key
            if key not in first or key not in again:
                return where
            found = get_rerun_difference(first[key], again[key], where)
            if found is not None:
                return found
        return None
    return None if first == again else (path or "the answer")


def rerun_failure(harness: Harness, failure: Failure) -> Rerun:
    """Ask the failed episode again (Hypothesis saw the failure not repeat):
    the implementation is called non-deterministic only where the rerun's
    answers differ from the failure's."""
    again = harness.check_episode(failure.episode)
    answers = harness.records[-1].answers
    if failure.error is not None or (again is not None and again.error is not None):
        same = again is not None and again.error == failure.error
        differs = None if same else "(one run did not answer, the other did, or not the same way)"
    else:
        field = get_rerun_difference(failure.answers, answers)
        differs = None if field is None else f"at `{field}`"
    return Rerun(differs, again is not None)


def check_file(implementation: Implementation, episode_path: str | Path, out: Path,
               reference: bool = True) -> Outcome:
    """Rerun one episode file (a counterexample) without a search."""
    episode = load_episode(episode_path)
    with tempfile.TemporaryDirectory(prefix="unsee-conform-") as tmp:
        harness = Harness(implementation, Path(tmp), reference)
        failure = harness.check_episode(episode)
    if failure is None:
        return Outcome(implementation, 1, records=tuple(harness.records))
    written, answers = write_failure(failure, out)
    return Outcome(implementation, 1, failure, written, answers, records=tuple(harness.records))


# --- the pytest entry point -----------------------------------------------------------

def make_implementation(command: Sequence[str] | None = None, entry: str | None = None,
                        timeout_s: float = 300.0) -> Implementation:
    """A command or an entry point (exactly one)."""
    if bool(command) == bool(entry):
        raise ConformanceInputError("name the implementation by a command after '--' or by --entry "
                                    "module:function (exactly one)")
    return CommandImplementation(tuple(command), timeout_s) if command else load_entry_point(entry)


def conformance_test(command: Sequence[str] | None = None, entry: str | None = None, examples: int | None = None,
                     max_steps: int = 6, reference: bool = True) -> Callable[[Path], None]:
    """A pytest test that checks an implementation; put it in a test module:

    ``test_my_runtime = conformance_test(entry="mypkg.unsee_adapter:answer")``

    It takes ``examples`` episodes (default: a twentieth of the active
    Hypothesis profile's ``max_examples``, at least 2: ci 3, nightly 100),
    derandomized when the profile
    is, and fails with the shrunk counterexample's description (the file is
    written under pytest's ``tmp_path``)."""

    def test_conforms(tmp_path: Path) -> None:
        from hypothesis import settings

        active = settings()
        count = examples if examples is not None else max(2, active.max_examples // 20)
        try:
            outcome = search(make_implementation(command, entry), tmp_path, count, max_steps,
                             derandomize=active.derandomize, reference=reference)
        except AnswerContractError as exc:  # the message `unsee conform` exits 2 with
            raise AssertionError(f"error: {exc}") from None
        assert outcome.passed, outcome.describe()

    return test_conforms
