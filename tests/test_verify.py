"""Erasure receipts and ``unsee verify`` (issue 11, part 1; docs/persistence.md).

Honest stores verify; each tampering the issue lists fails with the check it
broke named; an environment that differs from the receipt's is "cannot verify
here", not "failed"; verify never writes and never holds a lock past its
snapshot read.
"""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
import sqlite3
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from unsee.impl.agent.episode import FORMAT, VERSION, parse_episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.cli.main import main
from unsee.impl.engines.hf.models import load_model
from unsee.impl.engines.registry import make_engine
from unsee.impl.store import receipt as receipt_mod
from unsee.impl.store.receipt import ReceiptError, parse_receipt
from unsee.impl.store.session import PersistentSession
from unsee.impl.store.sqlite import SessionStore, session_files
from unsee.impl.store.verify import CANNOT, FAILED, VERIFIED, forgotten_mentions, verify_store

TARGET, SECRET = "notes.pin", "PIN 738215 Quillmere"
EPISODE = {
    "format": FORMAT, "version": VERSION, "system": "You are a helpful agent.", "settings": {"max_new_tokens": 4},
    "steps": [{"id": "u1", "kind": "user", "text": "Ana paid for tea"},
              {"id": "f2", "kind": "tool", "tool": "fetch",
               "fields": [{"source": "f2.a", "text": "room 12 is blue"}, {"source": TARGET, "text": SECRET}]},
              {"id": "r3", "kind": "remember"},
              {"id": "c4", "kind": "compact"},
              {"id": "u5", "kind": "user", "text": "call Bob at 7"}],
}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def honest(lm, tmp_path_factory) -> tuple[Path, str]:
    """A stored session that forgot TARGET, and the receipt its forget wrote."""
    path = tmp_path_factory.mktemp("honest") / "s.db"
    runtime = AgentRuntime.from_episode(make_engine(lm), parse_episode(EPISODE))
    with PersistentSession.create(path, runtime) as session:
        session.forget(TARGET)
        receipt = session.receipt
    assert receipt is not None
    return path, receipt


@pytest.fixture
def copy(honest, tmp_path) -> tuple[Path, Path]:
    """A private copy of the honest store, and its receipt as a file."""
    path, receipt = honest
    db = tmp_path / "s.db"
    shutil.copy(path, db)
    held = tmp_path / "receipt.json"
    held.write_text(receipt, encoding="utf-8")
    return db, held


def failed_checks(verdict) -> list[str]:
    return [c.name for c in verdict.failed()]


def raw_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in session_files(path))


# --- honest stores ----------------------------------------------------------------------------


def test_honest_store_verifies(copy, capsys):
    db, held = copy
    verdict = verify_store(db, held.read_bytes(), value=SECRET)
    assert verdict.outcome == VERIFIED, verdict.failed()
    names = [c.name for c in verdict.checks]
    for wanted in ("full reset from R_0 reproduces the receipt's digest",
                   "every generated token matches the receipt and the store",
                   "no forgotten source in items, blocks or observations",
                   "no residue of the value in the session's files", "the given receipt is the store's copy"):
        assert wanted in names
    assert verdict.receipt["forgotten"] == [TARGET] and SECRET not in json.dumps(verdict.receipt)
    assert main(["verify", str(db), "--receipt", str(held), "--value", SECRET]) == 0
    assert capsys.readouterr().out.strip().endswith(f"verified: {db}")


def test_receipt_holds_what_the_issue_lists(honest, lm):
    body = parse_receipt(honest[1])
    assert body["forgotten"] == [TARGET] and body["generation"] == 2 and body["length"] == 5
    assert body["model"] == {"name": "tiny", "weights_sha256": receipt_mod.weights_hash(lm)}
    assert {"engine", "device", "dtype", "threads", "torch", "transformers", "cpu_capability",
            "cpu_flags"} <= set(body["environment"])
    assert body["tau"] == 2 and body["invocations"] == 5 - body["boundary"]
    assert body["digest_means"] == "kv"  # the transformers engine's digest: bitwise K and V (Determinism.digest)
    with SessionStore.open(honest[0], readonly=True) as store:
        assert body["digest"] == store.stored_digest()
        assert store.get_receipts() == [honest[1]]


