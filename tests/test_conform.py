"""The conformance harness (impl/conform/harness.py, docs/conformance.md): our runtime
conforms, the three broken adapters are rejected with shrunk counterexamples
that rerun, through both the Python entry point and the command path; the
``self-consistent`` one only by the comparison with the counterfactual run."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given

from unsee.impl.agent.episode import episode_to_json, load_episode, parse_episode
from unsee.impl.cli.main import main
from unsee.impl.conform.adapters import ADAPTERS as SHIPPED
from unsee.impl.conform.adapters import redaction, reference, self_consistent
from unsee.impl.conform.answers import AnswerContractError
from unsee.impl.conform.checks import (
    ANSWERED,
    CHECKS,
    COUNT_CHECKS,
    RESIDUE,
    RUN_REFERENCE,
    STATE_CHECKS,
    TWIN_REFERENCE,
    Check,
)
from unsee.impl.conform.contract import CONTRACT, CONTRACT_VERSION
from unsee.impl.conform.episodes import TARGET, episode_jsons
from unsee.impl.conform.harness import (
    CommandImplementation,
    ConformanceInputError,
    EntryPointImplementation,
    Expected,
    Harness,
    ImplementationError,
    check_answers,
    check_file,
    conformance_test,
    get_counterfactual_episode,
    get_policy_checkpoints,
    load_entry_point,
    read_result,
    search,
)
from unsee.properties.differential import get_counterfactual_steps

ADAPTERS = "unsee.impl.conform.adapters"


def episode_json(steps, policy="every_turn", temperature=0.0, max_new_tokens=2, system="Be brief."):
    return {"format": "unsee.episode", "version": 2, "system": system,
            "settings": {"max_new_tokens": max_new_tokens, "temperature": temperature, "seed": 0,
                         "checkpoint_policy": policy},
            "steps": steps, "target": {"source": "secret", "value": "4417 Elm"}}


ONE_STEP = episode_json([{"id": "t1", "kind": "user", "source": "secret", "text": "4417 Elm"}])
#: Found by the harness: on the tiny model the target changes the third
#: sampled token of this turn, so the tokens alone tell a faked forget apart.
TOKENS_DIFFER = episode_json([{"id": "t1", "kind": "user", "source": "secret", "text": "4417 Elm"}],
                             temperature=0.7, max_new_tokens=3, system="You are a helpful agent.")


def write(tmp_path: Path, raw: dict, name: str = "episode.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(raw), encoding="utf-8")
    return path


# --- the pieces, without a model -----------------------------------------------------

def test_counterfactual_episode_is_the_specs_stream_written_as_a_file():
    episode = parse_episode(episode_json([
        {"id": "t1", "kind": "user", "text": "hi"},
        {"id": "t2", "kind": "memory", "records": [{"source": "secret", "text": "4417 Elm"}]},
        {"id": "t3", "kind": "tool", "fields": [{"source": "t3.0", "text": "tea"}, {"source": "x", "text": "Oak"}]},
        {"id": "t4", "kind": "plan", "text": "pay Bob"}, {"id": "t5", "kind": "compact"}]))
    twin = get_counterfactual_episode(episode, "secret")
    assert [[i.source for i in s.items] for s in twin.steps] == [["t1"], [], ["t3.0", "x"], ["t4"], []]
    assert (twin.target, twin.settings, twin.system) == (None, episode.settings, episode.system)
    assert [(s.id, s.kind, s.tool) for s in twin.steps] == [(s.id, s.kind, s.tool) for s in episode.steps]
    written = episode_to_json(twin)
    assert written["version"] == 3 and written["steps"][1]["records"] == []
    assert parse_episode(json.loads(json.dumps(written))) == twin
    # a plan step whose only item was the target stays, empty: "text": null
    plan = parse_episode(episode_json([{"id": "t1", "kind": "plan", "source": "secret", "text": "4417 Elm"}]))
    assert episode_to_json(get_counterfactual_episode(plan, "secret"))["steps"][0] == {
        "id": "t1", "kind": "plan", "text": None, "tool": "send_message"}


@given(raw=episode_jsons(1, 8))
def test_the_counterfactual_file_is_the_stream_the_runtime_forgets_to(raw):
    """The harness's counterfactual (from the spec's ``counterfactual_stream``)
    is the runtime's sanitized stream, and survives being written as a file."""
    episode = parse_episode(raw)
    twin = get_counterfactual_episode(episode, TARGET)
    assert list(twin.steps) == get_counterfactual_steps(episode.steps, TARGET)
    assert parse_episode(json.loads(json.dumps(episode_to_json(twin)))) == twin


