"""The docs as a manual: every python snippet runs, every path and name they cite exists.

- README.md's quickstart (the ```python block under "## Python quickstart") runs
  on the tiny model and ends with a verified store;
- every other ```python block of README.md and docs/*.md runs, each in a fresh
  namespace in an empty working directory (a block that is not meant to run is
  fenced as ```text);
- every ``impl/...py`` path and ``unsee.impl...`` dotted name in README.md,
  docs/*.md and properties/README.md resolves, and so does every
  ``file.py::test_name`` reference to a test, property or proof;
- docs/statements.md's table: each spec function, property, proof file and
  impl symbol it names exists.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import re
import shutil
from functools import cache
from pathlib import Path

import pytest

from unsee.bench.options import FIGURE_LABEL

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "properties" / "README.md"]
#: top-level package -> its folder (pyproject's package-dir)
PACKAGE_DIRS = {"impl": "impl", "spec": "spec", "properties": "properties", "proofs": "proofs", "bench": "bench"}
#: the folders a bare ``file.py`` or a bare name in the docs may live in
SOURCE_DIRS = ("spec", "impl", "properties", "proofs", "bench", "tests")
QUICKSTART_HEADING = "## Python quickstart"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


def get_fenced_blocks(path: Path, language: str = "python") -> list[tuple[int, str]]:
    """(line number, code) of each fenced block of ``language`` in ``path``."""
    text = path.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == language]


def get_section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same level."""
    start = text.index(heading + "\n")
    level = heading.split(" ")[0]
    following = re.search(rf"^{level} ", text[start + len(heading):], re.MULTILINE)
    return text[start:start + len(heading) + following.start()] if following else text[start:]


