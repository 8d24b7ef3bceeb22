"""The cross-model table (impl/eval/crossmodel.py): every cell computed from the rows."""

from __future__ import annotations

import json

import pytest

from unsee.impl.eval.crossmodel import HEADER, get_family, main, render_cross_model
from unsee.impl.eval.run import EvalError


def make_row(case: str, method: str, *, leak=False, avoid=None, equal=None, recomputed=100, wall=10.0,
             model="qwen2.5-1.5b", backend="llamacpp", suite="behavioral"):
    behavior = None if avoid is None else {"avoid": avoid, "pick": "x" if avoid is not None else None}
    return {"suite": suite, "case": case, "method": method, "model": model, "backend": backend,
            "leak": {"any": leak}, "behavior": behavior, "equals_reset": equal,
            "efficiency": {"recomputed_tokens": recomputed, "wall_s": wall}}


def make_run(model="qwen2.5-1.5b", backend="llamacpp"):
    rows = []
    for i in range(4):
        case = f"c{i}"
        rows.append(make_row(case, "reset", avoid=False, equal=True, recomputed=400, wall=40.0,
                             model=model, backend=backend))
        rows.append(make_row(case, "source-redaction", leak=i < 3, avoid=i < 2, recomputed=20, wall=1.0,
                             model=model, backend=backend))
        rows.append(make_row(case, "replay", avoid=False, equal=i != 0, recomputed=100, wall=10.0,
                             model=model, backend=backend))
        rows.append(make_row(case, "reset-prefix-cache", avoid=False, equal=True, recomputed=200, wall=20.0,
                             model=model, backend=backend))
    return rows


def get_body(lines):
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def test_cells_come_from_the_rows():
    lines = render_cross_model([("a", make_run())])
    assert lines[0] == "| " + " | ".join(HEADER) + " |"
    (row,) = get_body(lines)
    cells = dict(zip(HEADER, row, strict=True))
    assert cells["model (family)"] == "qwen2.5-1.5b (qwen2)"
    assert cells["episodes"] == "4 (behavioral)"
    assert cells["B3 any-leak vs B5"].startswith("0.75 vs 0.00 (")
    assert cells["B3 avoid residue"] == "+0.50 (n=4, 0 undecided)"
    assert cells["B7 digest = B5"] == "3/4"
    assert cells["B7 recomputed / B5"] == "0.25x"
    assert cells["B7 wall / B5"] == "0.25x"
    assert cells["B5' wall / B5"] == "0.50x"


def test_one_row_per_run_and_families():
    lines = render_cross_model([("a", make_run()), ("b", make_run("smollm2", "transformers")),
                                ("c", make_run("gemma3-270m"))])
    assert [r[0] for r in get_body(lines)] == ["qwen2.5-1.5b (qwen2)", "smollm2 (llama)", "gemma3-270m (gemma3)"]
    assert get_family("a-model-nobody-knows") == "?"


def test_a_run_of_two_models_is_refused():
    rows = make_run() + make_run("smollm2")
    with pytest.raises(EvalError, match="one model and engine"):
        render_cross_model([("mixed", rows)])


def test_missing_methods_leave_dashes():
    rows = [r for r in make_run() if r["method"] in ("reset", "replay")]
    (row,) = get_body(render_cross_model([("a", rows)]))
    cells = dict(zip(HEADER, row, strict=True))
    assert cells["B3 any-leak vs B5"] == "–" and cells["B5' wall / B5"] == "–"
    assert cells["B7 digest = B5"] == "3/4"


def test_cli_reads_out_folders_and_names_an_empty_one(tmp_path, capsys):
    run = tmp_path / "qwen"
    run.mkdir()
    full = [r | {"row_version": 1} for r in make_run()]
    (run / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in full))
    out = tmp_path / "table.md"
    assert main([str(run), "--write", str(out)]) == 0
    assert "qwen2.5-1.5b (qwen2)" in out.read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty)]) == 2
    assert "no evaluation rows" in capsys.readouterr().err
