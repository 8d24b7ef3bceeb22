"""``--kv-budget`` on ``unsee run`` and ``unsee demo`` (tiny model)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from unsee.impl.cli.demo import run_demo
from unsee.impl.cli.main import main
from unsee.impl.cli.options import parse_bytes

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "secret_in_tool_result.json"


#: the tiny model on one thread (the one_thread fixture, tests/conftest.py)
pytestmark = pytest.mark.usefixtures("one_thread")


def run_json(capsys, *extra) -> dict:
    assert main(["run", str(EXAMPLE), "--model", "tiny", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_run_under_budget_zero_rebuilds_and_reaches_the_same_state(capsys):
    free = run_json(capsys)
    bounded = run_json(capsys, "--kv-budget", "0")
    assert bounded["digest"] == free["digest"] and bounded["digest_before"] == free["digest_before"]
    # the target (step 3) entered before the compaction (step 5): its
    # checkpoint lineage had been evicted, and the forget rebuilt it
    assert bounded["result"]["report"]["rebuilt_tokens"] > 0 == free["result"]["report"]["rebuilt_tokens"]
    assert bounded["kv_memory"]["budget"] == 0 and bounded["kv_memory"]["unpinned_bytes"] == 0
    assert bounded["kv_memory"]["evicted_lineages"] > 0
    assert main(["run", str(EXAMPLE), "--model", "tiny", "--kv-budget", "64K"]) == 0
    assert "unpinned" in capsys.readouterr().out


@pytest.mark.parametrize("text, value", [("0", 0), ("65536", 65536), ("64K", 65536), ("1.5M", 1572864),
                                         ("2GiB", 2 * 1024**3), (" 3 kb ", 3072)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["-1", "lots", "1T", ""])
def test_bad_budget_exits_2_and_names_it(capsys, text):
    with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
        parse_bytes(text)
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(EXAMPLE), "--model", "tiny", "--kv-budget", text])
    assert exit_info.value.code == 2 and repr(text) in capsys.readouterr().err


def test_demo_under_a_budget_equals_the_reset():
    summary = run_demo("tiny", out=lambda _: None, progress=False, kv_budget=0)
    rows = {r["method"]: r for r in summary["rows"]}
    assert rows["replay"]["equals_reset"] and summary["kv_budget"] == 0
    assert summary["kv_memory"]["unpinned_bytes"] == 0
