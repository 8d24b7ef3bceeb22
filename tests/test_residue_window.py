"""Residue in the crash window, scanned raw (issue 11, part 4; docs/persistence.md,
"Zero residue").

A forget is SIGKILLed (for real, in a forked child: tests/store_child.py) at
each point between its commit and the end of its compaction: when the VACUUM
statement starts, inside VACUUM's file I/O, and at the statement after it.
The residue byte scan then reads the raw files straight away: nothing of ours
opens them first (opening would roll back, clean up and compact).

Then each defence is turned off in the child alone, to show what it is for:
``secure_delete`` and the rollback journal (``journal_mode = DELETE``) are
necessary (without either, the target's bytes survive in the window);
``VACUUM`` is redundant for residue (``secure_delete`` already zeroed every
freed byte) and kept to drop the zeroed pages and shrink the file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import settings

from unsee.impl.agent.episode import parse_episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.registry import make_engine
from unsee.impl.store.sqlite import SessionStore, find_residue, session_files
from unsee.properties.engines import get_model

SECRET, TARGET = "518306 Vantrobe Lane", "notes.address"
EPISODE = {
    "format": "unsee.episode", "version": 1, "system": "You are a careful assistant.",
    "settings": {"max_new_tokens": 4, "checkpoint_policy": "every_turn"},
    "steps": [{"id": "u1", "kind": "user", "text": "Hello, I am Dana."},
              {"id": "f2", "kind": "tool", "tool": "fetch_notes",
               # big enough to free whole pages, which a save does not simply overwrite
               "fields": [{"source": TARGET, "text": f"Dana lives at {SECRET}." + " Padding." * 100},
                          {"source": "notes.pet", "text": "Dana has a cat."}]},
              {"id": "m3", "kind": "memory", "records": [{"source": TARGET + ".copy", "text": "Dana likes jazz."}]},
              {"id": "r4", "kind": "remember"},
              {"id": "u5", "kind": "user", "text": "What should I cook?"}],
}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def old(lm, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("window") / "old.db"
    SessionStore.create(path, AgentRuntime.from_episode(make_engine(lm), parse_episode(EPISODE))).close()
    assert find_residue([path], SECRET, lm.encode)  # the scan sees the value while it is there
    return path


@pytest.fixture(scope="module")
def zygote(store_zygote):
    return store_zygote


def trial(zygote, db: Path, mode: str, arg, stats: Path | None = None, weaken: str | None = None) -> dict:
    spec = {"db": str(db), "source": TARGET, "mode": mode, "arg": arg, "stats": str(stats) if stats else None,
            "weaken": weaken}
    zygote.stdin.write(json.dumps(spec) + "\n")
    zygote.stdin.flush()
    return json.loads(zygote.stdout.readline())


@pytest.fixture(scope="module")
def window(old, zygote, tmp_path_factory) -> dict:
    """Where the window is: the statement numbers of the VACUUM and the one
    after it, and the VACUUM's index among COMMIT/VACUUM statements."""
    db = tmp_path_factory.mktemp("stats") / "s.db"
    shutil.copy(old, db)
    stats_path = db.with_suffix(".json")
    assert trial(zygote, db, "none", None, stats_path)["exit"] == 0
    marks = json.loads(stats_path.read_text())["marks"]
    vacuum = next(m["n"] for m in marks if m["sql"] == "VACUUM")
    ends = [m for m in marks if m["sql"] in ("COMMIT", "VACUUM")]
    return {"vacuum": vacuum, "after": [m["n"] for m in marks if m["n"] > vacuum],
            "commit_index": 1 + next(i for i, m in enumerate(ends) if m["sql"] == "VACUUM")}


def kill_points(window: dict) -> list[tuple[str, object]]:
    """Every statement from the VACUUM on, and delays inside VACUUM's I/O
    (ci: 6 delays; nightly: 200)."""
    n = max(4, settings().max_examples // 10)
    delays = [round(0.004 * i / (n - 1), 5) for i in range(n)]
    return ([("stmt", window["vacuum"])] + [("stmt", k) for k in window["after"]]
            + [("commit", [window["commit_index"], d]) for d in delays])


def killed_raw(zygote, old: Path, tmp: Path, mode: str, arg, weaken: str | None = None) -> tuple[list[str], Path]:
    db = tmp / "trial.db"
    for p in session_files(db):
        p.unlink()
    shutil.copy(old, db)
    result = trial(zygote, db, mode, arg, weaken=weaken)
    assert result["killed"] or result["exit"] == 0, result
    return find_residue(session_files(db), SECRET, _encode()), db  # raw: nothing of ours opened them


def _encode():
    return get_model("tiny").encode


def test_no_residue_anywhere_in_the_crash_window(old, zygote, window, tmp_path):
    points = kill_points(window)
    killed = 0
    for mode, arg in points:
        found, db = killed_raw(zygote, old, tmp_path, mode, arg)
        assert found == [], f"killed at {mode} {arg}: {found}"
        with SessionStore.open(db) as store:  # only now: the state is the new one (the commit happened)
            assert store.get_summary()["forgotten"] == [TARGET]
        killed += 1
    print(f"crash window: {killed} SIGKILL points between commit and the end of compaction, raw scans clean")


@pytest.mark.parametrize("defence", ["secure_delete", "journal:PERSIST", "journal:WAL"])
def test_each_necessary_defence_fails_without_it(old, zygote, window, tmp_path, defence):
    """Killed when the compaction starts, a store without this defence still
    holds the target's bytes: deleted cells and freed pages not zeroed
    (secure_delete off), the old pages kept in a persistent journal, or kept
    in the database file while the new ones sit in a write-ahead log."""
    found, _db = killed_raw(zygote, old, tmp_path, "stmt", window["vacuum"], weaken=defence)
    assert found, f"without {defence} the window held no residue: the defence would be redundant"
    print(f"without {defence}: {found[:2]}")


def test_vacuum_is_redundant_for_residue(old, zygote, tmp_path):
    """A whole forget without VACUUM (secure_delete on): no residue either;
    the compaction only drops the zeroed pages and shrinks the file."""
    found, db = killed_raw(zygote, old, tmp_path, "none", None, weaken="vacuum")
    assert found == []
    raw = db.read_bytes()
    assert raw.count(bytes(4096)) > 0  # zeroed free pages remain without VACUUM
