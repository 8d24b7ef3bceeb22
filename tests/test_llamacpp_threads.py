"""Decode on every core, exactly (issue 50, item 2; docs/bench.md, "Decode on every core").

llama.cpp's flash attention splits a lone query row's keys among the threads once a step
attends over 512 cells or more (past about 256 tokens), so a one-token step's bits change
with the thread count; a forward of two rows never takes that split. Where the library has
the switch (impl/engines/llamacpp/kernels.py: ``make install`` builds it) the split is off and
a step is one row computed whole by one thread; where it lacks it, the engine feeds a decode
step on several threads as two rows (``facts.forward_padded``). These tests pin the bit-level
facts that rests on, on the tiny GGUF, past the old boundary: the engine's step on two threads
gives one thread's logits and KV, where a lone row on two threads with the split on does not;
with the switch, that step is not padded; a whole forget on two threads gives the one-thread
engine's digests and tokens, while its store no longer records a thread count; and a batch of
several lineages' steps on two threads (how the server's loop decodes its conversations on
every core) gives each lineage the bits of its steps alone on one thread."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

from unsee.impl.engines.llamacpp import engine as llamacpp

pytestmark = pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "secret_in_tool_result.json"
PROMPT = 300  # past 256 tokens: a step then attends over 512 cells, where the split starts
STEPS = 24


def lone_step(lc, ctx, batch, token: int, pos: int, vocab: int) -> np.ndarray:
    """A one-token ``llama_decode`` as one row, whatever the context's threads (no padding)."""
    batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.seq_id[0][0], batch.logits[0] = token, pos, 1, 0, 1
    batch.n_tokens = 1
    assert lc.llama_decode(ctx, batch) == 0
    return np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, 0), shape=(vocab,)).copy()


@contextlib.contextmanager
def split_on():
    """The lone row's key split on for the block (the library's default; the controls below),
    then as it was."""
    from unsee.impl.engines.llamacpp.kernels import is_lone_row_exact, set_lone_row_split
    from unsee.impl.engines.llamacpp.model import llama_module

    was_off = is_lone_row_exact()
    set_lone_row_split(llama_module(), True)
    try:
        yield
    finally:
        set_lone_row_split(llama_module(), not was_off)


def has_switch() -> bool:
    from unsee.impl.engines.llamacpp.kernels import find_setter
    from unsee.impl.engines.llamacpp.model import llama_module

    return find_setter(llama_module()) is not None