def test_verify_reads_only(copy):
    """Read-only: even a store whose compaction a crash interrupted (which any
    writable open would finish) keeps every byte."""
    db, held = copy
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'scrub_pending'")
    before = raw_bytes(db), db.stat().st_mtime_ns
    assert verify_store(db, held.read_bytes(), value=SECRET).outcome == VERIFIED
    assert (raw_bytes(db), db.stat().st_mtime_ns) == before


def test_verify_holds_no_lock_after_its_snapshot(copy, lm):
    """While verify rebuilds (here: when it loads the model), a writer in
    another connection commits without waiting."""
    db, held = copy
    committed = []

    def loading(name, device, dtype, **options):
        with PersistentSession.open(db, make_engine(lm), busy_timeout=0.05) as writer:
            writer.step(parse_episode(EPISODE | {"steps": [{"id": "u6", "kind": "user", "text": "tea"}]}).steps[0])
            committed.append(writer.t)
        return load_model(name, device=device, dtype=dtype, **options)

    verdict = verify_store(db, held.read_bytes(), load_model=loading)
    assert committed == [6]
    assert verdict.outcome == VERIFIED, verdict.failed()  # the snapshot it read is consistent
    # and on the newer store the receipt (T=5) is still checked, on the log's first 5 steps
    assert verify_store(db, held.read_bytes()).outcome == VERIFIED


def test_a_session_that_went_on_after_its_forget_verifies(lm, tmp_path):
    path = tmp_path / "s.db"
    episode = parse_episode(EPISODE)
    runtime = AgentRuntime.from_episode(make_engine(lm), parse_episode(EPISODE | {"steps": EPISODE["steps"][:3]}))
    with PersistentSession.create(path, runtime) as session:
        session.forget(TARGET)
        session.run(episode.steps[3:])
    verdict = verify_store(path, value=SECRET)
    assert verdict.outcome == VERIFIED, verdict.failed()


# --- tampering: each fails, naming its check --------------------------------------------------


def test_receipt_changed_by_one_byte_fails(copy):
    db, held = copy
    text = held.read_bytes()
    rng = random.Random(11)
    for at in range(len(text)):  # every byte: the receipt alone (cheap)
        changed = bytearray(text)
        changed[at] = (changed[at] + rng.randint(1, 255)) % 256
        with pytest.raises(ReceiptError):
            parse_receipt(bytes(changed))
    for at in rng.sample(range(len(text)), 3):  # and through verify and the CLI
        changed = bytearray(text)
        changed[at] ^= 0x01
        held.write_bytes(bytes(changed))
        verdict = verify_store(db, bytes(changed))
        assert verdict.outcome == FAILED and failed_checks(verdict) == ["the given receipt is intact"]
        assert main(["verify", str(db), "--receipt", str(held)]) == 1


def test_stored_receipt_changed_by_one_byte_fails(copy):
    db, _ = copy
    with sqlite3.connect(db) as conn:
        (text,) = conn.execute("SELECT receipt FROM forget_log").fetchone()
        at = text.index('"tau":') + 6
        conn.execute("UPDATE forget_log SET receipt = ?", (text[:at] + "3" + text[at + 1:],))
    verdict = verify_store(db)
    assert verdict.outcome == FAILED and failed_checks(verdict) == ["stored receipts are intact"]
    assert "receipt hash check failed" in verdict.failed()[0].detail


def _flip_in_file(db: Path, needle: bytes, offset: int = 0) -> int:
    raw = bytearray(db.read_bytes())
    at = raw.find(needle)
    assert at >= 0, f"{needle!r} is not stored"
    raw[at + offset] ^= 0x01
    db.write_bytes(bytes(raw))
    return at + offset


