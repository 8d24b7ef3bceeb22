"""The docs' generated tables: the README's command-line table, from the
argument parser, and docs/serve.md's request-field table, from
:mod:`unsee.impl.serve.fields` (the table the server checks bodies against).

A page holds a table between ``<!-- generated: NAME -->`` and
``<!-- end: NAME -->``. ``python -m unsee.impl.cli.docs --write`` rewrites
every region of every page in :data:`PAGES` from the code; ``--check`` exits 1
when the committed text differs (tests/test_docs.py and
tests/test_serve_fields.py run the same comparison). A subcommand or option added to the parser appears on
the next ``--write`` with no edit here: the table lists every subcommand,
its positional arguments, its one-line help and every option ``--help``
shows (hidden aliases stay hidden).

argparse has no public API to walk a parser, so this reads its ``_actions``
and the subparsers' ``_choices_actions`` (the same fields ``--help`` is
formatted from).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from unsee.impl.cli.parser import build_parser

CLI_REGION = "cli-table"
FIELDS_REGION = "serve-fields"
#: what rewrites a region, named in its opening marker
WRITE_COMMAND = "python -m unsee.impl.cli.docs --write"
#: the pages with generated regions, from the repository's root
PAGES = ("README.md", "docs/serve.md")


def get_subparsers_action(parser: argparse.ArgumentParser) -> argparse.Action:
    """The parser's one subcommand action (the action whose choices are parsers)."""
    found = [a for a in parser._actions if isinstance(a.choices, dict)]
    if len(found) != 1:
        raise ValueError(f"expected one subcommand action in {parser.prog!r}, found {len(found)}")
    return found[0]


def get_subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of every subcommand, in the order they were added."""
    action = get_subparsers_action(parser)
    helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
    return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]


def is_shown(action: argparse.Action) -> bool:
    """Whether ``--help`` shows ``action`` (not -h, not a hidden alias)."""
    return action.help is not argparse.SUPPRESS and action.dest != "help"


def get_value_label(action: argparse.Action) -> str:
    """What an option or positional takes, as ``--help`` writes it: choices, metavar or DEST."""
    if action.choices is not None and not isinstance(action.choices, dict):
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.metavar or action.dest.upper()


def get_positional_label(action: argparse.Action) -> str:
    """``EPISODE``; ``[-- CMD ...]`` for a trailing list, ``[X]`` for an optional one."""
    label = get_value_label(action)
    if action.nargs in ("*", argparse.REMAINDER):
        return f"[-- {label} ...]"
    if action.nargs == "?":
        return f"[{label}]"
    return f"{label} ..." if action.nargs == "+" else label


def get_option_label(action: argparse.Action) -> str:
    """``--json``; ``--forget SOURCE_ID``; ``--engine {transformers,llamacpp,vllm}``."""
    flag = max(action.option_strings, key=len)  # the long spelling
    return flag if action.nargs == 0 else f"{flag} {get_value_label(action)}"


def get_usage(name: str, sub: argparse.ArgumentParser) -> str:
    """The subcommand and its shown positionals: ``run EPISODE``."""
    positionals = [get_positional_label(a) for a in sub._actions if not a.option_strings and is_shown(a)]
    return " ".join([name, *positionals])


def escape_cell(text: str) -> str:
    """One markdown table cell: no pipes, no line breaks."""
    return re.sub(r"\s+", " ", text).replace("|", "\\|").strip()


def render_cli_table(parser: argparse.ArgumentParser | None = None) -> str:
    """The markdown table: subcommand, what it does, its options (every one ``--help`` shows)."""
    parser = parser or build_parser()
    rows = ["| subcommand | what it does | options |", "|---|---|---|"]
    for name, help_text, sub in get_subcommands(parser):
        options = [get_option_label(a) for a in sub._actions if a.option_strings and is_shown(a)]
        cells = [f"`{get_usage(name, sub)}`", escape_cell(help_text),
                 ", ".join(f"`{escape_cell(o)}`" for o in options)]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def get_markers(name: str, command: str = WRITE_COMMAND) -> tuple[str, str]:
    """A region's opening and closing markers; the opening names the ``command`` that rewrites it."""
    return f"<!-- generated: {name} ({command}) -->\n", f"<!-- end: {name} -->"


def get_region(text: str, name: str, command: str = WRITE_COMMAND) -> str:
    """The text between the region's markers; a ValueError naming the region if they are missing."""
    start, end = get_markers(name, command)
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"expected one {start.strip()!r} ... {end!r} region")
    return text[text.index(start) + len(start):text.index(end)]


def replace_region(text: str, name: str, body: str, command: str = WRITE_COMMAND) -> str:
    """``text`` with the region's content replaced by ``body`` (markers kept)."""
    old = get_region(text, name, command)
    start, _ = get_markers(name, command)
    head = text.index(start) + len(start)
    return text[:head] + body + text[head + len(old):]


def render_serve_fields() -> str:
    from unsee.impl.serve.fields import render_fields_table

    return render_fields_table()


#: region name -> what renders it; a generated region is added here
RENDERERS = {CLI_REGION: render_cli_table, FIELDS_REGION: render_serve_fields}


def compute_readme(text: str) -> str:
    """``text`` with every generated region it holds rewritten from the code."""
    for name, render in RENDERERS.items():
        if get_markers(name)[0] in text:
            text = replace_region(text, name, render())
    return text


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="python -m unsee.impl.cli.docs",
                                  description="Rewrite or check the docs' generated regions.")
    cli.add_argument("--readme", action="append", metavar="PAGE",
                     help=f"a page to rewrite or check (repeatable; default {', '.join(PAGES)})")
    mode = cli.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the generated regions in place")
    mode.add_argument("--check", action="store_true", help="exit 1 if a generated region differs from the code")
    args = cli.parse_args(argv)
    stale = []
    for path in map(Path, args.readme or PAGES):
        text = path.read_text()
        new = compute_readme(text)
        if args.write:
            path.write_text(new)
        elif new != text:
            stale.append(path)
    for path in stale:
        print(f"{path}: a generated region differs from the code; run {WRITE_COMMAND}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