@pytest.mark.parametrize("policy, checkpoints, boundary", [("every_turn", (0, 1, 2, 3, 4), 2),
                                                           ("before_injection", (0, 1, 2), 2),
                                                           ("session_start", (0,), 0)])
def test_policy_checkpoints_and_the_spec_boundary(policy, checkpoints, boundary):
    episode = parse_episode(episode_json([
        {"id": "t1", "kind": "user", "text": "hi"}, {"id": "t2", "kind": "tool", "text": "tea"},
        {"id": "t3", "kind": "user", "source": "secret", "text": "4417 Elm"}, {"id": "t4", "kind": "session"}],
        policy=policy))
    assert get_policy_checkpoints(episode) == checkpoints
    expected = Expected.of(episode, "secret")
    assert (expected.length, expected.tau, expected.boundary) == (4, 3, boundary)
    assert (expected.turn_steps, expected.prefix_steps) == (("t1", "t2", "t3"), ("t1", "t2"))


SCHEMA = Path(__file__).resolve().parents[1] / "docs" / "conformance.schema.json"


def get_required_paths(schema: dict, prefix: str = "") -> list[str]:
    """Every required field of the schema, as a dotted path."""
    paths = []
    for key in schema.get("required", ()):
        path = f"{prefix}{key}"
        paths.append(path)
        paths += get_required_paths(schema["properties"][key], f"{path}.")
    for key in ("forget", "reset"):  # required when a forget was requested
        if not prefix:
            paths.append(key)
            paths += get_required_paths(schema["properties"][key], f"{key}.")
    return paths


def test_a_check_is_named_by_a_constant_and_the_scorecard_reads_them():
    from unsee.impl.conform.scorecard import COLUMNS

    assert {n for names in COLUMNS.values() for n in names} <= set(CHECKS)
    with pytest.raises(ValueError, match="must be in"):
        Check("a label no constant names", 1, 1)


def test_the_schema_and_the_checker_require_the_same_fields(tmp_path):
    schema = json.loads(SCHEMA.read_text())
    assert (schema["properties"]["contract"]["const"], schema["properties"]["version"]["const"]) == (
        CONTRACT, CONTRACT_VERSION)
    answer = reference(str(write(tmp_path, ONE_STEP)), "secret")
    assert read_result(answer, ("t1",), "secret") == answer
    episode = parse_episode(ONE_STEP)
    twin = reference(str(write(tmp_path, episode_to_json(get_counterfactual_episode(episode, "secret")), "cf.json")))
    checks = check_answers(Expected.of(episode, "secret"), answer, twin)
    assert all(c.ok for c in checks)
    assert set(STATE_CHECKS) | set(COUNT_CHECKS) <= {c.name for c in checks}  # the names the tests filter on
    assert [c.name for c in checks] == [n for n in CHECKS if n not in (RUN_REFERENCE, TWIN_REFERENCE)]  # report order
    paths = get_required_paths(schema)
    assert len(paths) == 4 + 3 + 3 + 1 + 7 + 1 + 4
    for path in paths:
        broken = json.loads(json.dumps(answer))
        *parents, last = path.split(".")
        node = broken
        for key in parents:
            node = node[key]
        del node[last]
        refused = AnswerContractError if path == "version" else ImplementationError
        with pytest.raises(refused, match=rf"result ({re.escape(path)}|contract/version)\b"):
            read_result(broken, ("t1",), "secret")


def junk(episode: str, forget: str | None = None) -> dict:
    return {"contract": "unsee.conformance", "version": 2, "run": {}}


def test_a_malformed_answer_is_a_failure_that_names_the_field(tmp_path):
    harness = Harness(EntryPointImplementation("tests:junk", junk), tmp_path)
    failure = harness.check_episode(parse_episode(ONE_STEP))
    assert failure.get_names() == (ANSWERED,)
    assert "result implementation: must be an object" in failure.error


