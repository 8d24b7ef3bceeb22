"""A strict answer contract (issue 37): docs/conformance.schema.json and the
harness's field table agree field for field, and an answer with a field the
contract does not define (or of another version) is refused with exit 2,
naming the field and the one it was probably meant to be, the same way by
``unsee conform``, ``--vectors`` and the pytest plugin, never ignored."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from unsee.impl.cli.main import main
from unsee.impl.conform.answers import AnswerContractError, read_result
from unsee.impl.conform.contract import CONTRACT, CONTRACT_VERSION, FIELDS, describe_undefined_field
from unsee.impl.conform.harness import EntryPointImplementation, search
from unsee.impl.conform.suite import SUITES_DIR
from unsee.impl.conform.vectors import check_vectors

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "docs" / "conformance.schema.json"
VECTORS = SUITES_DIR / "1.0.0"
#: What `unsee conform` says of an answer with ``kept`` one level too high.
MISPLACED = ("result has a field the contract (version 2) does not define: `kept` at the top level: "
             "the contract reads `run.kept` and `forget.kept`")

#: An adapter that writes its kept bytes at the top level (the issue's typo);
#: no torch: the contract refuses it before any check reads the run.
ADAPTER = f'''
def answer(episode, forget=None):
    return {{"contract": "{CONTRACT}", "version": {CONTRACT_VERSION},
             "implementation": {{"name": "typo", "engine": "none", "model": "none"}},
             "run": {{"T": 1, "turns": {{}}, "digest": "d"}},
             "kept": [{{"name": "db", "text": "4417 Elm"}}]}}


def version_one(episode, forget=None):
    return {{"contract": "{CONTRACT}", "version": 1, "run": {{}}}}
'''


def get_schema_fields(node: dict, path: str = "") -> dict[str, tuple[set[str], object]]:
    """Each object of the schema with fixed properties, by the harness's path
    notation: its property names and its ``additionalProperties``."""
    out = {}
    if node.get("type") == "object" and "properties" in node:
        out[path] = (set(node["properties"]), node.get("additionalProperties", True))
        for key, child in node["properties"].items():
            out |= get_schema_fields(child, f"{path}.{key}" if path else key)
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        out |= get_schema_fields(node["items"], f"{path}[]")
    return out


def test_the_schema_and_the_field_table_agree():
    schema = json.loads(SCHEMA.read_text())
    assert schema["properties"]["version"] == {"const": CONTRACT_VERSION}
    assert schema["$id"].endswith(f"/{CONTRACT_VERSION}") and f"version {CONTRACT_VERSION}" in schema["title"]
    fields = get_schema_fields(schema)
    assert {path: names for path, (names, _) in fields.items()} == {p: set(n) for p, n in FIELDS.items()}
    assert {path for path, (_, extra) in fields.items() if extra is not False} == set(), "every object is closed"


@pytest.fixture
def adapter(tmp_path, monkeypatch):
    (tmp_path / "typo_adapter.py").write_text(ADAPTER)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "typo_adapter"


def test_a_top_level_kept_exits_2_naming_the_field_it_was_meant_to_be(adapter, tmp_path, capsys):
    episode = tmp_path / "episode.json"
    episode.write_text((VECTORS / "case-66caec2c3780" / "episode.json").read_text())
    for argv in (["--episode", str(episode)], []):  # one file, and a search
        assert main(["conform", *argv, "--out", str(tmp_path / "out"), "--entry", f"{adapter}:answer"]) == 2
        assert MISPLACED in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written: it is not a counterexample


def test_a_refused_answer_ends_the_search_without_shrinking(tmp_path):
    calls = []

    def typo(episode: str, forget: str | None = None) -> dict:
        calls.append(episode)
        return {"contract": CONTRACT, "version": CONTRACT_VERSION, "run": {"T": 1, "turn": {}}}

    with pytest.raises(AnswerContractError, match=r"`turn` at `run`: .* did you mean `turns`\?"):
        search(EntryPointImplementation("tests:typo", typo), tmp_path, examples=5)
    assert len(calls) == 1


def test_version_1_is_refused_with_what_changed(adapter, tmp_path, capsys):
    assert main(["conform", "--out", str(tmp_path / "out"), "--entry", f"{adapter}:version_one"]) == 2
    err = capsys.readouterr().err
    assert "must be 'unsee.conformance' version 2, got 'unsee.conformance' version 1" in err
    assert "version 1 ignored fields it did not define" in err


def test_the_vectors_refuse_it_the_same_way(adapter, tmp_path, capsys):
    with pytest.raises(AnswerContractError, match="`kept` at the top level"):
        check_vectors(EntryPointImplementation("typo", __import__(adapter).answer), VECTORS, tmp_path / "out")
    assert main(["conform", "--vectors", str(VECTORS), "--out", str(tmp_path / "v"), "--entry",
                 f"{adapter}:answer"]) == 2
    assert MISPLACED in capsys.readouterr().err


def test_the_pytest_plugin_fails_with_the_same_message(tmp_path):
    (tmp_path / "typo_adapter.py").write_text(ADAPTER)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--unsee-episodes", "2",
                           "--unsee-entry", "typo_adapter:answer"], check=False, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1 and "FAILED ::unsee-conform" in done.stdout, done.stdout[-3000:]
    assert f"error: {MISPLACED}" in done.stdout


@pytest.mark.parametrize("path, where, field, says", [
    ("", "", "kept", "`kept` at the top level: the contract reads `run.kept` and `forget.kept`"),
    ("reset", "reset", "effects", "`effects` at `reset`: the contract reads `run.effects` and `forget.effects`"),
    ("forget", "forget", "digest_afer", "`digest_afer` at `forget`: the contract defines no such field; "
                                        "did you mean `digest_after`?"),
    ("forget.kept[]", "forget.kept[2]", "bytes", "`bytes` at `forget.kept[2]`: the contract defines no such field "
                                                 "(it defines name, text, base64)"),
])
def test_each_undefined_field_is_named_with_its_likely_meaning(path, where, field, says):
    assert describe_undefined_field(path, where, field) == says


def test_an_answer_within_the_contract_reads_as_it_is():
    answer = json.loads((VECTORS / "case-66caec2c3780" / "answers.json").read_text())["counterfactual run"]
    steps = tuple(json.loads((VECTORS / "case-66caec2c3780" / "expected.json").read_text())["turn_steps"])
    assert read_result(answer, steps, None) == answer
    with pytest.raises(AnswerContractError, match=r"`checkpoint` at `run`: .*did you mean `checkpoints`\?"):
        read_result({**answer, "run": {**answer["run"], "checkpoint": [0]}}, steps, None)