def run_snippet(code: str, where: str) -> str:
    """Execute ``code`` in a fresh namespace; its stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, where, "exec"), {"__name__": "__docs__"})  # noqa: S102 (the docs' own examples, run)
    return out.getvalue()


def test_readme_quickstart_runs(tmp_path, monkeypatch):
    section = get_section((ROOT / "README.md").read_text(), QUICKSTART_HEADING)
    blocks = [m.group(2) for m in FENCE.finditer(section) if m.group(1) == "python"]
    assert len(blocks) == 1, f"README's {QUICKSTART_HEADING!r} holds {len(blocks)} python blocks, expected 1"
    monkeypatch.chdir(tmp_path)
    lines = run_snippet(blocks[0], "README.md quickstart").split()
    assert re.fullmatch(r"[0-9a-f]{64}", lines[0]), lines  # the forget's state digest
    assert lines[1:] == ["2", "verified"], lines  # T - tau + 1 invocations; verify's verdict


def get_snippets() -> list:
    readme = (ROOT / "README.md").read_text()
    quickstart = get_section(readme, QUICKSTART_HEADING) if QUICKSTART_HEADING + "\n" in readme else ""
    cases = []
    for path in DOCS:
        for line, code in get_fenced_blocks(path):
            if path.name == "README.md" and path.parent == ROOT and code in quickstart:
                continue  # run by test_readme_quickstart_runs
            cases.append(pytest.param(code, id=f"{path.relative_to(ROOT)}:{line}"))
    return cases


@pytest.mark.parametrize("code", get_snippets())
def test_doc_snippet_runs(code, tmp_path, monkeypatch, request):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")  # the episode files snippets read
    monkeypatch.chdir(tmp_path)  # snippets write their files (stores, suites) here
    run_snippet(code, request.node.callspec.id)


def get_doc_texts() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in DOCS}


def test_every_impl_path_in_the_docs_exists():
    missing = [(doc, p) for doc, text in get_doc_texts().items()
               for p in sorted(set(re.findall(r"(?<![\w/.])impl/[\w/]+\.py", text))) if not (ROOT / p).is_file()]
    assert not missing, f"impl paths in the docs that do not exist: {missing}"


@cache
def get_tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def get_defined_names(body: list[ast.stmt]) -> set[str]:
    """Names a module or class body defines: functions, classes, assignments, imports."""
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            names |= get_defined_names(node.body)
    return names


def has_attribute(path: Path, parts: list[str]) -> bool:
    """Whether the module at ``path`` defines ``parts[0]`` (and class ``parts[0]`` member ``parts[1]``)."""
    body = get_tree(path).body
    for i, part in enumerate(parts):
        if part not in get_defined_names(body):
            return False
        if i + 1 < len(parts):
            classes = [n for n in body if isinstance(n, ast.ClassDef) and n.name == part]
            if not classes:
                return False
            body = classes[0].body
    return True


def get_module_file(dotted: list[str]) -> Path | None:
    """The file of a dotted module path under a package folder (``["impl", "agent", "runtime"]``)."""
    folder = ROOT / PACKAGE_DIRS[dotted[0]]
    for part in dotted[1:]:
        folder = folder / part
    for candidate in (folder.with_suffix(".py"), folder / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def resolve_dotted(name: str) -> bool:
    """Whether ``unsee.impl.a.b.Name[.member]`` or ``spec.name`` names a module or something defined in one."""
    parts = name.split(".")
    if parts[0] == "unsee":
        parts = parts[1:]
    for split in range(len(parts), 0, -1):
        module = get_module_file(parts[:split])
        if module is not None:
            rest = parts[split:]
            return not rest or has_attribute(module, rest)
    return False


def get_source_files() -> list[Path]:
    return [p for d in SOURCE_DIRS for p in sorted((ROOT / d).rglob("*.py")) if ".venv" not in p.parts]


def resolve_bare(name: str) -> bool:
    """Whether ``Name`` or ``Class.member`` is defined in some source file of the project."""
    parts = name.split(".")
    if any(has_attribute(path, parts) for path in get_source_files()):
        return True
    # a member a public class inherits (AgentRuntime.forget comes from its Algorithm 1 mixin)
    import unsee

    owner = getattr(unsee, parts[0], None) if parts[0] in unsee.__all__ else None
    return owner is not None and len(parts) == 2 and hasattr(owner, parts[1])


def find_file(name: str) -> Path | None:
    """A docs ``file.py``: a path from the root, else the one file of that name in a source folder."""
    if (ROOT / name).is_file():
        return ROOT / name
    found = [p for p in get_source_files() if p.name == name]
    return found[0] if len(found) == 1 else None


def resolve_test_name(path: Path, name: str) -> bool:
    """Whether ``path`` defines ``name`` (a ``..._suffix`` abbreviation: some name ending so)."""
    if name.startswith("..."):
        suffix = name[3:]
        return any(n.endswith(suffix) for n in ast.walk(get_tree(path)) for n in [getattr(n, "name", "")])
    if has_attribute(path, name.split(".")):
        return True
    # a name the module makes at import time (one state machine per engine)
    module = ".".join(["unsee", *path.relative_to(ROOT).with_suffix("").parts])
    return hasattr(importlib.import_module(module), name)


def get_references(text: str) -> list[tuple[str, str]]:
    """(file, name) of every ``file.py::name`` in ``text``; a bare ``::name`` follows the last file named."""
    refs, last = [], None
    for token in re.findall(r"`([^`\s]+)`", text):
        m = re.fullmatch(r"([\w/]*\.py)?::([\w.]+)(?:\[.*)?", token.split("(")[0])
        if token.split("::")[0].endswith(".py"):
            last = token.split("::")[0]
        if m:
            refs.append((m.group(1) or last, m.group(2)))
    return refs


def get_named_things() -> list:
    cases = []
    for doc, text in get_doc_texts().items():
        for name in sorted(set(re.findall(r"\bunsee\.impl(?:\.\w+)+", text))):
            cases.append(pytest.param("dotted", name, id=f"{doc}:{name}"))
        for file, name in sorted(set(get_references(text))):
            cases.append(pytest.param("test", f"{file}::{name}", id=f"{doc}:{file}::{name}"))
    return cases


@pytest.mark.parametrize(("kind", "name"), get_named_things())
def test_every_name_in_the_docs_exists(kind, name):
    if kind == "dotted":
        assert resolve_dotted(name), f"{name} names no module or definition"
        return
    file, test = name.split("::")
    path = find_file(file)
    assert path is not None, f"{file}: no such file (or more than one of that name)"
    assert resolve_test_name(path, test), f"{path.relative_to(ROOT)} defines no {test}"


#: notation in the statements table, not names of code
NOTATION = {"F", "I_t", "T", "tau"}


def get_statement_names() -> list[str]:
    """Every code name in the tables of docs/statements.md (table cells' backticked tokens)."""
    names = set()
    for row in (ROOT / "docs" / "statements.md").read_text().splitlines():
        if not row.startswith("|") or set(row) <= set("|- "):
            continue
        for token in re.findall(r"`([^`]+)`", row):
            token = token.split("(")[0]
            if re.fullmatch(r"[\w./:]+", token) and token not in NOTATION:
                names.add(token)
    return sorted(names)


def test_statements_table_names_code_that_exists():
    names = get_statement_names()
    assert len(names) > 40, names  # the parser found the table
    missing = []
    for token in names:
        file, _, member = token.partition("::")
        if file.endswith(".py"):
            path = find_file(file)
            if path is None or (member and not resolve_test_name(path, member)):
                missing.append(token)
        elif token.startswith(("::", "...")):
            continue  # abbreviations: checked by test_every_name_in_the_docs_exists against the file before
        elif token.startswith(("spec.", "unsee.")):
            if not resolve_dotted(token):
                missing.append(token)
        elif not resolve_bare(token):
            missing.append(token)
    assert not missing, f"names in docs/statements.md that the code does not define: {missing}"


def get_readme_matrix(text: str) -> str:
    """The table under README.md's "## Support matrix" heading."""
    section = text.split("## Support matrix", 1)[1]
    lines = section.split("\n")
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[first:end]) + "\n"


