"""Fixtures shared by the store's process tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def store_zygote():
    """One tests/store_child.py zygote for the session: importing torch costs
    seconds on a loaded machine, a forked trial or race costs milliseconds."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("store_child.py")), "zygote"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert json.loads(proc.stdout.readline()) == {"ready": True}
    yield proc
    proc.stdin.close()
    proc.wait(timeout=60)
