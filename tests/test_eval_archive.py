"""An eval run's rows kept across sittings (impl/eval/archive.py): a packed archive gives
the report the same distributional audit, leaves out unfinished episodes, and restores
only what a run lacks."""

from __future__ import annotations

import json
import random

import pytest

from unsee.impl.eval.archive import get_finished, pack_rows, read_archive, restore, write_archive
from unsee.impl.eval.distribution import get_episode_distances, summarize_distribution
from unsee.impl.eval.run import ROW_VERSION, ROWS_FILE, EvalError, read_rows

METHODS = ("reset", "replay", "sanitized-rebuild", "none")


def sample_set(rng: random.Random, dims: int = 8) -> dict:
    texts = [rng.choice(["Tool: search", "Tool: email the team", "Tool: calendar"]) for _ in range(3)]
    return {"seeds": [1, 2, 3], "texts": texts, "tools": [t.split()[1] for t in texts],
            "embeddings": [None if i == 2 and rng.random() < 0.3 else [rng.uniform(-1, 1) for _ in range(dims)]
                           for i in range(3)]}


def make_rows(episodes: int, seed: int = 0, methods=METHODS) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for e in range(episodes):
        for method in methods:
            sets = ({"a": sample_set(rng), "b": sample_set(rng)} if method == "reset"
                    else {"a": sample_set(rng)} if method in ("replay", "sanitized-rebuild") else None)
            rows.append({"row_version": ROW_VERSION, "suite": "memory", "case": f"m{e}", "method": method,
                         "digest": f"{e}-{method}", "dist": {"k": 3, "sets": sets} if sets else None})
    return rows


def test_a_packed_archive_gives_the_same_distributional_audit():
    rows = make_rows(6)
    packed = pack_rows(rows)
    assert get_episode_distances(packed) == get_episode_distances(rows)
    assert summarize_distribution(packed) == summarize_distribution(rows)
    assert all(s["embeddings"] is None for r in packed if r["dist"] for s in r["dist"]["sets"].values())
    assert rows[0]["dist"]["sets"]["a"]["embeddings"] is not None  # the rows given are not changed


def test_an_unfinished_episode_is_left_out():
    rows = make_rows(3)[:-2]  # the last episode lost its last two methods
    assert {r["case"] for r in get_finished(rows)} == {"m0", "m1"}
    assert {r["case"] for r in pack_rows(rows)} == {"m0", "m1"}


def test_save_and_restore_round_trip(tmp_path):
    rows = make_rows(4)
    archive = tmp_path / "rows.jsonl.gz"
    assert write_archive(rows, archive) == len(rows)
    first = archive.read_bytes()
    write_archive(rows, archive)
    assert archive.read_bytes() == first  # byte-stable: a re-save of the same rows changes nothing in git
    out = tmp_path / "run"
    assert restore(archive, out) == len(rows)
    assert restore(archive, out) == 0  # what is there already is not added twice
    restored = read_rows(out / ROWS_FILE)
    assert [(r["case"], r["method"]) for r in restored] == [(r["case"], r["method"]) for r in rows]
    assert summarize_distribution(restored) == summarize_distribution(rows)


def test_restore_refuses_another_run_and_changes_nothing(tmp_path):
    archive = tmp_path / "rows.jsonl.gz"
    write_archive(make_rows(2), archive)
    out = tmp_path / "run"
    out.mkdir()
    other = make_rows(1)
    other[0]["digest"] = "something else"
    (out / ROWS_FILE).write_text("".join(json.dumps(r) + "\n" for r in other))
    before = (out / ROWS_FILE).read_bytes()
    with pytest.raises(EvalError, match="disagree on 1 row.*memory/m0/reset.*nothing was written"):
        restore(archive, out)
    assert (out / ROWS_FILE).read_bytes() == before


def test_a_file_that_is_not_an_archive_is_named(tmp_path):
    bad = tmp_path / "rows.jsonl.gz"
    bad.write_text("not gzip")
    with pytest.raises(EvalError, match="rows.jsonl.gz: not an evaluation archive"):
        read_archive(bad)