def test_readme_support_matrix_is_the_generated_one():
    """README.md's support matrix is what the engines declare (impl/engines/support.py):
    regenerate it with ``python -c "from unsee.impl.engines.support import get_support_matrix as g; print(g())"``."""
    from unsee.impl.engines.support import get_support_matrix

    assert get_readme_matrix((ROOT / "README.md").read_text()) == get_support_matrix()


def test_readme_real_models_table_is_the_generated_one():
    """README.md's real models' table (under the support matrix) is ``get_model_matrix()``'s."""
    from unsee.impl.engines.support import get_model_matrix

    table = get_model_matrix()
    text = (ROOT / "README.md").read_text()
    start = text.index(table.splitlines()[0])
    assert text[start:start + len(table)] == table and not text[start + len(table):].startswith("|")
def test_readme_cli_table_is_generated_from_the_parser():
    from unsee.impl.cli.docs import CLI_REGION, WRITE_COMMAND, get_region, render_cli_table

    committed = get_region((ROOT / "README.md").read_text(), CLI_REGION)
    assert committed == render_cli_table(), f"README's CLI table differs from the parser: run {WRITE_COMMAND}"


def test_cli_table_follows_the_parser_without_edits():
    """A subcommand, a positional and an option added to the parser appear, a hidden alias does not."""
    from unsee.impl.cli.docs import compute_readme, render_cli_table
    from unsee.impl.cli.options import add_alias
    from unsee.impl.cli.parser import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a.choices, dict))
    extra = sub.add_parser("frobnicate", help="a subcommand | made up here")
    extra.add_argument("target", metavar="TARGET")
    extra.add_argument("--port", type=int, metavar="N")
    extra.add_argument("--engine", choices=("transformers", "vllm"))
    add_alias(extra, "--old-port", "--port", type=int)
    row = next(r for r in render_cli_table(parser).splitlines() if r.startswith("| `frobnicate"))
    assert row == ("| `frobnicate TARGET` | a subcommand \\| made up here | `--port N`, "
                   "`--engine {transformers,vllm}` |"), row
    for name in ("run", "forget", "verify", "show", "demo", "conform", "eval", "calibrate"):
        assert f"| `{name}" in render_cli_table(parser), name
    stale = (ROOT / "README.md").read_text().replace("`--json`", "`--jsonl`", 1)
    assert compute_readme(stale) != stale  # the check sees a hand edit inside the region


