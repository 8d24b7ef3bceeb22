"""Progress bars on stderr: the one place that draws them (the CLI's runs and
forgets, ``unsee demo``, ``unsee eval``'s rows).

Every bar sits at position 0 and keeps its last line when closed: a bar left
open by a failed run never pushes the next one down a line (tqdm's nesting
moved the cursor over lines printed later), and whatever is printed after a
closed bar starts on a line of its own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def open_bar(desc: str, total: int, unit: str = "step", file=None, **options):
    """A tqdm bar of ``total`` ``unit``s on ``file`` (default: stderr, looked
    up now, so a redirected stderr is honoured) at position 0, kept on screen
    when closed. ``options`` go to tqdm (e.g. ``dynamic_ncols``, ``disable``)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=True, position=0,
                file=file if file is not None else sys.stderr, **options)


def progress_bar(label: str, enabled: bool, file=None) -> Callable[[int, int], None] | None:
    """A progress callback ``(i, n)`` drawing one bar on stderr (``file``),
    or None when not ``enabled``.

    The bar is created at the first step, when its total is known, and closed
    at the last step. Off when the stream is not a terminal, unless a
    ``file`` is given."""
    if not enabled:
        return None
    state = {"bar": None}

    def update(i: int, n: int) -> None:
        bar = state["bar"]
        if bar is None:
            bar = state["bar"] = open_bar(f"   {label}", n, "step", file,
                                          disable=False if file is not None else None)
        bar.total = n
        bar.n = i
        bar.refresh()
        if i >= n:
            bar.close()
            state["bar"] = None

    return update


__all__ = ["open_bar", "progress_bar"]