def decode_run(lm, threads: int, padded: bool) -> tuple[list[np.ndarray], bytes]:
    """A prompt of :data:`PROMPT` tokens as one forward, then :data:`STEPS` decode steps on
    ``threads`` threads (``padded``: as the engine feeds them, else lone rows): every step's
    logits, the KV blob."""
    from unsee.impl.engines.llamacpp.facts import forward, read_state
    from unsee.impl.engines.llamacpp.model import llama_module

    lc = llama_module()
    ctx = lm.new_context(1024)
    batch = lc.llama_batch_init(1024, 0, 1)
    try:
        lc.llama_set_n_threads(ctx, threads, threads)
        tokens = [int(t) for t in np.random.default_rng(7).integers(0, lm.vocab_size, PROMPT + STEPS)]
        forward(lc, ctx, batch, tokens[:PROMPT], 0, False, lm.vocab_size)
        step = (lambda tok, pos: forward(lc, ctx, batch, [tok], pos, False, lm.vocab_size)) if padded else \
            (lambda tok, pos: lone_step(lc, ctx, batch, tok, pos, lm.vocab_size))
        logits = [step(tok, PROMPT + i) for i, tok in enumerate(tokens[PROMPT:])]
        return logits, read_state(lc, ctx)
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny GGUF on one thread, 1,024 cells (its decode facts measured once for the module)."""
    from unsee.impl.engines.llamacpp.model import load_llamacpp

    return load_llamacpp("tiny", threads=1, n_ctx=1024, cache_dir=tmp_path_factory.mktemp("facts"))


def test_the_engines_step_on_two_threads_has_one_threads_bits(tiny):
    lm = tiny
    one_logits, one_kv = decode_run(lm, 1, padded=True)  # one thread: never padded
    two_logits, two_kv = decode_run(lm, 2, padded=True)
    assert all(np.array_equal(a, b) for a, b in zip(one_logits, two_logits)) and one_kv == two_kv
    # the control: a lone row on two threads, the split on, sums the keys in another order
    with split_on():
        lone_logits, lone_kv = decode_run(lm, 2, padded=False)
        padded_logits, padded_kv = decode_run(lm, 2, padded=True)  # padded where the split is on
    assert not all(np.array_equal(a, b) for a, b in zip(one_logits, lone_logits)) and lone_kv != one_kv
    assert all(np.array_equal(a, b) for a, b in zip(one_logits, padded_logits)) and padded_kv == one_kv


@pytest.mark.skipif(not llamacpp.available() or not has_switch(),
                    reason="this llama-cpp-python lacks the split switch (`make install` builds it)")
def test_with_the_switch_a_lone_row_on_two_threads_is_one_threads_unpadded(tiny, monkeypatch):
    """The split off (the loader's doing): a one-row step on two threads, fed as the engine
    feeds it, is never padded, and its logits and KV are one thread's."""
    from unsee.impl.engines.llamacpp import facts
    from unsee.impl.engines.llamacpp.kernels import is_lone_row_exact

    assert is_lone_row_exact() and tiny.info["lone_row_split"] == "off"
    one_logits, one_kv = decode_run(tiny, 1, padded=False)

    def refused(*args, **kwargs):
        raise AssertionError("a step was padded")
    monkeypatch.setattr(facts, "forward_padded", refused)
    for padded in (True, False):  # through the engine's forward, and as a bare row
        logits, kv = decode_run(tiny, 2, padded=padded)
        assert all(np.array_equal(a, b) for a, b in zip(one_logits, logits)) and kv == one_kv


def test_the_split_switch_patches_the_source_it_was_written_for():
    from unsee.impl.engines.llamacpp.kernels import ANCHOR, SETTER, SPLIT_DECISION, patch_source

    source = f"#include <algorithm>\n{ANCHOR}\n    {SPLIT_DECISION} && nek1 >= 512;\n"
    patched = patch_source(source)
    assert SETTER in patched and "#include <atomic>" in patched and SPLIT_DECISION not in patched
    assert "!use_ref && ggml_cpu_fa_split_kv.load(std::memory_order_relaxed) && (neq1 == 1" in patched
    assert patched.index(SETTER) < patched.index("ggml_cpu_fa_split_kv.load")
    with pytest.raises(ValueError, match="another llama.cpp"):
        patch_source(patched)  # once only: the decision it changes is gone
    with pytest.raises(ValueError, match="use_split_kv_path"):
        patch_source("#include <algorithm>\n" + ANCHOR)


def new_rows(lm, threads: int, slots: int):
    """A :class:`LlamaRows` over ``lm`` whose context has ``threads`` for both forward kinds and
    ``slots`` sequences (the model's own settings are left as they were)."""
    from unsee.impl.engines.llamacpp.rows import LlamaRows

    saved = lm.threads, lm.batch_threads, lm.slots
    lm.threads, lm.batch_threads, lm.slots = threads, threads, slots
    try:
        return LlamaRows(lm)
    finally:
        lm.threads, lm.batch_threads, lm.slots = saved


def test_a_batch_of_steps_on_two_threads_has_each_steps_one_thread_bits(tiny):
    """Two lineages past 256 tokens, their steps decoded together (one forward of two rows,
    each in its own stream: the split never applies) on a context of two threads, then a
    step of one alone (whole, or padded without the switch): every logit and each lineage's KV digest equal the same
    steps of each lineage alone on one thread. The control: the same steps of one lineage
    fed as lone unpadded rows on that context, the split on, differ."""
    from unsee.impl.engines.scheduler import StepRequest

    lm = tiny
    rng = np.random.default_rng(11)
    tokens = {h: [int(t) for t in rng.integers(0, lm.vocab_size, PROMPT + STEPS + 1)] for h in "ab"}
    rows = new_rows(lm, threads=2, slots=2)
    assert rows.can_batch and rows.batch_limit == 2 and rows.lc.llama_n_threads_batch(rows.ctx) == 2
    lins = {h: rows.new() for h in "ab"}
    together = {h: [rows.forward(h, lins[h], tokens[h][:PROMPT], False)] for h in "ab"}
    for i in range(PROMPT, PROMPT + STEPS):
        out = rows.forward_steps([StepRequest(h, lins[h], tokens[h][i], 0) for h in "ab"])
        for h, logits in zip("ab", out, strict=True):
            together[h].append(logits)
    together["a"].append(rows.forward("a", lins["a"], [tokens["a"][-1]], False))  # alone, on two threads
    del tokens["b"][-1]
    digests = {h: rows.digest(h, lins[h]) for h in "ab"}
    one = new_rows(lm, threads=1, slots=1)
    for h in "ab":
        lin = one.new()
        alone = [one.forward(h, lin, tokens[h][:PROMPT], False)]
        alone += [one.forward(h, lin, [tok], False) for tok in tokens[h][PROMPT:]]
        assert len(alone) == len(together[h]) and all(np.array_equal(x, y) for x, y in zip(alone, together[h]))
        assert one.digest(h, lin) == digests[h]
    lone = new_rows(lm, threads=2, slots=2)
    lin = lone.new()
    lone.forward("a", lin, tokens["a"][:PROMPT], False)
    with split_on():
        rows_alone = [lone.forward_steps([StepRequest("a", lin, tok, 0)])[0] for tok in tokens["a"][PROMPT:-1]]
    assert not all(np.array_equal(x, y) for x, y in zip(rows_alone, together["a"][1:]))


def test_an_episode_on_every_core_equals_one_thread_and_records_no_threads(tmp_path, monkeypatch):
    """The loader's default made 2 threads (every core with the split switch, else 1) against one thread: the episode's
    digest and every block's tokens equal; neither store records a thread count, and one
    written on one thread opens on two with its digest."""
    from unsee.impl.agent.episode import parse_episode
    from unsee.impl.agent.runtime import AgentRuntime
    from unsee.impl.engines.llamacpp import model
    from unsee.impl.engines.registry import make_engine
    from unsee.impl.store.backend import get_engine_meta
    from unsee.impl.store.session import PersistentSession

    monkeypatch.delenv("UNSEE_LLAMA_THREADS", raising=False)
    monkeypatch.delenv("UNSEE_LLAMA_BATCH_THREADS", raising=False)
    monkeypatch.setattr(model, "get_default_decode_threads", lambda: 2)
    episode = parse_episode(json.loads(EXAMPLE.read_text()))
    results, engines = {}, {}
    for threads in (1, None):
        lm = model.load_llamacpp("tiny", threads=threads, n_ctx=2048, cache_dir=tmp_path)
        engines[lm.threads] = engine = make_engine(lm)
        base = AgentRuntime.from_episode(engine, episode)
        assert lm.thread_invariant and sum(len(b.tokens) for b in base.graph.blocks()) > 256
        results[lm.threads] = (base.digest(), [b.tokens for b in base.graph.blocks()])
        options = json.loads(get_engine_meta(engine)["engine_options"])
        assert "threads" not in options and "batch_threads" not in options
        if lm.threads == 1:
            with PersistentSession.create(tmp_path / "one.db", base):
                pass
    assert set(results) == {1, 2} and results[1] == results[2]
    with PersistentSession.open(tmp_path / "one.db", engines[2]) as session:
        assert session.runtime.digest() == results[1][0]