def test_bench_forget_policy_region_is_generated_from_its_summary():
    """docs/bench.md's table of drafts on real episodes is rendered from the committed
    summary (bench/forget_policy.py; its DOCS_COMMAND rewrites it)."""
    import json

    from unsee.bench.forget_policy import DOCS_COMMAND, REGION, SUMMARY_FILE, render_summary
    from unsee.impl.cli.docs import get_region

    summary = json.loads((ROOT / SUMMARY_FILE).read_text())
    committed = get_region((ROOT / "docs" / "bench.md").read_text(), REGION, DOCS_COMMAND)
    assert committed == render_summary(summary), f"docs/bench.md's {REGION} region differs: run {DOCS_COMMAND}"


#: the line that labels a bench figure: build, attention, dtype, CPU and command (docs/bench.md, "Labels")
SUMMARY_LABELS = ("build", "attention", "dtype", "CPU", "command")
REFERENCE_MARK = "<!-- reference:"


def get_unlabelled_figures(text: str) -> list[str]:
    """Each table or plot of a bench page without a label: no label line between it and the
    section (``## ``) it is in, and not a summary table with a filled column per label, nor a
    table marked as reference. Fenced code is skipped."""
    lines = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text).splitlines()
    problems, label, previous = [], None, ""
    for number, line in enumerate(lines, 1):
        if line.startswith(("# ", "## ")):
            label = None
        elif line.startswith("> build "):
            label = line if FIGURE_LABEL.match(line) else None
            if label is None:
                problems.append(f"line {number}: a label without build, attention, dtype, CPU or command: {line[:80]}")
        starts_table = line.startswith("|") and not previous.startswith("|")
        is_figure = starts_table or re.search(r"!\[[^\]]*\]\(", line)
        if is_figure and label is None and not previous.startswith(REFERENCE_MARK):
            header = [c.strip() for c in line.strip("|").split("|")] if starts_table else []
            if not all(name in header for name in SUMMARY_LABELS):
                problems.append(f"line {number}: a figure with no label: {line[:80]}")
            else:  # a summary table: every row fills each label column
                columns = [header.index(name) for name in SUMMARY_LABELS]
                for offset, row in enumerate(lines[number + 1:], number + 2):
                    if not row.startswith("|"):
                        break
                    cells = [c.strip() for c in row.strip("|").split("|")]
                    if any(not cells[i] for i in columns):
                        problems.append(f"line {offset}: a summary row with an empty label column")
        previous = line
    return problems


def test_every_bench_figure_is_labelled():
    problems = get_unlabelled_figures((ROOT / "docs" / "bench.md").read_text())
    assert not problems, "docs/bench.md:\n" + "\n".join(problems)
    # other pages label some figures the same way: each label names all five
    bad = [(doc, line[:80]) for doc, text in get_doc_texts().items() for line in FENCE.sub("", text).splitlines()
           if line.startswith("> build ") and not FIGURE_LABEL.match(line)]
    assert not bad, f"labels without build, attention, dtype, CPU or command: {bad}"


def test_the_label_check_finds_a_missing_label():
    label = "> build `abc1234` · attention `sdpa` · dtype fp32 · CPU not recorded · command `python -m unsee.bench.x`"
    table = "| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert get_unlabelled_figures(f"## S\n\n{label}\n\n{table}") == []
    assert get_unlabelled_figures(f"## S\n\n{table}")  # no label
    assert get_unlabelled_figures(f"{label}\n\n## S\n\n{table}")  # a label of another section
    assert get_unlabelled_figures(f"## S\n\n{label.replace(' · dtype fp32', '')}\n\n{table}")  # no dtype
    assert get_unlabelled_figures("## S\n\n![plot](img/x.png)\n")
    summary = "| goal | build | attention | dtype | CPU | command |\n|---|---|---|---|---|---|\n"
    assert get_unlabelled_figures(f"## S\n\n{summary}| g | abc1234 | sdpa | fp32 | x | `make bench` |\n") == []
    assert get_unlabelled_figures(f"## S\n\n{summary}| g | abc1234 |  | fp32 | x | `make bench` |\n")


def test_engines_page_is_a_manual():
    """docs/engines.md stays a manual (install, models, guarantees, limits); measurements go to bench.md."""
    lines = (ROOT / "docs" / "engines.md").read_text().count("\n")
    assert lines < 400, f"docs/engines.md has {lines} lines; move measurements to docs/bench.md"
