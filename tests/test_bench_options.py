"""The bench scripts declare their shared options in one place (bench/options.py),
each with one default: no script spells ``--model`` (or ``--engine``,
``--backend``, ``--rounds``, ``--out``) itself."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from unsee.bench import options

BENCH = Path(__file__).resolve().parents[1] / "bench"
SHARED = ("--model", "--engine", "--backend", "--rounds", "--out")


def get_declared(path: Path) -> list[str]:
    """The shared options a file declares with ``add_argument`` itself."""
    return [f"{path.name}:{node.lineno}: {node.args[0].value}" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args
            and isinstance(node.args[0], ast.Constant) and node.args[0].value in SHARED]


def test_no_bench_script_declares_a_shared_option_itself():
    declared = [d for path in sorted(BENCH.glob("*.py")) if path.name != "options.py" for d in get_declared(path)]
    assert not declared, "declare these in bench/options.py:\n" + "\n".join(declared)


def test_the_shared_defaults_are_the_clis():
    cli = importlib.import_module("unsee.impl.cli.options")
    parser = options.get_parser("x", "A bench.\n")
    options.add_model(parser)
    options.add_backend(parser)
    options.add_rounds(parser)
    options.add_out(parser)
    args = parser.parse_args([])
    assert (args.model, args.engine, args.rounds, args.out) == (cli.DEFAULT_MODEL, "transformers", 3, None)
    assert parser.prog == "python -m unsee.bench.x"
    with pytest.raises(SystemExit):
        parser.parse_args(["--engine", "no-such-backend"])
