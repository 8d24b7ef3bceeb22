"""The shape of impl/, read from its import statements (no module is imported).

- no import cycle between impl modules, lazy imports inside functions included;
- no subsystem imports one above it in :data:`LAYERS`;
- the product imports nothing from the test tree, the properties or the benches;
- no module imports another module's private (``_``) names;
- no code writes, or calls, a private member of an object it does not own
  (``self``, ``cls``, or one it just made of a class of its own module);
- the llama.cpp engine's modules reach no transformers, directly or through impl;
- no class in impl/engines inherits more than one level from another of the
  project's classes (protocols aside): an engine is a lineage book plus a
  backend, not a chain of hooks; and no engine keeps a current lineage;
- no impl file is over 600 lines, and no function over 60.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

IMPL = Path(__file__).resolve().parents[1] / "impl"
PACKAGE = "unsee.impl"

#: The subsystems, lowest first: a module may import its own subsystem and
#: those below it, never one above.
LAYERS = ("util", "engines", "agent", "methods", "store", "eval", "conform", "serve", "cli")
#: The public API, ``from unsee import ...`` (unsee/__init__.py, outside impl/). It
#: re-exports names of several subsystems, so a module that imports it must sit
#: at or above each of them.
PUBLIC_API = "unsee"
PUBLIC_API_PATH = Path(__file__).resolve().parents[1] / "unsee" / "__init__.py"
FORBIDDEN = ("unsee.properties", "unsee.tests", "unsee.bench", "tests", "properties", "bench")
#: private members of other libraries' objects that the engines set, by
#: (file under impl, attribute): transformers reads the attention choice from
#: a config's ``_attn_implementation``; torch keeps a module's buffers in ``_buffers``
FOREIGN_PRIVATE = {("engines/hf/adapter.py", "_attn_implementation"), ("engines/hf/adapter.py", "_buffers")}
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 60


def get_module_name(path: Path) -> str:
    parts = path.relative_to(IMPL).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE,) + parts)


def get_modules() -> dict[str, Path]:
    return {get_module_name(p): p for p in sorted(IMPL.rglob("*.py"))}


def get_imports(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """``(module, names)`` of every import statement, lazy ones included."""
    out = []
    package = get_module_name(path) if path.name == "__init__.py" else get_module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.extend((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            out.append((module, tuple(alias.name for alias in node.names)))
    return out


def get_edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the impl modules it imports (``from pkg import mod`` counts as mod)."""
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for module, names in get_imports(path):
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in modules] or [module]
            edges[name].update(t for t in targets if t in modules and t != name)
    return edges


def get_subsystem(module: str) -> str:
    return module.removeprefix(PACKAGE + ".").split(".")[0]


