"""The exit codes of the ``unsee`` command: one table, here.

README's CLI table is rendered from :data:`MEANINGS` by
:func:`render_exit_table`, so the two cannot drift apart.
"""

from __future__ import annotations

import enum


class Exit(enum.IntEnum):
    """What an ``unsee`` subcommand returns to the shell."""

    OK = 0
    FAILED = 1
    USAGE = 2
    CANNOT_VERIFY = 3
    BUSY = 75  # EX_TEMPFAIL of sysexits.h: try again later
    INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


#: One line per exit code: what it means, and which subcommands return it.
MEANINGS = {
    Exit.OK: "success (`verify`: verified; `conform`: the implementation conforms)",
    Exit.FAILED: "a check failed (`verify`), the implementation was rejected (`conform`), or anything else "
                 "went wrong",
    Exit.USAGE: "bad input: a file, option or name that is wrong; the message names it and nothing was changed",
    Exit.CANNOT_VERIFY: "`verify` cannot verify here: the environment differs from the receipt's (the message "
                        "names the difference)",
    Exit.BUSY: "the store is busy or changed under us (another process writes it): retry later",
    Exit.INTERRUPTED: "interrupted (Ctrl-C); `eval` keeps its finished rows and resumes when run again",
}


def render_exit_table() -> str:
    """The exit codes as a Markdown table (``| code | name | meaning |``), one row per :class:`Exit`."""
    lines = ["| code | name | meaning |", "|---:|---|---|"]
    lines += [f"| {code.value} | `{code.name}` | {MEANINGS[code]} |" for code in Exit]
    return "\n".join(lines) + "\n"


__all__ = ["MEANINGS", "Exit", "render_exit_table"]
