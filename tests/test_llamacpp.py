"""The llama.cpp engine's own parts: the install hint, the tiny GGUF, the
state-blob parser and the by-position digest (impl/engines/llamacpp/engine.py).

The verbs themselves are checked on every engine by
properties/prop_engine_verbs.py; the runtime on llama.cpp by
properties/prop_impl_engines.py."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from unsee.impl.engines.llamacpp import engine as llamacpp
from unsee.impl.engines.llamacpp.state import SeqKV
from unsee.impl.engines.llamacpp.tiny_gguf import write_tiny_gguf
from unsee.impl.engines.protocol import Assist, Engine
from unsee.impl.engines.registry import load_engine

needs_llamacpp = pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed")


def prefill_now(engine, handle: str, ids: list[int]) -> None:
    """``engine.prefill`` computed now: a chunk of at most ``max_forward`` tokens is otherwise left
    pending until a verb reads the KV, and these tests read the backend, which holds computed rows only."""
    engine.prefill(handle, ids)
    engine.flush(handle)


def test_missing_extra_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp now raises ImportError
    with pytest.raises(llamacpp.LlamaCppMissingError, match=r"pip install 'unsee\[llamacpp\]'"):
        load_engine("llamacpp-tiny")
    assert not llamacpp.available()
    from unsee.impl.cli.main import main

    episode = Path(__file__).resolve().parents[1] / "examples" / "secret_in_tool_result.json"
    assert main(["run", str(episode), "--engine", "llamacpp", "--model", "tiny"]) == 2
    assert "unsee[llamacpp]" in capsys.readouterr().err


def test_tiny_gguf_is_a_pure_function_of_its_seed(tmp_path):
    a, b = write_tiny_gguf(tmp_path / "a.gguf"), write_tiny_gguf(tmp_path / "b.gguf")
    c = write_tiny_gguf(tmp_path / "c.gguf", seed=1)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


@pytest.fixture(scope="module", params=[True, False], ids=["flash-attn", "v-transposed"])
def engine(request, engine_factory):
    # one slot whatever $UNSEE_LLAMA_SLOTS says: the blob tests read one stream (tests/test_llamacpp_slots.py has several)
    return engine_factory("llamacpp-tiny", n_ctx=256, flash_attn=request.param, slots=1)


@needs_llamacpp
def test_engine_satisfies_the_protocol(engine):
    assert isinstance(engine, Engine)
    assert engine.determinism.crop_continue_is_fresh
    # the tiny file's linear weights are Q4_1, as SmolLM2's: decode == prefill below 64 tokens,
    # measured at load with flash attention; without it drafts stay off (facts.py says why)
    if engine.lm.flash_attn:
        assert engine.draft_bound == 0.0 and engine.lm.max_forward >= 2
    else:
        assert engine.draft_bound is None and "drafts off" in engine.lm.draft_bound_source


@needs_llamacpp
def test_state_blob_round_trips(engine):
    """parse then to_blob gives llama.cpp's own bytes back, V transposed or not."""
    handle = engine.new_lineage()
    prefill_now(engine, handle, list(range(40, 57)))
    blob_size = engine.kv.lc.llama_state_seq_get_size(engine.kv.ctx, 0)
    kv = engine.kv.read_seq()
    assert kv.n == 17 and list(kv.caches[0].positions) == list(range(17))
    assert len(kv.to_blob()) == blob_size
    # written back into the context, read out again: the same rows
    engine.kv.lc.llama_memory_clear(engine.kv.mem, True)
    engine.kv.held[0] = None
    lin = engine.get_lineage(handle)
    lin.kv = kv
    engine.kv.make_resident(handle, lin)
    again = engine.kv.read_seq()
    assert again.to_blob() == kv.to_blob()
    engine.drop(handle)


