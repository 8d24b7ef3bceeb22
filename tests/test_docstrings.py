"""Every ``:func:``, ``:meth:``, ``:class:`` and ``:exc:`` reference in a docstring
under impl/ and bench/ names something that exists.

A target is resolved as Sphinx would look it up, by import and ``getattr``:
against the enclosing class (for a method's docstring; for a module's, the
classes the module defines, where the target is a bare name), the module's own
namespace (names imported under ``TYPE_CHECKING`` included), the module's
package (``runtime.AgentRuntime`` from a sibling module), then as an absolute
dotted path and the builtins. A leading ``~`` (show the last part) and ``.``
(search the current module first) are stripped; they change the display only.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: folder -> the package it is importable as
FOLDERS = {"impl": "unsee.impl", "bench": "unsee.bench"}
ROLE = re.compile(r":(func|meth|class|exc):`([^`]+)`")
#: third-party libraries an optional engine or bench needs; a module that cannot
#: be imported without one is skipped, not failed
OPTIONAL = ("vllm", "llama_cpp", "google", "mem0", "matplotlib", "agentdojo", "langgraph", "agents", "langchain", "crewai", "autogen")


def get_modules() -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            out[".".join((package,) + parts)] = path
    return out


def get_references(tree: ast.Module) -> list[tuple[int, tuple[str, ...], str, str]]:
    """``(line, enclosing classes, role, target)`` of every role in a docstring."""
    out = []

    def visit(node: ast.AST, classes: tuple[str, ...]) -> None:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            here = classes + (node.name,) if isinstance(node, ast.ClassDef) else classes
            if doc:
                start = node.body[0].lineno
                out.extend((start + doc[:m.start()].count("\n"), here, m[1], m[2].strip()) for m in ROLE.finditer(doc))
            for child in node.body:
                visit(child, here if isinstance(node, ast.ClassDef) else classes)
        elif isinstance(node, (ast.If, ast.Try)):
            for child in ast.iter_child_nodes(node):
                visit(child, classes)

    visit(tree, ())
    return out


def get_type_checking_names(tree: ast.Module, module: str) -> dict[str, str]:
    """Name -> dotted path of what ``if TYPE_CHECKING:`` imports (absent at run time)."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    out = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.ImportFrom):
                base = importlib.util.resolve_name("." * sub.level + (sub.module or ""), package)
                out.update({a.asname or a.name: f"{base}.{a.name}" for a in sub.names})
            elif isinstance(sub, ast.Import):
                out.update({a.asname or a.name: a.name for a in sub.names})
    return out


def get_attribute(obj: object, parts: list[str]) -> bool:
    """Whether ``obj.parts[0].parts[1]...`` exists (an attrs or dataclass field counts)."""
    for part in parts:
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        fields = getattr(obj, "__attrs_attrs__", None) or getattr(obj, "__dataclass_fields__", {})
        names = {f.name for f in fields} if isinstance(fields, tuple) else set(fields)
        return part in names and part == parts[-1]
    return True


def get_absolute(dotted: str) -> bool:
    """Whether a dotted path names a module or something inside one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ImportError as error:
            if (error.name or "").split(".")[0] in OPTIONAL and ".".join(parts[:cut]) in MODULES:
                return is_defined(MODULES[".".join(parts[:cut])], parts[cut:])
            continue
        return get_attribute(module, parts[cut:])
    return False


def is_defined(path: Path, parts: list[str]) -> bool:
    """Whether a module that needs an absent optional library defines ``parts``
    (read from its source: a top-level def, class or assignment, then a class's)."""
    body = ast.parse(path.read_text()).body
    for part in parts:
        found = [node for node in body if getattr(node, "name", None) == part
                 or any(getattr(t, "id", None) == part for t in getattr(node, "targets", ()))]
        if not found:
            return False
        body = getattr(found[0], "body", [])
    return True


def resolves(target: str, module, classes: tuple[str, ...], hidden: dict[str, str]) -> bool:
    target = target.partition("<")[2].rstrip(">") if target.endswith(">") else target  # "title <target>"
    dotted = target.lstrip("~").lstrip(".").removesuffix("()")
    parts = dotted.split(".")
    scopes = []
    for depth in range(len(classes), 0, -1):  # the innermost class first
        obj = module
        if get_attribute(module, list(classes[:depth])):
            for name in classes[:depth]:
                obj = getattr(obj, name)
            scopes.append(obj)
    if not classes and len(parts) == 1:  # a module's docstring may name a method of a class it defines
        scopes += [obj for obj in vars(module).values()
                   if isinstance(obj, type) and obj.__module__ == module.__name__]
    scopes += [module, builtins]
    if any(get_attribute(scope, parts) for scope in scopes):
        return True
    if parts[0] in hidden:
        return get_absolute(".".join([hidden[parts[0]]] + parts[1:]))
    package = module.__name__ if hasattr(module, "__path__") else module.__name__.rpartition(".")[0]
    while package:
        if get_absolute(f"{package}.{dotted}"):
            return True
        package = package.rpartition(".")[0]
    return get_absolute(dotted)


MODULES = get_modules()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_docstring_references_resolve(name):
    tree = ast.parse(MODULES[name].read_text())
    references = get_references(tree)
    if not references:
        return
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        if (error.name or "").split(".")[0] in OPTIONAL:
            pytest.skip(f"{name} needs {error.name}")
        raise
    hidden = get_type_checking_names(tree, name)
    dead = [f"{MODULES[name].relative_to(ROOT)}:{line}: :{role}:`{target}`"
            for line, classes, role, target in references if not resolves(target, module, classes, hidden)]
    assert not dead, "dead docstring references:\n" + "\n".join(dead)


def test_a_dead_reference_is_found():
    """The resolver is not a test that cannot fail."""
    module = importlib.import_module("unsee.impl.agent.state")
    assert resolves("RuntimeState", module, (), {})
    assert resolves("~unsee.impl.agent.runtime.AgentRuntime.forget", module, (), {})
    assert not resolves("RuntimeState.no_such_verb", module, (), {})
    assert not resolves("unsee.impl.agent.no_such_module.thing", module, (), {})
