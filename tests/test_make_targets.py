"""Every target the docs name parses: ``make -n TARGET`` expands its
prerequisites and recipe without running them. A variable a rule's
prerequisites name must be set above that rule (make expands prerequisites as
it reads the rule), which is how ``make flake`` once stopped at
``No rule to make target '/.installed'``."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PHONY = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE).group(1).split()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
@pytest.mark.parametrize("target", PHONY)
def test_a_target_expands(target):
    done = subprocess.run(["make", "-n", target], check=False, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "No rule to make target" not in done.stderr, f"make -n {target}:\n{done.stderr}"
    assert done.returncode == 0, f"make -n {target} exited {done.returncode}:\n{done.stderr}"
