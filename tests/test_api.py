"""The public API: ``from unsee import ...`` gives every name it lists, lazily."""

from __future__ import annotations

import subprocess
import sys

import unsee


def test_every_public_name_resolves():
    missing = [name for name in unsee.__all__ if getattr(unsee, name, None) is None]
    assert not missing, missing


def test_import_unsee_loads_no_torch():
    code = "import sys, unsee, unsee.spec; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
