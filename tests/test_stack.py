"""How deep a forget reaches into the project before the model runs: the
Python stack recorded inside the model's forward during
``AgentRuntime.forget``, on the tiny transformers model and on llama.cpp's
tiny GGUF. Between ``forget`` and the forward there are at most
:data:`MAX_FRAMES` frames in the project's code, across at most
:data:`MAX_FILES` files (issue 39: a forget that reads like the algorithm
does not wind through a chain of hooks).

Since issue 50 every forward is computed by the engine's loop thread
(impl/engines/scheduler.py) for the thread that asked: the path is that
thread's stack down to its submission, then the loop's from the job it runs
(:func:`get_path_stack`), the loop's own waiting frames left out."""

from __future__ import annotations

import contextlib
import sys
import threading
import traceback
from pathlib import Path

import pytest

import unsee
from unsee.impl.agent.episode import load_episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.llamacpp import engine as llamacpp
from unsee.impl.engines.llamacpp.model import llama_module
from unsee.impl.engines.scheduler import get_requester
from unsee.properties.engines import make_engine

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(unsee.__file__).resolve().parents[1]
#: the folders the ``unsee`` package is installed from (pyproject.toml's package-dir)
PACKAGE_DIRS = tuple(ROOT / d for d in ("unsee", "spec", "impl", "properties", "proofs", "bench"))
EPISODE = ROOT / "examples" / "secret_in_tool_result.json"
MAX_FRAMES = 12
#: issue 39's bar, not met since issue 50's loop (see below): held by an xfail that fails when it is met again
ISSUE_39_FRAMES = 10
MAX_FILES = 12
#: Measured when the bar was met (issue 39): forget -> run -> step -> _answer
#: on the agent side, then generate, the turn procedure, its decode loop, the
#: backend's forward and the model call: 10 frames on transformers (a guess
#: verified while decoding after a draft), 9 on llama.cpp, across 5 and 4 files.
#: Issue 50's loop adds two frames, the submission (Scheduler.run) and the loop's run of the
#: job (Scheduler._execute): 12 frames on transformers, 11 on llama.cpp, across 6 and 5 files
#: (the 10-frame bar of issue 39 is no longer met, by those two frames; the files bar is). MAX_FRAMES
#: holds today's depth against further growth; :func:`test_issue_39_frame_bar` reports the old bar as unmet.


def get_path_stack() -> list[traceback.FrameSummary]:
    """The stack of the forward being computed, as one path: on the loop thread, the requesting
    thread's stack (blocked in its submission) and then the loop's, from the job it runs."""
    own = traceback.extract_stack()
    requester = get_requester()
    if requester == threading.get_ident():
        return own
    start = next(i for i, f in enumerate(own) if f.name == "_execute")
    return traceback.extract_stack(sys._current_frames()[requester]) + own[start:]


def is_project(filename: str) -> bool:
    path = Path(filename).resolve()
    return any(path.is_relative_to(d) for d in PACKAGE_DIRS)


def get_forget_frames(stack: list[traceback.FrameSummary]) -> list[traceback.FrameSummary]:
    """The project's frames from the outermost ``forget`` of the agent down to
    the innermost project frame (the one that called into the model)."""
    starts = [i for i, f in enumerate(stack) if f.name == "forget" and is_project(f.filename)
              and "/agent/" in Path(f.filename).as_posix()]
    if not starts:
        return []
    return [f for f in stack[starts[0]:] if is_project(f.filename)]


def render(frames: list[traceback.FrameSummary]) -> str:
    return "\n".join(f"  {Path(f.filename).resolve().relative_to(ROOT)}:{f.lineno} {f.name}" for f in frames)