def get_public_api_subsystems() -> set[str]:
    """The subsystems whose names the public API re-exports, read from its ``_EXPORTS``."""
    for node in ast.parse(PUBLIC_API_PATH.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            return {get_subsystem(module) for module in ast.literal_eval(node.value).values()}
    raise AssertionError(f"{PUBLIC_API_PATH.name} has no _EXPORTS")


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the list of modules along it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle():
    cycle = find_cycle(get_edges(get_modules()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_upward_import():
    modules = get_modules()
    bad = []
    for name, targets in get_edges(modules).items():
        here = get_subsystem(name)
        if name == PACKAGE:
            continue
        assert here in LAYERS, f"{name}: subsystem {here!r} is not in LAYERS {LAYERS}"
        for target in targets:
            there = get_subsystem(target)
            if target == PACKAGE or LAYERS.index(there) > LAYERS.index(here):
                bad.append(f"{name} -> {target}")
        if any(module == PUBLIC_API for module, _ in get_imports(modules[name])):
            bad.extend(f"{name} -> {PUBLIC_API} (re-exports {there})" for there in get_public_api_subsystems()
                       if LAYERS.index(there) > LAYERS.index(here))
    assert not bad, "imports that point up: " + ", ".join(sorted(bad))


def test_product_imports_no_test_tree():
    bad = [f"{name} -> {module}" for name, path in get_modules().items() for module, _ in get_imports(path)
           if module.startswith(FORBIDDEN) or module.split(".")[0] in ("tests", "properties", "bench")]
    assert not bad, ", ".join(bad)


def test_no_private_name_imports():
    bad = [f"{name}: {module} {n}" for name, path in get_modules().items() for module, names in get_imports(path)
           if module.startswith(PACKAGE) for n in names if n.startswith("_") and n != "__version__"]
    assert not bad, ", ".join(bad)


def get_owned(function: ast.AST, classes: set[str]) -> set[str]:
    """The names in ``function`` bound to objects it owns: ``self``, ``cls``,
    and locals it assigned a new instance of ``cls``, ``type(self)`` or a
    class of its module (``classes``)."""
    owned = {"self", "cls"}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            made = node.value.func
            if ((isinstance(made, ast.Name) and made.id in classes | {"cls"})
                    or (isinstance(made, ast.Call) and ast.unparse(made) == "type(self)")):
                owned.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return owned


def find_private_reaches(path: Path, root: Path = IMPL) -> list[str]:
    """Writes to, and calls of, a private member of an object ``path``'s code does not own."""
    tree = ast.parse(path.read_text())
    classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    where = str(path.relative_to(root))
    bad = []
    for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        owned = get_owned(function, classes)
        for node in ast.walk(function):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                target = node.value  # x._items[k] = v writes x._items
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                target = node
            elif isinstance(node, ast.Call):
                target = node.func
            else:
                continue
            if (isinstance(target, ast.Attribute) and target.attr.startswith("_") and not target.attr.startswith("__")
                    and isinstance(target.value, ast.Name) and target.value.id not in owned
                    and (where, target.attr) not in FOREIGN_PRIVATE):
                bad.append(f"{where}:{node.lineno} {ast.unparse(target)}")
    return bad


def test_no_private_member_of_another_object_is_written():
    """A runtime (or any object) changes only through its own verbs: forget
    adopts a replay's state as a value instead of writing into the replay."""
    bad = [line for path in sorted(IMPL.rglob("*.py")) for line in find_private_reaches(path)]
    assert not bad, "private members reached on objects the code does not own: " + ", ".join(bad)


def test_private_member_check_sees_what_it_forbids(tmp_path):
    """The check above finds writes and calls on another object, and passes
    those on ``self`` and on an instance the code just made."""
    path = tmp_path / "agent.py"
    path.write_text("class A:\n"
                    "    def f(self, other):\n"
                    "        other._x = 1\n        other._y[0] = 2\n        other._go()\n"
                    "        self._z = 3\n        mine = A()\n        mine._w = 4\n        mine._go()\n")
    assert find_private_reaches(path, tmp_path) == ["agent.py:3 other._x", "agent.py:4 other._y",
                                                    "agent.py:5 other._go"]


def test_llamacpp_engine_needs_no_transformers():
    modules = get_modules()
    edges = get_edges(modules)
    start = [m for m in modules if m.startswith(f"{PACKAGE}.engines.llamacpp")]
    seen, todo = set(), list(start)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(edges[m])
    bad = [f"{m} imports {module}" for m in sorted(seen) for module, _ in get_imports(modules[m])
           if module.split(".")[0] == "transformers" or module.startswith(f"{PACKAGE}.engines.hf")]
    assert not bad, ", ".join(bad)


def get_class_bases(root: Path) -> dict[str, list[str]]:
    """Class name -> the names of its bases, for every class under ``root``
    that is not a protocol (a base spelled ``a.B`` counts as ``B``)."""
    out: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
                if "Protocol" not in names:
                    out[node.name] = names
    return out


def test_engine_classes_inherit_one_level_at_most():
    bases = get_class_bases(IMPL / "engines")

    def depth(name: str) -> int:
        return max((1 + depth(b) for b in bases.get(name, []) if b in bases), default=0)

    deep = {name: depth(name) for name in bases if depth(name) > 1}
    assert not deep, f"classes more than one level below another of impl/engines: {deep}"


def test_no_engine_keeps_a_current_lineage():
    found = [f"{p.relative_to(IMPL)}:{i}" for p in sorted(IMPL.rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"_current\b", line)]
    assert not found, f"a cursor over lineages: {found}"


@pytest.mark.parametrize("path", sorted(IMPL.rglob("*.py")), ids=lambda p: str(p.relative_to(IMPL)))
def test_file_and_function_sizes(path: Path):
    lines = path.read_text().count("\n")
    assert lines <= MAX_FILE_LINES, f"{path.name}: {lines} lines > {MAX_FILE_LINES}"
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines, line {n.lineno})"
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"
