"""An evaluation's rows kept in the repository, so that a long run resumes in a
later sitting on another machine (issue 27, item 4: "split it across sittings").

A run's ``rows.jsonl`` is about 330 KB an episode on qwen2.5-1.5b, six sevenths
of it the distributional audit's embeddings (1,536 numbers a sample, 20 samples
an episode). An archive keeps every row of every *finished* episode (all of
the run's methods present) with each sample set's embeddings replaced by the
one number the audit reads from them, the embedding distance to B5's set ``a``
(:func:`unsee.impl.eval.distribution.compute_distances` reads it back), and is
gzipped: about 10 KB an episode. Rows of an unfinished episode are left out,
because a method still to run needs B5's embeddings; the resumed run redoes
that episode.

    python -m unsee.impl.eval.archive save OUT ARCHIVE     # OUT/rows.jsonl -> ARCHIVE
    python -m unsee.impl.eval.archive restore ARCHIVE OUT  # ARCHIVE -> OUT/rows.jsonl

``restore`` adds the archive's rows that ``OUT/rows.jsonl`` lacks (by suite,
case and method) and changes nothing when an archived row disagrees with a
row already there.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from unsee.impl.eval.distribution import FLOOR_SETS, REFERENCE, embedding_distance
from unsee.impl.eval.rows import ROWS_FILE, EvalError, read_rows

#: the field a packed sample set carries instead of its embeddings
PACKED = "embedding_to_reference"


def get_key(row: dict) -> tuple[str, str, str]:
    return row["suite"], row["case"], row["method"]


def get_finished(rows: Sequence[dict]) -> list[dict]:
    """The rows of every episode that has as many methods as the run's fullest
    episode (an episode cut short is left out, to be redone)."""
    by_case: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        by_case.setdefault((row["suite"], row["case"]), []).append(row)
    full = max((len({r["method"] for r in group}) for group in by_case.values()), default=0)
    return [r for group in by_case.values() if len({r["method"] for r in group}) == full for r in group]


def pack_episode(rows: Sequence[dict]) -> list[dict]:
    """One finished episode's rows, each sample set's embeddings replaced by
    its embedding distance to B5's set ``a`` (the only use the audit makes of
    them). The rows given are not changed."""
    ref = next((r for r in rows if r["method"] == REFERENCE), None)
    ref_sets = ((ref or {}).get("dist") or {}).get("sets") or {}
    anchor = (ref_sets.get(FLOOR_SETS[0]) or {}).get("embeddings")
    out = []
    for row in rows:
        row = json.loads(json.dumps(row))
        for set_ in ((row.get("dist") or {}).get("sets") or {}).values():
            if set_.get("embeddings") is None:
                continue
            set_[PACKED] = embedding_distance(set_["embeddings"], anchor) if anchor is not None else None
            set_["embeddings"] = None
        out.append(row)
    return out


def pack_rows(rows: Sequence[dict]) -> list[dict]:
    """The finished episodes' rows, packed (:func:`pack_episode`), in their order."""
    finished = get_finished(rows)
    by_case: dict[tuple[str, str], list[dict]] = {}
    for row in finished:
        by_case.setdefault((row["suite"], row["case"]), []).append(row)
    return [r for group in by_case.values() for r in pack_episode(group)]


def write_archive(rows: Sequence[dict], path: Path) -> int:
    """Write the packed rows of the finished episodes to ``path`` (gzip, one
    JSON row a line, byte-stable: no timestamp in the gzip header); how many."""
    packed = pack_rows(rows)
    data = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in packed).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0))
    return len(packed)


def read_archive(path: Path) -> list[dict]:
    """An archive's rows; an error naming the file when it is not one."""
    try:
        text = gzip.decompress(path.read_bytes()).decode()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise EvalError(f"{path}: not an evaluation archive ({exc})") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise EvalError(f"{path}: line {number} is not a JSON row ({exc})") from None
    return rows


def restore(archive: Path, out: Path) -> int:
    """Append to ``out/rows.jsonl`` the archived rows it lacks; how many. An
    archived row that disagrees with one already there (same suite, case and
    method, another digest) is an error, and nothing is written."""
    rows = read_archive(archive)
    path = out / ROWS_FILE
    have = {get_key(r): r for r in read_rows(path)}
    clashes = [get_key(r) for r in rows if get_key(r) in have and have[get_key(r)]["digest"] != r["digest"]]
    if clashes:
        raise EvalError(f"{archive} and {path} disagree on {len(clashes)} row(s), e.g. {'/'.join(clashes[0])}: "
                        "they are not one run; nothing was written")
    new = [r for r in rows if get_key(r) not in have]
    if new:
        out.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as sink:
            for row in new:
                sink.write(json.dumps(row, default=str) + "\n")
    return len(new)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    save = sub.add_parser("save", help="OUT/rows.jsonl's finished episodes, packed, to ARCHIVE")
    save.add_argument("out", type=Path)
    save.add_argument("archive", type=Path)
    back = sub.add_parser("restore", help="ARCHIVE's rows that OUT/rows.jsonl lacks, appended to it")
    back.add_argument("archive", type=Path)
    back.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "save":
            rows = read_rows(args.out / ROWS_FILE)
            if not get_finished(rows):
                print(f"{args.out / ROWS_FILE}: no finished episode yet; {args.archive} was not written")
                return 0
            n = write_archive(rows, args.archive)
            episodes = len({(r["suite"], r["case"]) for r in get_finished(rows)})
            print(f"{args.archive}: {n} rows of {episodes} finished episodes "
                  f"({len(rows) - n} rows of unfinished ones left out)")
        elif not args.archive.exists():
            print(f"{args.archive}: no archive yet; nothing to restore")
        else:
            print(f"{args.out / ROWS_FILE}: {restore(args.archive, args.out)} rows restored from {args.archive}")
    except EvalError as exc:
        print(f"unsee: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