def check_forget_depth(engine, install_probe) -> tuple[int, int]:
    """Run the example episode, forget its target with a probe inside the
    model's forward, and check the deepest stack seen; returns (frames, files)."""
    ep = load_episode(EPISODE)
    runtime = AgentRuntime.from_episode(engine, ep)
    seen: list[list[traceback.FrameSummary]] = []
    with install_probe(lambda: seen.append(get_forget_frames(get_path_stack()))):
        runtime.forget(ep.target.source)
    assert seen and all(seen), "no model forward ran inside the forget"
    deepest, shallowest = max(seen, key=len), min(seen, key=len)
    files = {f.filename for f in deepest}
    why = (f"{len(seen)} forwards; the deepest: {len(deepest)} frames across {len(files)} files from forget "
           f"to the model's forward:\n{render(deepest)}\nthe shallowest: {len(shallowest)} frames across "
           f"{len({f.filename for f in shallowest})} files:\n{render(shallowest)}")
    print(why)
    assert len(deepest) <= MAX_FRAMES and len(files) <= MAX_FILES, why
    return len(deepest), len(files)


def get_transformers_probe(engine):
    """A probe that records inside the tiny transformers model's forward."""
    @contextlib.contextmanager
    def probe(record):
        handle = engine.lm.model.register_forward_pre_hook(lambda module, args: record())
        try:
            yield
        finally:
            handle.remove()

    return probe


def test_a_forget_on_transformers_is_shallow():
    engine = make_engine("tiny")
    check_forget_depth(engine, get_transformers_probe(engine))


@pytest.mark.xfail(strict=True, reason="issue 50's loop adds two frames: 12 on transformers against issue 39's 10")
def test_issue_39_frame_bar():
    engine = make_engine("tiny")
    frames, _ = check_forget_depth(engine, get_transformers_probe(engine))
    assert frames <= ISSUE_39_FRAMES


@pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed")
def test_a_forget_on_llamacpp_is_shallow(monkeypatch):
    engine = make_engine("llamacpp-tiny")
    lc = llama_module()
    decode = lc.llama_decode

    @contextlib.contextmanager
    def probe(record):
        def recorded(*args):
            record()
            return decode(*args)

        with monkeypatch.context() as m:
            m.setattr(lc, "llama_decode", recorded)
            yield

    check_forget_depth(engine, probe)


#: the server's path: from the DELETE route (impl/serve/app.py) to llama.cpp's forward, in files (issue 50)
MAX_SERVER_FILES = 12


def get_route_frames(stack: list[traceback.FrameSummary]) -> list[traceback.FrameSummary]:
    """The project's frames from the DELETE route's work in its worker thread (``held`` in
    impl/serve/app.py, which ``delete_item`` hands to the thread pool) to the forward."""
    starts = [i for i, f in enumerate(stack) if f.name == "held" and Path(f.filename).name == "app.py"]
    return [f for f in stack[starts[0]:] if is_project(f.filename)] if starts else []


@pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed")
def test_a_delete_through_the_server_reaches_the_forward_in_at_most_12_files(monkeypatch, tmp_path):
    openai = pytest.importorskip("openai")
    from unsee import Settings
    from unsee.impl.serve.pool import Pool
    from unsee.impl.serve.server import ServerThread

    lc = llama_module()
    decode, seen = lc.llama_decode, []

    def recorded(*args):
        seen.append(get_route_frames(get_path_stack()))
        return decode(*args)
    pool = Pool(make_engine("llamacpp-tiny"), tmp_path, defaults=Settings(max_new_tokens=4))
    with ServerThread(pool, "tiny") as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        conv = client.conversations.create(items=[{"type": "message", "role": "user", "content": "My code is 4417.",
                                                   "id": "u1"}])
        client.responses.create(model="tiny", conversation=conv.id, input="And what is the weather?")
        with monkeypatch.context() as m:
            m.setattr(lc, "llama_decode", recorded)
            client.conversations.items.delete("u1", conversation_id=conv.id)
    paths = [p for p in seen if p]
    assert paths, "no forward ran inside the DELETE"
    deepest = max(paths, key=lambda p: len({f.filename for f in p}))
    files = {f.filename for f in deepest} | {str(ROOT / "impl" / "serve" / "app.py")}  # delete_item, its route
    print(f"{len(paths)} forwards; the widest: {len(files)} files:\n{render(deepest)}")
    assert len(files) <= MAX_SERVER_FILES, render(deepest)
