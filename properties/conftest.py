"""Fixtures shared by the properties.

Hypothesis runs many examples per test and refuses function-scoped
fixtures, so the properties take their engines from
:mod:`unsee.properties.engines` (``make_engine("tiny")``, one model per
process) and their thread count from the module-scoped :func:`one_thread`
(``pytestmark = pytest.mark.usefixtures("one_thread")``).
"""

from __future__ import annotations

import pytest

from unsee.properties.differential import torch_threads


@pytest.fixture(scope="module")
def one_thread():
    """torch on one intra-op thread for the module, then the count before
    (see :func:`~unsee.properties.differential.torch_threads` for why)."""
    with torch_threads(1):
        yield
