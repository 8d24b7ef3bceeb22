"""Optional packages: which of them this install can import."""

from __future__ import annotations

import importlib


def get_missing_module(*modules: str) -> str | None:
    """The first of ``modules`` that cannot be imported here (a missing or
    broken install), or None. Imported for real, not looked up: a package
    that is found but fails to import would fail the run later just the same."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            return module
    return None


__all__ = ["get_missing_module"]
