"""The demo's terminal output (issue 10 item 8): progress bars never draw
over lines printed after them, and the table's "where" cell never cuts a
name mid-word."""

from __future__ import annotations

import io
import re

from hypothesis import example, given
from hypothesis import strategies as st

from unsee.impl.cli.demo import fit_items
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
