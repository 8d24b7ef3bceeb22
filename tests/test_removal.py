"""Every route that removes data leaves none of it on disk after a restart
(issue 37): a forget by the CLI and by the Python API, and the server's
DELETE of an answered item, of a tool output, of a waiting item and of a
whole conversation.

Each route runs, the process or server is restarted (a new process for the
CLI, the session reopened, a new server on the same folder), and every byte
of every file under the implementation's folder (stores, SQLite's side
files, sidecars, anything else written there) is scanned for the removed
text with the one residue matcher (:func:`unsee.impl.store.records.find_residue`:
the value, its normalised variants and its token ids), less what a twin that
never had the item keeps. Each route also runs once with its removal skipped,
and the same scan must then find the text: the scan can fail."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from unsee import AgentRuntime, Item, PersistentSession, Settings, Step
from unsee.impl.cli.main import main
from unsee.impl.engines.registry import make_engine
from unsee.impl.serve.conversation import Conversation
from unsee.impl.serve.pool import Pool
from unsee.impl.serve.server import ServerThread
from unsee.impl.store.records import find_residue
from unsee.impl.store.session import PersistentSession as StoredSession

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "secret_in_tool_result.json"
SECRET = "4417 Elm Street"
SECRET_ITEM = f"The party will be held at {SECRET}."
SETTINGS = Settings(max_new_tokens=6)


def scan(root: Path, encode) -> dict[str, list[str]]:
    """The findings of :data:`SECRET` in every file under ``root``, by needle."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    found: dict[str, list[str]] = {}
    for line in find_residue(files, SECRET, encode):
        found.setdefault(line.split(" in ", 1)[0], []).append(line)
    return found


def get_residue(root: Path, twin: Path | None, encode) -> list[str]:
    """What ``root`` keeps of the secret beyond what the twin's folder keeps."""
    baseline = scan(twin, encode) if twin is not None else {}
    return sorted(line for needle, lines in scan(root, encode).items() if needle not in baseline for line in lines)


def skip_commit(monkeypatch) -> None:
    """A forget that never reaches the disk: the runtime forgets, the store keeps the old rows."""
    monkeypatch.setattr(StoredSession, "_commit_forget", lambda self, report: report)


# --- a forget by the CLI and by the Python API -----------------------------------------------

def run_stored(folder: Path, forget: bool) -> Path:
    """``unsee run`` of the example into a store in ``folder``, then (with ``forget``)
    ``unsee forget`` in a process of its own."""
    folder.mkdir()
    store = folder / "s.db"
    assert main(["run", str(EXAMPLE), "--model", "tiny", "--method", "none", "--store", str(store), "--json"]) == 0
    if forget:
        done = subprocess.run([sys.executable, "-m", "unsee.impl.cli", "forget", str(store), "--forget",
                               "notes.address", "--json"], capture_output=True, text=True, check=False, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    return store


def test_a_cli_forget_leaves_nothing_on_disk(lm, tmp_path, capsys):
    store = run_stored(tmp_path / "forgot", forget=True)
    capsys.readouterr()
    assert get_residue(store.parent, None, lm.encode) == []
    # the store reopens as the forgotten session in this (another) process
    with PersistentSession.open(store, make_engine(lm)) as session:
        assert "notes.address" in session.runtime.forgotten


def test_a_cli_forget_that_skips_its_commit_is_seen(lm, tmp_path, monkeypatch, capsys):
    store = run_stored(tmp_path / "skipped", forget=False)
    skip_commit(monkeypatch)
    assert main(["forget", str(store), "--forget", "notes.address", "--json"]) == 0
    capsys.readouterr()
    assert get_residue(store.parent, None, lm.encode)


def python_session(folder: Path, lm, secret: bool) -> Path:
    folder.mkdir()
    path = folder / "dana.db"
    steps = [Step("s1", "user", (Item("u1", "Hi, I am Dana."),)),
             Step("s2", "user", (Item("u2", SECRET_ITEM),) if secret else ()),
             Step("s3", "user", (Item("u3", "What should I cook tonight?"),))]
    with PersistentSession.create(path, AgentRuntime.start(make_engine(lm), system="Be brief.",
                                                           settings=SETTINGS)) as session:
        session.run(steps)
    return path


@pytest.mark.parametrize("skipped", [False, True], ids=["forget", "forget-skipped"])
def test_a_python_forget_leaves_nothing_on_disk_after_reopening(lm, tmp_path, monkeypatch, skipped):
    path = python_session(tmp_path / "forgot", lm, secret=True)
    twin = python_session(tmp_path / "twin", lm, secret=False)
    if skipped:
        skip_commit(monkeypatch)
    with PersistentSession.open(path, make_engine(lm)) as session:
        session.forget("u2")
    with PersistentSession.open(path, make_engine(lm)) as session:  # the restart: what the store holds
        assert (session.digest() == PersistentSession.open(twin, make_engine(lm)).digest()) is not skipped
    assert bool(get_residue(path.parent, twin.parent, lm.encode)) is skipped


# --- the server's DELETE routes --------------------------------------------------------------------

def user(item_id: str, text: str) -> dict:
    return {"type": "message", "role": "user", "content": text, "id": item_id}


def tool_output(item_id: str, text: str) -> dict:
    return {"type": "function_call_output", "call_id": "call_1", "output": text, "id": item_id, "name": "lookup"}


def serve(lm, root: Path, work) -> object:
    """``work(client, server)`` on a server over ``root``, then the server stopped."""
    with ServerThread(Pool(make_engine(lm), root, defaults=SETTINGS), "tiny") as srv:
        return work(openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0), srv)


