"""Fixtures shared by the tests: thread count, models and engines, the store's zygote.

- ``one_thread`` (module): torch on one intra-op thread for the module, then
  the count before; a module that needs it throughout says
  ``pytestmark = pytest.mark.usefixtures("one_thread")``.
- ``tiny_model`` (session): the tiny model, loaded once.
- ``lm`` (module): the tiny model, with the module on one thread (the name
  most test files use for it).
- ``tiny_engine``: a fresh engine over the shared tiny model, per test.
- ``engine_factory`` (session): ``engine_factory(model="tiny", kv_budget=None,
  **options)``, a fresh engine over a shared model of another name
  (``tiny-ties``, ``smollm2``, ``llamacpp-tiny``), budget or dtype.

Engines are built by :mod:`unsee.properties.engines` through the registry
(:mod:`unsee.impl.engines.registry`), never by hand. Subprocess children
(``store_child.py``, ``concurrency_child.py``) set their own threads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from unsee.impl.engines.registry import make_engine
from unsee.properties import engines
from unsee.properties.differential import torch_threads

#: llama.cpp's decode threads for the suite: one, as torch's (the loader's default is every core
#: where the library has the split switch, each step whole on one thread for one thread's bits:
#: impl/engines/llamacpp/kernels.py, docs/bench.md "Decode on every core"; the tests about threads
#: set their own). On a shared 2-core machine a second spinning worker slows
#: the tiny files' forwards many times over (tests/test_llamacpp_threads.py: 117 s at load 9)
os.environ.setdefault("UNSEE_LLAMA_THREADS", "1")


@pytest.fixture(scope="module")
def one_thread():
    """torch on one intra-op thread for the module, then the count before:
    on a shared 2-core machine OpenMP's spinning workers slow the tiny model
    10-100x (see :func:`~unsee.properties.differential.torch_threads`)."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def tiny_model():
    """The tiny model (CPU, fp32), loaded once for the session."""
    return engines.get_model("tiny")


@pytest.fixture(scope="module")
def lm(one_thread, tiny_model):
    """The tiny model, with this module's torch on one thread."""
    return tiny_model


@pytest.fixture(scope="module")
def qwen_style(lm):
    """The tiny model under the Qwen-style template tests/test_render.py writes for its tool tests
    (tools in the system block, calls in `<tool_call>` JSON, written as text by its byte tokenizer;
    loaded from its file: the tests are imported in importlib mode, not as a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("test_render_helpers", Path(__file__).with_name("test_render.py"))
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    return render.chatml_model(lm, render.TOOL_DEFS_TEMPLATE)


@pytest.fixture
def tiny_engine(lm):
    """A fresh engine over the shared tiny model, on one thread."""
    return make_engine(lm)


@pytest.fixture(scope="session")
def engine_factory():
    """``build(model="tiny", kv_budget=None, **options)``: a fresh engine over
    a shared model of that name and options (:func:`unsee.properties.engines.make_engine`)."""
    return engines.make_engine


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