@needs_llamacpp
def test_digest_is_by_position_not_by_cell(engine):
    """The same KV stored in other cells (here: rows in reverse order, as a
    cache whose cells were filled out of order would hold them) hashes the
    same; the blob of that layout does not."""
    handle = engine.new_lineage()
    prefill_now(engine, handle, list(range(60, 72)))
    kv = engine.kv.read_seq().caches[0]
    rev = slice(None, None, -1)
    shuffled = SeqKV(kv.positions[rev], tuple(k[rev] for k in kv.k), tuple(v[rev] for v in kv.v),
                              kv.k_types, kv.v_types, kv.v_trans, kv.v_elem)
    assert shuffled.to_blob() != kv.to_blob()
    digests = []
    for rows in (kv, shuffled):
        h = hashlib.sha256()
        rows.digest_into(h)
        digests.append(h.hexdigest())
    assert digests[0] == digests[1]
    # and the parser orders cells by position
    assert np.array_equal(SeqKV.parse(shuffled.to_blob(), engine.lm.n_layer, kv.v_trans).positions,
                          kv.positions)
    engine.drop(handle)


@needs_llamacpp
def test_parser_refuses_what_it_does_not_know(engine):
    handle = engine.new_lineage()
    prefill_now(engine, handle, [1, 2, 3])
    blob = engine.kv.read_seq().to_blob()
    with pytest.raises(ValueError, match="magic"):
        SeqKV.parse(b"\0" * 8 + blob[8:], engine.lm.n_layer, engine.kv.v_trans)
    with pytest.raises(ValueError, match="unparsed"):
        SeqKV.parse(blob + b"\0", engine.lm.n_layer, engine.kv.v_trans)
    with pytest.raises(ValueError, match="layers"):
        SeqKV.parse(blob, engine.lm.n_layer + 1, engine.kv.v_trans)
    engine.drop(handle)


@needs_llamacpp
def test_bad_input_changes_nothing(engine):
    handle = engine.new_lineage()
    engine.prefill(handle, [5, 6, 7])
    before = engine.digest(handle), engine.tokens(handle)
    for bad in (lambda: engine.prefill(handle, []), lambda: engine.prefill(handle, [engine.lm.vocab_size]),
                lambda: engine.fork(handle, 4), lambda: engine.fork(handle, -1),
                lambda: engine.generate(handle, 2, assist=Assist(draft=[engine.lm.vocab_size])),
                lambda: engine.prefill(handle, [1] * engine.lm.n_ctx)):
        with pytest.raises(ValueError):
            bad()
        assert (engine.digest(handle), engine.tokens(handle)) == before
    engine.drop(handle)


@needs_llamacpp
def test_span_excision_says_this_engine_cannot(engine):
    """A baseline the engine cannot run is refused by name, before it changes
    anything (llama.cpp has no verb to cut a span out of the middle of its KV)."""
    from unsee.impl.agent.episode import parse_episode
    from unsee.impl.agent.runtime import AgentRuntime
    from unsee.impl.methods.baselines import apply_method

    episode = parse_episode({"format": "unsee.episode", "version": 2, "system": "Be brief.",
                             "settings": {"max_new_tokens": 2},
                             "steps": [{"id": "t1", "kind": "user", "text": "Bob 7", "source": "z"},
                                       {"id": "t2", "kind": "user", "text": "tea"}],
                             "target": {"source": "z", "value": "Bob 7"}})
    base = AgentRuntime.from_episode(engine, episode)
    before = base.digest()
    with pytest.raises(NotImplementedError, match="span-excision.*LlamaCppEngine"):
        apply_method(base, "span-excision", episode.target.source)
    assert base.digest() == before



