"""Table 1 on several engines in one run (``bench/paper.py --engines``;
issue 20 item 9, issue 21's "Done when").

Each name of ``--engines`` is built through the registry
(impl/engines/registry.py ``load_engine``), all of them before any work, so a
name whose optional extra is missing stops the run with that extra's install
hint before a single table is measured:

* a backend (:data:`~unsee.impl.engines.registry.BACKENDS`: ``transformers``,
  ``llamacpp``, and any backend registered later) runs ``--model`` on it
  (``--device`` and ``--dtype`` go to transformers only);
* a one-word engine name (:data:`~unsee.impl.engines.registry.ENGINE_NAMES`,
  e.g. ``llamacpp-tiny``) is built as the registry defines it.

:func:`render_engines` puts the engines' Table 1 side by side, one table per
session shape: every method's prefilled, decoded and cached (prefix-cache
served) tokens, wall p50, the forget over the reset and over the compute floor
as same-round ratios, and the model turns the forget changed.
"""

from __future__ import annotations

from collections.abc import Mapping

from unsee.impl.engines import registry
from unsee.impl.engines.protocol import Engine
from unsee.impl.eval.report import fmt, render_table


def get_engine_spec(name: str, model: str, device: str, dtype: str) -> tuple[str, str, dict]:
    """``(backend, model, options)`` that ``name`` (a backend or a one-word
    engine name) stands for; a ValueError naming both lists otherwise."""
    if name in registry.BACKENDS:
        options = {"device": device, "dtype": dtype} if name == "transformers" else {}
        return name, model, options
    if name in registry.ENGINE_NAMES:
        backend, named_model = registry.parse_engine_name(name)
        return backend, named_model, ({"device": device, "dtype": dtype} if backend == "transformers" else {})
    raise ValueError(f"engine {name!r} is neither a backend {registry.BACKENDS} nor an engine name "
                     f"{tuple(registry.ENGINE_NAMES)}")


def parse_engines(text: str) -> list[str]:
    """The comma-separated names of ``--engines``, each once, in order; a
    ValueError for an empty list."""
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise ValueError(f"--engines {text!r}: expected one or more comma-separated engine names")
    return names


def load_engines(names: list[str], model: str, device: str, dtype: str) -> dict[str, Engine]:
    """Every engine of ``names``, loaded now: an unknown name (ValueError) or
    a missing extra (the backend's ImportError, with its install hint) fails
    here, before any measurement."""
    specs = {name: get_engine_spec(name, model, device, dtype) for name in names}
    return {name: registry.load_engine(m, backend, **options) for name, (backend, m, options) in specs.items()}


def describe_engine(name: str, result: Mapping) -> str:
    return f"{name} ({result['model']}, {result['device']} {result['dtype']})"


#: Table 1's methods in the side-by-side table, with the paper's names.
METHOD_NAMES = {"reset": "B5 reset", "reset-prefix-cache": "B5' prefix cache", "replay-oracle": "B7-oracle",
                "replay": "B7 forget (ours)"}


def _ratio(walls: list[dict], name: str) -> str:
    row = next((w for w in walls if w["ratio"] == name), None)
    return "-" if row is None else f"{row['p50']:.2f}x"


def _engine_rows(name: str, result: Mapping, table: Mapping) -> list[list[str]]:
    label = describe_engine(name, result)
    rows = []
    for method, m in table["methods"].items():
        ours = method in ("replay", "replay-oracle")
        prefix = "B7" if method == "replay" else "B7-oracle"
        rows.append([label, METHOD_NAMES.get(method, method), str(m["prefilled_tokens"]), str(m["decoded_tokens"]),
                     str(m.get("reused_tokens", 0)), str(m["recomputed_tokens"]), fmt(m["wall_p50_s"], 2),
                     _ratio(table["walls"], f"{prefix}/B5") if ours else "-",
                     _ratio(table["walls"], f"{prefix}/floor") if ours else "-", str(m["equal_to_reset"])])
    f = table.get("floor")
    if f:
        rows.append([label, "compute floor", str(f["prefilled"]), str(f["decoded"]), "0", str(f["recomputed"]),
                     fmt(f["wall_p50_s"], 2), "-", "1.00x", "-"])
    return rows


def _changed(name: str, result: Mapping, table: Mapping) -> str:
    c = (table.get("floor") or {}).get("changed")
    if not c:
        return f"- {name}: -"
    return (f"- {name}: tau = {table['tau']}, {table.get('prefix_tokens', '-')} tokens kept before the restore "
            f"boundary, {table.get('suffix_tokens', '-')} after it; the forget changed {c['changed']} of the "
            f"{c['turns']} model turns after the boundary ({c['dependent_changed']} of {c['dependent']} that ask "
            f"about the target, {c['independent_changed']} labelled independent)")


def _ratio_rows(name: str, result: Mapping, table: Mapping) -> list[list[str]]:
    """B5/B7 and B5'/B7 on decoded tokens and on Recomp, beside the paper's."""
    rows = []
    for r in table.get("ratios", []):
        if r["method"] == "replay":
            rows.append([describe_engine(name, result), r["ratio"], f"{r['decoded_tokens']:.2f}x",
                         f"{r['prefilled_tokens']:.2f}x", f"{r['recomputed_tokens']:.2f}x", f"{r['paper']:.1f}x"])
    return rows


def render_engines(results: Mapping[str, Mapping], table_names: Mapping[str, str]) -> list[str]:
    """Markdown: for each Table 1 shape (``table_names``: key in ``tables`` ->
    title), every engine's methods side by side, then what changed per engine."""
    lines = []
    for key, title in table_names.items():
        measured = {n: r for n, r in results.items() if key in r["tables"]}
        if not measured:
            continue
        lines += [f"### Table 1 on {len(measured)} engines: {title}", ""]
        rows = [row for n, r in measured.items() for row in _engine_rows(n, r, r["tables"][key])]
        lines += render_table(("engine", "method", "prefilled", "decoded", "cached", "recomputed", "wall p50 s",
                               "x reset (same-round p50)", "x floor (same-round p50)", "digest = reset"), rows)
        lines += ["", "Each reference over the forget (B7, ours), beside the paper's Recomp ratios:", ""]
        lines += render_table(("engine", "ratio", "decoded tokens", "prefilled tokens", "Recomp (prefilled + decoded)",
                               "paper (Recomp)"),
                              [row for n, r in measured.items() for row in _ratio_rows(n, r, r["tables"][key])])
        lines += ["", "Turns the forget changed:", ""]
        lines += [_changed(n, r, r["tables"][key]) for n, r in measured.items()] + [""]
    return lines