def test_a_command_that_fails_is_a_failure_and_a_missing_one_is_bad_input(tmp_path):
    exits = CommandImplementation((sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"))
    failure = Harness(exits, tmp_path).check_episode(parse_episode(ONE_STEP))
    assert "exited with 3: boom" in failure.error and "--forget secret" in failure.error
    silent = CommandImplementation((sys.executable, "-c", "pass"))
    assert "wrote no result.json (--out)" in Harness(silent, tmp_path).check_episode(parse_episode(ONE_STEP)).error
    with pytest.raises(ConformanceInputError, match="cannot run 'no-such-unsee-command': No such file"):
        Harness(CommandImplementation(("no-such-unsee-command",)), tmp_path).check_episode(parse_episode(ONE_STEP))


def test_bad_implementation_names_are_refused_by_name(capsys):
    with pytest.raises(ConformanceInputError, match="must be 'module:function'"):
        load_entry_point("nocolon")
    with pytest.raises(ConformanceInputError, match="has no function 'nope'"):
        load_entry_point(f"{ADAPTERS}:nope")
    assert main(["conform", "--episodes", "1"]) == 2
    assert "exactly one" in capsys.readouterr().err


# --- the four adapters -----------------------------------------------------------------

#: The pytest entry point, as a user would write it for their own runtime.
test_reference_conforms = conformance_test(entry=f"{ADAPTERS}:reference")


def assert_rejected_and_reruns(outcome, tmp_path):
    """Rejected, shrunk to the one-step minimum, and the written file reruns to the same failure."""
    assert not outcome.passed
    episode = load_episode(outcome.counterexample)
    assert episode == outcome.failure.episode and len(episode.steps) == 1
    assert "rerun           unsee conform --episode" in outcome.describe()
    again = check_file(outcome.implementation, outcome.counterexample, tmp_path / "again")
    assert again.failure.get_names() == outcome.failure.get_names()
    return set(outcome.failure.get_names())


def test_memory_delete_is_rejected_with_a_shrunk_counterexample(tmp_path):
    outcome = search(load_entry_point(f"{ADAPTERS}:memory"), tmp_path, examples=4)
    failed = assert_rejected_and_reruns(outcome, tmp_path)
    assert "forget = counterfactual: digest" in failed


def test_source_redaction_reports_correct_counts_and_is_rejected_on_state(tmp_path):
    outcome = search(load_entry_point(f"{ADAPTERS}:redaction"), tmp_path, examples=4)
    failed = assert_rejected_and_reruns(outcome, tmp_path)
    assert failed and failed <= set(STATE_CHECKS), failed  # every count check held
    assert not failed & set(COUNT_CHECKS)


#: The checks that compare with the plain run of the counterfactual episode.
COUNTERFACTUAL_CHECKS = ("forget = counterfactual: turns", "forget = counterfactual: digest",
                         "reset = counterfactual: turns", "reset = counterfactual: digest")


def test_self_consistent_forget_is_its_own_reset_and_not_the_counterfactual(tmp_path):
    """The premise of the third broken adapter: its forget equals its own
    reset exactly and every count is right, yet its state is not the
    counterfactual run's (the forget log stays in context)."""
    episode = parse_episode(ONE_STEP)
    answer = self_consistent(str(write(tmp_path, ONE_STEP)), "secret")
    twin = self_consistent(str(write(tmp_path, episode_to_json(get_counterfactual_episode(episode, "secret")),
                                     "cf.json")))
    forget, reset = answer["forget"], answer["reset"]
    assert (forget["turns"], forget["digest_after"]) == (reset["turns"], reset["digest_after"])
    assert forget["turns"] == twin["run"]["turns"] and forget["digest_after"] != twin["run"]["digest"]
    assert SHIPPED["self-consistent"] is self_consistent
    failed = {c.name for c in check_answers(Expected.of(episode, "secret"), answer, twin)
              if not c.ok}
    assert failed == {"forget = counterfactual: digest", "reset = counterfactual: digest"}


def test_cli_rejects_self_consistent_on_the_counterfactual_alone(tmp_path, capsys):
    """``unsee conform --entry ...:self_consistent`` on generated episodes:
    rejected with a shrunk counterexample that reruns, and what failed is
    the comparison with the counterfactual run, never with its own reset."""
    out = tmp_path / "rejected"
    entry = f"{ADAPTERS}:self_consistent"
    assert main(["conform", "--entry", entry, "--episodes", "3", "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert printed.startswith("REJECTED") and "FAILED forget = counterfactual: digest" in printed
    assert "FAILED forget = own reset" not in printed
    answers = json.loads((out / "counterexample.answers.json").read_text())
    failed = {c["name"] for c in answers["failed"]}
    assert "forget = counterfactual: digest" in failed and failed <= set(COUNTERFACTUAL_CHECKS), failed
    counterexample = load_episode(out / "counterexample.json")
    assert len(counterexample.steps) == 1  # shrunk to the smallest episode there is
    # the written file reruns to the same failure, through the CLI
    assert main(["conform", "--episode", str(out / "counterexample.json"), "--entry", entry,
                 "--out", str(tmp_path / "again")]) == 1
    assert {c["name"] for c in json.loads((tmp_path / "again" / "counterexample.answers.json").read_text())[
        "failed"]} == failed


def constant_digest(episode: str, forget: str | None = None) -> dict:
    """B3 that also hides its state behind one constant digest."""
    out = redaction(episode, forget)
    for part in ("run", "forget", "reset"):
        for key in ("digest", "digest_before", "digest_after"):
            if key in out.get(part, {}):
                out[part][key] = "constant"
    return out


def test_a_constant_digest_is_caught_by_the_tokens(tmp_path):
    path = write(tmp_path, TOKENS_DIFFER)
    twin = write(tmp_path, episode_to_json(get_counterfactual_episode(parse_episode(TOKENS_DIFFER), "secret")),
                 "twin.json")
    # the premise: on this episode the target changes a token of our runtime's turn
    assert reference(str(path))["run"]["turns"] != reference(str(twin))["run"]["turns"]
    outcome = check_file(EntryPointImplementation("tests:constant_digest", constant_digest), path, tmp_path / "out")
    assert {"forget = counterfactual: turns", "forget = own reset: turns"} <= set(outcome.failure.get_names())


def test_an_implementation_that_answers_differently_is_called_flaky(tmp_path):
    calls = []

    def sometimes_junk(episode: str, forget: str | None = None) -> dict:
        calls.append(episode)
        return junk(episode, forget) if len(calls) == 1 else reference(episode, forget)

    outcome = search(EntryPointImplementation("tests:sometimes_junk", sometimes_junk), tmp_path, examples=2)
    assert outcome.flaky and not outcome.passed
    assert outcome.failure.get_names() == (ANSWERED,)
    assert "is not deterministic, which the contract requires" in outcome.describe()
    assert "answered differently (one run did not answer, the other did" in outcome.describe()


def test_a_failure_that_does_not_repeat_is_not_called_non_deterministic(tmp_path):
    """Issue 37: the store's random id held the secret's digits once, and the
    report blamed determinism. A rerun whose answers agree in every field but
    ``kept`` is reported as a failure that did not repeat."""
    calls = []

    def kept_once(episode: str, forget: str | None = None) -> dict:
        calls.append(episode)
        out = reference(episode, forget)
        if len(calls) == 1:  # the first answer keeps a note of the target; none after
            out["forget"]["kept"].append({"name": "scratch", "text": "noted: 4417 Elm"})
        return out

    outcome = search(EntryPointImplementation("tests:kept_once", kept_once), tmp_path, examples=2)
    assert not outcome.passed and not outcome.flaky and outcome.failure.get_names() == (RESIDUE,)
    assert "scratch at byte 7" in outcome.describe() and "not deterministic" not in outcome.describe()
    assert "the failure did not repeat on a rerun of the same episode" in outcome.describe()


# --- through the CLI: the command path and the entry point ------------------------------------------

def test_command_path_passes_the_reference(tmp_path, capsys):
    """The contract's argv, a subprocess per request (each one imports torch,
    so one episode: the counterfactual file it reads is version 3)."""
    path = write(tmp_path, ONE_STEP)
    command = [sys.executable, "-m", ADAPTERS, "reference", "--model", "tiny"]
    assert main(["conform", "--episode", str(path), "--out", str(tmp_path / "out"), "--", *command]) == 0
    assert capsys.readouterr().out.startswith("CONFORMS: 1 episode(s) checked")
    # nothing written when it conforms but the run's result and badge (no counterexample)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["badge.svg", "result.json"]


def test_cli_rejects_redaction_and_prints_the_rerun(tmp_path, capsys):
    path = write(tmp_path, ONE_STEP)
    out = tmp_path / "rejected"
    entry = f"{ADAPTERS}:redaction"
    assert main(["conform", "--episode", str(path), "--out", str(out), "--entry", entry]) == 1
    printed = capsys.readouterr().out
    assert "FAILED forget = counterfactual: digest" in printed
    assert f"rerun           unsee conform --episode {out / 'counterexample.json'} --entry {entry}" in printed
    assert load_episode(out / "counterexample.json") == parse_episode(ONE_STEP)
    answers = json.loads((out / "counterexample.answers.json").read_text())
    assert answers["answers"]["forget request"]["implementation"]["name"] == "B3 source-redaction"
    assert {c["name"] for c in answers["failed"]} <= set(STATE_CHECKS)
