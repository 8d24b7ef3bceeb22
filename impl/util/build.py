"""Which build of unsee is running: every figure names its build (the brief), so
rows and reports record it rather than leave it to memory."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path


@functools.cache
def get_build() -> str:
    """The git commit of this checkout, short, with ``+dirty`` where its Python
    files differ from it (docs do not change what runs); the installed
    package's version where unsee is not a git checkout. Read once per
    process: call it when the process starts work, not after, since the
    checkout may move on while a long run goes (its code stays what it loaded)."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", "*.py"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"unsee {version('unsee')}"
        except PackageNotFoundError:
            return "unknown"
    return commit + ("+dirty" if dirty else "")


__all__ = ["get_build"]