# --- a stored llama.cpp session through every command (issue 20, item 6) ---------------------------


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "secret_in_tool_result.json"
SECRET, SOURCE = "4417 Elm Street", "notes.address"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``unsee ARGV`` in this process: its exit code, stdout and stderr."""
    from unsee.impl.cli.main import main

    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def stored(tmp_path, capsys) -> Path:
    """A llama.cpp session (tiny GGUF) stored by ``unsee run --store``, nothing forgotten yet."""
    path = tmp_path / "s.db"
    code, _, err = run_cli(capsys, "run", str(EXAMPLE), "--engine", "llamacpp", "--model", "tiny",
                           "--method", "none", "--store", str(path))
    assert code == 0, err
    return path


@needs_llamacpp
def test_stored_session_forgets_and_verifies_through_the_cli(stored, tmp_path, capsys):
    """show, forget and verify rebuild the llama.cpp engine the store
    records, with no --engine given; the forget equals the full reset run
    on llama.cpp, and verify rebuilds it there and checks the receipt."""
    code, out, _ = run_cli(capsys, "show", str(stored), "--json")
    summary = json.loads(out)
    assert code == 0 and summary["backend"] == "llamacpp" and summary["model"] == "tiny-gguf"
    code, out, _ = run_cli(capsys, "show", str(stored), "--model", "tiny")  # the name it loads by
    assert code == 0 and "(verified by rebuild)" in out and "on the llamacpp engine" in out

    receipt = tmp_path / "receipt.json"
    code, out, err = run_cli(capsys, "forget", str(stored), "--forget", SOURCE, "--receipt", str(receipt), "--json")
    assert code == 0, err
    forgot = json.loads(out)
    assert forgot["invocations"] == forgot["expected_invocations"] > 0
    code, out, _ = run_cli(capsys, "run", str(EXAMPLE), "--engine", "llamacpp", "--model", "tiny",
                           "--method", "reset", "--forget", SOURCE, "--json")
    assert code == 0 and json.loads(out)["digest"] == forgot["digest"]  # forget == reset, on llama.cpp

    body = json.loads(receipt.read_text())
    assert body["environment"]["engine"].endswith("LlamaCppEngine") and body["environment"]["threads"] >= 1
    assert {"flash_attn", "n_ctx", "exact_kernels", "llama_cpp_python"} <= set(body["environment"])
    assert "torch" not in body["environment"]  # torch computes nothing there
    code, out, err = run_cli(capsys, "verify", str(stored), "--receipt", str(receipt), "--value", SECRET)
    assert code == 0, out + err
    assert out.strip().endswith(f"verified: {stored}")
    assert "ok     full reset from R_0 reproduces the receipt's digest" in out


@needs_llamacpp
def test_a_conflicting_engine_is_refused_and_changes_nothing(stored, capsys):
    before = stored.read_bytes()
    for command in (["forget", str(stored), "--forget", SOURCE], ["show", str(stored)], ["verify", str(stored)]):
        code, _, err = run_cli(capsys, *command, "--engine", "transformers")
        assert code == 2, command
        assert "created with engine 'llamacpp', not 'transformers'" in err
    assert stored.read_bytes() == before
    code, _, err = run_cli(capsys, "forget", str(stored), "--forget", SOURCE, "--engine", "llamacpp")
    assert code == 0, err  # the store's own engine, named, is fine


@needs_llamacpp
def test_store_records_the_options_the_bits_depend_on(engine, tmp_path):
    """flash attention, n_ctx and the kernels are recorded, and the engine the store rebuilds
    has them, whatever this process's defaults; the thread counts are not (a thread-invariant
    model's bits are one thread's: docs/bench.md, "Decode on every core"), and a store that
    recorded them, as every store did before, opens on its recorded counts."""
    from unsee.impl.agent.runtime import AgentRuntime
    from unsee.impl.store.backend import load_stored_engine
    from unsee.impl.store.session import PersistentSession
    from unsee.impl.store.sqlite import SessionStore

    runtime = AgentRuntime.start(engine, system="Be brief.")
    with PersistentSession.create(tmp_path / "s.db", runtime):
        pass
    with SessionStore.open(tmp_path / "s.db") as store:
        meta = store.get_meta()
        rebuilt = load_stored_engine(meta)
        assert store.load(rebuilt).digest() == runtime.digest()
        old = {**meta, "engine_options": json.dumps({**json.loads(meta["engine_options"]), "threads": 1,
                                                     "batch_threads": 2})}
        assert (load_stored_engine(old).lm.threads, load_stored_engine(old).lm.batch_threads) == (1, 2)
    assert meta["backend"] == "llamacpp" and meta["model_ref"] == "tiny" and engine.lm.thread_invariant
    assert json.loads(meta["engine_options"]) == {"n_ctx": 256, "flash_attn": engine.lm.flash_attn,
                                                  "exact_kernels": True, "row_order": engine.lm.row_order}
    assert (rebuilt.lm.n_ctx, rebuilt.lm.flash_attn, rebuilt.lm.exact_kernels, rebuilt.lm.row_order) == \
        (256, engine.lm.flash_attn, True, engine.lm.row_order)


@needs_llamacpp
def test_a_llamacpp_session_does_not_continue_on_transformers(stored, tiny_engine):
    from unsee.impl.store.session import PersistentSession
    from unsee.impl.store.sqlite import StoreError

    with pytest.raises(StoreError, match="made by the llamacpp engine; it cannot continue on the transformers"):
        PersistentSession.open(stored, tiny_engine)


@needs_llamacpp
def test_demo_and_eval_run_on_llamacpp(tmp_path, capsys):
    code, out, err = run_cli(capsys, "demo", "--engine", "llamacpp", "--model", "tiny", "--json")
    demo = json.loads(out)
    assert code == 0 and demo["backend"] == "llamacpp" and demo["dtype"] == "gguf", err
    assert next(r for r in demo["rows"] if r["method"] == "replay")["equals_reset"]
    out_dir = tmp_path / "eval"
    argv = ["eval", "--out", str(out_dir), "--suite", "memory", "--episodes", "1", "--method", "reset,replay",
            "--samples", "0", "--turn-tokens", "4", "--probe-tokens", "4", "--quiet", "--model", "tiny"]
    code, _, err = run_cli(capsys, *argv, "--engine", "llamacpp")
    assert code == 0, err
    rows = [json.loads(line) for line in (out_dir / "rows.jsonl").read_text().splitlines()]
    assert {r["backend"] for r in rows} == {"llamacpp"} and {r["dtype"] for r in rows} == {"gguf"}
    assert all(r["equals_reset"] for r in rows)
    code, _, err = run_cli(capsys, *argv)  # resuming on another engine would mix two experiments
    assert code == 2 and "run with backend 'llamacpp', this run asks for 'transformers'" in err


@needs_llamacpp
def test_batch_threads_change_no_bit_of_a_forget(tmp_path):
    """Prefill on two threads, decode on one (llama.cpp's n_threads_batch): the forget's
    state digest and every turn's tokens equal the one-thread engine's, and the facts
    measured at load (which forward sizes equal decoding) are keyed by the setting."""
    from unsee.impl.agent.episode import parse_episode
    from unsee.impl.agent.runtime import AgentRuntime
    from unsee.impl.engines.llamacpp.facts import get_cache_key
    from unsee.impl.engines.llamacpp.model import load_llamacpp
    from unsee.impl.engines.registry import make_engine
    from unsee.impl.methods.baselines import apply_method

    episode = parse_episode(json.loads(EXAMPLE.read_text()))
    results = {}
    for batch in (1, 2):
        lm = load_llamacpp("tiny", threads=1, batch_threads=batch, n_ctx=2048, cache_dir=tmp_path)
        assert lm.batch_threads == batch and (f"{batch} for forwards" in lm.determinism_statement) == (batch == 2)
        base = AgentRuntime.from_episode(make_engine(lm), episode)
        runtime, result = apply_method(base, "replay", episode.target.source, episode.target.value)
        results[batch] = (base.digest(), result.digest, [b.tokens for b in runtime.graph.blocks()])
        results[f"key{batch}"] = get_cache_key(lm)
    assert results[1] == results[2]
    assert results["key1"] != results["key2"] and "batch_threads=2" in results["key2"]


@needs_llamacpp
def test_pending_chunks_change_no_bit_and_save_a_forward_at_each_turns_ends(engine, monkeypatch):
    """Chunks of at most ``max_forward`` tokens in all are computed together, as late as the KV is
    read (a turn's last token, the next observation and the next header: one forward): the same
    digest, chunks, answers and forget as each chunk computed when it is given, in fewer forwards."""
    from unsee.impl.agent.episode import Item, Settings, Step
    from unsee.impl.agent.runtime import AgentRuntime
    from unsee.impl.engines.book import LineageBook

    steps = [Step(f"u{i}", "user", (Item(f"s{i}", f"Note {i}: the crate holds {7 * i} bolts."),)) for i in range(3)]

    def run():
        before = engine.counters.snapshot()
        runtime = AgentRuntime.start(engine, system="Be brief.", settings=Settings(max_new_tokens=4))
        runtime.run(steps)

        def state():
            return (runtime.digest(), list(engine.get_lineage(runtime.lineage).chunk_ends),
                    [runtime.graph[b].text for b in runtime.context], engine.tokens(runtime.lineage))
        ran = state()  # the digest computes what is pending
        spent = engine.counters.snapshot() - before
        runtime.forget("s1")  # a replay of the steps after the first
        return (ran, state()), spent

    pending, pending_spent = run()
    monkeypatch.setattr(LineageBook, "_defers", lambda self, lin, ids: False)
    apart, apart_spent = run()
    assert pending == apart
    assert pending_spent.prefilled_tokens == apart_spent.prefilled_tokens
    if engine.max_forward:  # a turn's last token, the next observation and header: one forward, not three
        assert pending_spent.forward_calls <= apart_spent.forward_calls - 2 * (len(steps) - 1)
    else:
        assert pending_spent.forward_calls == apart_spent.forward_calls


@needs_llamacpp
def test_a_pending_chunk_is_computed_before_any_verb_reads_the_kv(engine):
    """A chunk left pending is in ``tokens`` at once, and computed (one forward) before a fork past
    the computed tokens, ``logits`` or ``digest`` read the KV; a context overflow is refused when
    the chunk is given; a fork within the computed tokens computes nothing."""
    if not engine.max_forward:
        pytest.skip("no max_forward: every chunk is computed when given")
    alone, h = engine.new_lineage(), engine.new_lineage()
    prefill_now(engine, alone, [5, 6, 7])
    engine.prefill(alone, [8, 9])
    expected = (engine.logits(alone).numpy().tobytes(), engine.digest(alone))
    prefill_now(engine, h, [5, 6, 7])
    before = engine.counters.snapshot()
    engine.prefill(h, [8, 9])
    assert engine.tokens(h) == [5, 6, 7, 8, 9] and (engine.counters.snapshot() - before).forward_calls == 0
    early = engine.fork(h, 2)  # within what is computed: nothing to compute
    assert engine.tokens(early) == [5, 6] and (engine.counters.snapshot() - before).forward_calls == 0
    with pytest.raises(ValueError, match="exceed n_ctx"):
        engine.prefill(h, [3] * engine.lm.n_ctx)
    assert engine.tokens(h) == [5, 6, 7, 8, 9]
    assert (engine.logits(h).numpy().tobytes(), engine.digest(h)) == expected
    assert (engine.counters.snapshot() - before).forward_calls == 1
    assert engine.get_lineage(h).chunk_ends == engine.get_lineage(alone).chunk_ends == [3, 5]
    for lineage in (alone, h, early):
        engine.drop(lineage)


@needs_llamacpp
def test_the_floors_decode_steps_are_forwards_of_their_own(engine, monkeypatch):
    """The floor's timed run feeds a changed turn's known tokens one forward each, with or without
    pending chunks: an engine that defers chunks would otherwise compute them in one forward, a
    floor below any decode (found in the goal run at abf7518: the floor's wall halved)."""
    from unsee.impl.agent.episode import Item, Settings, Step
    from unsee.impl.agent.runtime import AgentRuntime
    from unsee.impl.engines.book import LineageBook
    from unsee.impl.methods.baselines import apply_method
    from unsee.impl.methods.floor import compute_floor

    steps = [Step(f"u{i}", "user", (Item(f"s{i}", f"Note {i}: the crate holds {7 * i} bolts."),)) for i in range(3)]
    base = AgentRuntime.start(engine, system="Be brief.", settings=Settings(max_new_tokens=6))
    base.run(steps)
    reset, _ = apply_method(base, "reset", "s0")
    boundary = base.checkpoints.latest_before(base.graph.first_entry("s0")).boundary

    def one_token_forwards():
        sizes = []
        with engine.hook_forwards(lambda n, started: sizes.append(n)):
            floor = compute_floor(engine, base, reset, boundary)
        return floor, sizes.count(1)

    floor, pending = one_token_forwards()
    decode_steps = sum(t.forwards for t in floor.changed_turns)
    assert decode_steps > 0, "the forget changed no turn: nothing to check"
    monkeypatch.setattr(LineageBook, "_defers", lambda self, lin, ids: False)
    again, apart = one_token_forwards()
    assert again.to_json() | {"wall_s": 0, "cpu_s": 0} == floor.to_json() | {"wall_s": 0, "cpu_s": 0}
    assert pending == apart >= decode_steps