@pytest.mark.parametrize("what", ["item text", "block text", "token ids", "stored digest"])
def test_one_byte_of_a_stored_value_changed_fails(copy, what):
    db, held = copy
    with SessionStore.open(db, readonly=True) as store:
        record, digest = store.read_record(), bytes.fromhex(store.stored_digest())
    from unsee.impl.store.sqlite import pack_tokens

    answer = next(b for b in record["blocks"] if b["type"] == "answer")
    needle = {"item text": b"room 12 is blue", "block text": answer["text"].encode(),
              "token ids": pack_tokens(answer["tokens"][-3:]), "stored digest": digest}[what]
    _flip_in_file(db, needle, len(needle) // 2)
    verdict = verify_store(db, held.read_bytes())
    assert verdict.outcome == FAILED, verdict.checks
    assert failed_checks(verdict)  # names at least one check


def test_random_byte_flips_never_pass_with_changed_content(copy):
    """A flip anywhere in the file either fails verify or changed no stored
    value (free space, header padding): the logical dump is the same."""
    db, held = copy
    original = db.read_bytes()
    dump = _dump(db)
    rng = random.Random(5)
    outcomes = {"failed": 0, "no content": 0}
    for _ in range(max(8, settings().max_examples // 8)):  # ci 8, nightly 250
        raw = bytearray(original)
        at = rng.randrange(len(raw))
        raw[at] ^= 1 << rng.randrange(8)
        db.write_bytes(bytes(raw))
        verdict = verify_store(db, held.read_bytes())
        if verdict.outcome == VERIFIED:
            assert _dump(db) == dump, f"byte {at} changed content and verify passed"
            outcomes["no content"] += 1
        else:
            outcomes["failed"] += 1
    print(f"random flips: {outcomes}")


def _dump(db: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return list(conn.iterdump())
    except sqlite3.DatabaseError as exc:  # a damaged file has no dump
        return [f"error: {exc}"]
    finally:
        conn.close()


def test_log_with_a_source_put_back_fails(copy):
    db, held = copy
    with sqlite3.connect(db) as conn:
        (seq,) = conn.execute("SELECT seq FROM steps WHERE id = 'f2'").fetchone()
        conn.execute("INSERT INTO items (step_seq, pos, source, text) VALUES (?, 9, ?, ?)", (seq, TARGET, SECRET))
    verdict = verify_store(db, held.read_bytes(), value=SECRET)
    assert verdict.outcome == FAILED
    assert {"no forgotten source in items, blocks or observations", "sanitised log matches the receipt",
            "no residue of the value in the session's files"} <= set(failed_checks(verdict))


def test_a_different_model_fails(copy, lm):
    db, held = copy

    def other_weights(name, device, dtype, **options):  # the same name, other weights
        other = load_model(name, device=device, dtype=dtype, **options)
        with torch.no_grad():
            next(other.model.parameters()).add_(1e-3)
        return other

    verdict = verify_store(db, held.read_bytes(), load_model=other_weights)
    assert verdict.outcome == FAILED and failed_checks(verdict) == ["model weights are the receipt's"]
    with sqlite3.connect(db) as conn:  # the store claims another model than the receipt
        conn.execute("UPDATE meta SET value = 'smollm2' WHERE key = 'model'")
    verdict = verify_store(db, held.read_bytes())
    assert verdict.outcome == FAILED and failed_checks(verdict) == ["model"]


# --- cannot verify here ---------------------------------------------------------------------


def _reissue(db: Path, **changes) -> str:
    """Rewrite the store's receipt (and what it states) consistently, as a
    store written elsewhere would be: the receipt hash is not a signature."""
    with sqlite3.connect(db) as conn:
        (text,) = conn.execute("SELECT receipt FROM forget_log").fetchone()
        body = json.loads(text)
        del body["receipt_sha256"]
        for key, value in changes.items():
            if key in body["environment"]:
                body["environment"][key] = value
            else:
                body[key] = value
        new = json.dumps(body | {"receipt_sha256": receipt_mod._sha256(body)}, sort_keys=True, ensure_ascii=False,
                         separators=(",", ":"))
        conn.execute("UPDATE forget_log SET receipt = ?, digest_after = ?", (new, bytes.fromhex(body["digest"])))
        conn.execute("UPDATE session SET digest = ?", (bytes.fromhex(body["digest"]),))
    return new


def test_other_environment_is_cannot_verify_here(copy, capsys):
    """Bits made elsewhere (another torch, other CPU kernels) that do not
    reproduce here: "cannot verify here", naming the difference."""
    db, _ = copy
    # another capability than this machine's (CI machines differ: some report AVX512)
    other = "AVX2" if torch.backends.cpu.get_cpu_capability() == "AVX512" else "AVX512"
    held = _reissue(db, digest="ab" * 32, torch="2.99.0", cpu_capability=other)
    verdict = verify_store(db, held)
    assert verdict.outcome == CANNOT, verdict.checks
    detail = " ".join(c.detail for c in verdict.failed())
    assert "torch: receipt '2.99.0'" in detail and f"cpu_capability: receipt '{other}'" in detail
    assert main(["verify", str(db)]) == 3
    assert "cannot verify here" in capsys.readouterr().out


def test_same_environment_wrong_digest_fails(copy):
    db, _ = copy
    held = _reissue(db, digest="ab" * 32)
    assert verify_store(db, held).outcome == FAILED


# --- the allowed places of a forgotten id -------------------------------------------------------


def test_forgotten_mentions_finds_carriers_not_names():
    record = {"steps": [{"id": "a", "items": [{"source": "a", "text": "x"}]},
                        {"id": "p1", "items": []}],
              "blocks": [{"id": "a", "type": "user", "source_ids": ["a"]},
                         {"id": "p1/call/result", "type": "tool", "source_ids": []},
                         {"id": "b", "type": "answer", "source_ids": ["p1/call/result"]}],
              "forgotten": ["p1/call/result", "a"]}
    assert forgotten_mentions(record, record["forgotten"]) == [
        "steps.0.items.0.source = 'a'", "blocks.0.source_ids.0 = 'a'", "blocks.2.source_ids.0 = 'p1/call/result'"]
    record["steps"][0]["items"], record["blocks"][0]["source_ids"], record["blocks"][2]["source_ids"] = [], [], []
    assert forgotten_mentions(record, record["forgotten"]) == []  # the names "a" and "p1/call/result" remain


def test_tool_session_with_an_irrevocable_divergence_then_live_then_forget_verifies(lm, tmp_path):
    """Pinned (found by the nightly world property): after a forget whose
    counterfactual would not have sent a sent message, the session went on
    live; its new checkpoints record the real world, which is not the
    counterfactual's. A later forget's receipt still verifies."""
    from unsee.impl.agent.episode import Item, Step
    from unsee.impl.agent.tools import Environment, ToolAgentRuntime
    from unsee.impl.cli.tools_demo import INJECTED, demo_episode

    episode = demo_episode(6)
    runtime = ToolAgentRuntime.from_episode(make_engine(lm), episode, world=Environment({"inbox/count": "2"}))
    path = tmp_path / "s.db"
    with PersistentSession.create(path, runtime) as session:
        report = session.forget(INJECTED)
        assert report.extra.fields["divergences"]  # the sent message is irrevocable (A3 fails)
        session.run([Step("t9", "tool", (Item("inbox/9", "From: ann@a.test\nhi"),), "fetch"),
                     Step("p9", "plan", (Item("p9", "Reply now."),), "send_message"),
                     Step("u9", "user", (Item("u9", "Thanks."),))])
        session.forget("inbox/9")
    verdict = verify_store(path)
    assert verdict.outcome == VERIFIED, verdict.failed()


# --- a llama.cpp session (issue 20, item 6) ------------------------------------------------------


@pytest.mark.skipif(not importlib.util.find_spec("llama_cpp"), reason="llama-cpp-python is not installed")
def test_llamacpp_session_verifies_there_and_names_its_own_environment(engine_factory, tmp_path):
    """A llama.cpp session's receipt is verified by rebuilding it on
    llama.cpp, with the options the store recorded; bits made under another
    llama.cpp build or context size that do not reproduce are "cannot verify
    here", naming the llama.cpp facts (not torch's)."""
    engine = engine_factory("llamacpp-tiny", n_ctx=512)
    path = tmp_path / "s.db"
    with PersistentSession.create(path, AgentRuntime.from_episode(engine, parse_episode(EPISODE))) as session:
        session.forget(TARGET)
        held = session.receipt
    verdict = verify_store(path, held, value=SECRET)
    assert verdict.outcome == VERIFIED, verdict.failed()
    assert parse_receipt(held)["environment"]["n_ctx"] == 512  # rebuilt with it, not the loader's 4096
    other = _reissue(path, digest="ab" * 32, llama_cpp_python="0.0.1", n_ctx=1024)
    verdict = verify_store(path, other)
    assert verdict.outcome == CANNOT, verdict.checks
    detail = " ".join(c.detail for c in verdict.failed())
    assert "llama_cpp_python: receipt '0.0.1'" in detail and "n_ctx: receipt 1024, here 512" in detail
    assert "torch" not in detail