def converse(client, secret: dict | None, answered: bool) -> str:
    """A conversation with the secret's item answered (or waiting); its id."""
    conv = client.conversations.create(items=[user("u1", "Hi, I am Dana.")])
    client.responses.create(model="tiny", conversation=conv.id)
    if answered:
        client.responses.create(model="tiny", conversation=conv.id, input=[secret] if secret else [])
        client.responses.create(model="tiny", conversation=conv.id, input=[user("u3", "Where is the party?")])
    elif secret is not None:
        client.conversations.items.create(conv.id, items=[secret])
    return conv.id


#: route -> (the secret's item, answered before the DELETE, what the DELETE removes)
ROUTES = {"answered item": (user("u2", SECRET_ITEM), True, "item"),
          "tool output": (tool_output("t2", SECRET_ITEM), True, "item"),
          "waiting item": (user("u2", SECRET_ITEM), False, "item"),
          "conversation": (user("u2", SECRET_ITEM), True, "conversation")}


def skip_removal(monkeypatch, route: str) -> None:
    """The route's removal, skipped: the forget never committed, the waiting
    item's sidecar never rewritten, the conversation's folder never removed."""
    if route in ("answered item", "tool output"):
        skip_commit(monkeypatch)
    elif route == "waiting item":
        monkeypatch.setattr(Conversation, "save", lambda self, record: setattr(self, "record", record))
    else:
        import unsee.impl.serve.pool as pool_module

        monkeypatch.setattr(pool_module, "shutil", types.SimpleNamespace(rmtree=lambda *a, **k: None))


@pytest.mark.parametrize("skipped", [False, True], ids=["removed", "removal-skipped"])
@pytest.mark.parametrize("route", sorted(ROUTES))
def test_every_delete_leaves_nothing_on_disk_after_a_restart(lm, tmp_path, monkeypatch, route, skipped):
    secret, answered, what = ROUTES[route]
    root = tmp_path / "served"
    conv_id = serve(lm, root, lambda c, s: converse(c, secret, answered))
    # the twin: a conversation that never had the item (a deleted conversation's twin is a server without it)
    twin_root = tmp_path / "twin" if what == "item" else None
    twin_id = serve(lm, twin_root, lambda c, s: converse(c, None, answered)) if twin_root else None
    if skipped:
        skip_removal(monkeypatch, route)

    def delete(client, srv) -> None:
        if what == "conversation":
            client.conversations.delete(conv_id)
        else:
            client.conversations.items.delete(secret["id"], conversation_id=conv_id)
    serve(lm, root, delete)

    def after(client, srv) -> dict | None:  # the restarted server: what it serves of the conversation
        if what == "conversation":
            with pytest.raises(openai.NotFoundError):
                client.conversations.retrieve(conv_id)
            return None
        return client.conversations.retrieve(conv_id).model_extra["unsee"]
    state = serve(lm, root, after)
    residue = get_residue(root, twin_root, lm.encode)
    assert bool(residue) is skipped, json.dumps(residue, indent=1)
    if route in ("answered item", "waiting item") and not skipped:  # a user turn's twin: the same turns without it
        twin = serve(lm, twin_root, lambda c, s: c.conversations.retrieve(twin_id).model_extra["unsee"])
        assert (state["digest"], state["pending"]) == (twin["digest"], twin["pending"])
