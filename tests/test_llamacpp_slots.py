"""Several lineages resident in one llama.cpp context (``slots``), and their decode steps
in one forward (impl/engines/llamacpp/rows.py; issue 40, item 4).

Every bitwise fact of the engine was measured on a context of one sequence. A context
of several slots, each its own stream of cells, must give every verb the same bits: the
tests run one script of verbs on a one-slot engine and on slotted ones (more lineages
than slots, so slots are parked and reloaded) and compare tokens, logits and digests;
then a batch of next tokens against each step alone."""

from __future__ import annotations

import random

import numpy as np
import pytest

from unsee.impl.engines.llamacpp import engine as llamacpp
from unsee.impl.engines.scheduler import StepRequest

pytestmark = pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed")


def make(engine_factory, slots: int, **options):
    return engine_factory("llamacpp-tiny", n_ctx=512, slots=slots, **options)


def prefill_now(engine, handle: str, ids: list[int]) -> None:
    """``engine.prefill`` computed now: a chunk of at most ``max_forward`` tokens is otherwise left
    pending until a verb reads the KV, and these tests read the backend, which holds computed rows only."""
    engine.prefill(handle, ids)
    engine.flush(handle)


def run_script(engine, seed: int, lineages: int = 5) -> list:
    """Prefills, turns, forks, crops (a fork's shorter prefix) and drops over ``lineages``
    lineages, interleaved: every turn's tokens, logits and digest, in order."""
    rng, out = random.Random(seed), []
    handles = [engine.new_lineage() for _ in range(lineages)]
    for r in range(3):
        for i, h in enumerate(handles):
            engine.prefill(h, [rng.randrange(3, 250) for _ in range(rng.choice([1, 7, 70, 130]))])
            out.append(engine.generate(h, rng.randrange(1, 6), stop_ids=()))
            out.append(engine.logits(h))
            out.append(engine.digest(h))
        src = handles[r]
        fork = engine.fork(src, len(engine.tokens(src)) // 2)
        engine.prefill(fork, [rng.randrange(3, 250) for _ in range(9)])
        out += [engine.logits(fork), engine.digest(fork), engine.digest(src)]
        engine.drop(handles[-1 - r])
        handles[-1 - r] = fork
    return out


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        if x is None or isinstance(x, (str, list)):
            assert x == y, f"item {i}"
        else:
            assert np.array_equal(x.numpy(), y.numpy()), f"item {i}: logits differ"


@pytest.mark.parametrize("slots", [2, 4])
@pytest.mark.parametrize("flash_attn", [True, False], ids=["flash-attn", "v-transposed"])
def test_verbs_on_many_slots_equal_one_slot_bitwise(engine_factory, slots, flash_attn):
    one = make(engine_factory, 1, flash_attn=flash_attn)
    many = make(engine_factory, slots, flash_attn=flash_attn)
    assert many.kv.slots == slots and one.kv.slots == 1
    assert_same(run_script(many, seed=slots), run_script(one, seed=slots))
    assert sum(h is not None for h in many.kv.held) <= slots


@pytest.mark.parametrize("flash_attn", [True, False], ids=["flash-attn", "v-transposed"])
def test_a_slot_state_blob_round_trips(engine_factory, flash_attn):
    """A lineage in slot 2 of 3: parsed from the state of every stream, written back as llama.cpp's
    own bytes, and loaded into another slot, read back the same."""
    engine = make(engine_factory, 3, flash_attn=flash_attn)
    rows = engine.kv
    handles = [engine.new_lineage() for _ in range(3)]
    for i, h in enumerate(handles):
        prefill_now(engine, h, list(range(40, 50 + 7 * i)))
    slot = rows.get_slot(handles[2])
    kv = rows.read_seq(slot)
    assert kv.n == 24 and list(kv.caches[0].positions) == list(range(24))
    assert len(kv.to_blob(3, slot)) == rows.lc.llama_state_seq_get_size(rows.ctx, slot)
    assert kv.to_blob(3, slot) == rows.read_blob(slot)
    other = (slot + 1) % 3
    rows.park(*rows.held[other])
    rows.clear_slot(other)
    lin = engine.get_lineage(handles[2])
    rows.clear_slot(slot)
    lin.kv = kv
    assert rows.make_resident(handles[2], lin) in (slot, other)
    assert rows.read_seq(rows.get_slot(handles[2])).to_blob() == kv.to_blob()


def test_a_batch_of_next_tokens_equals_each_step_alone(engine_factory):
    """One forward of three lineages' next tokens (histories of different lengths): each
    lineage's logits and KV equal those of its own one-token step on a one-slot engine."""
    one, many = make(engine_factory, 1), make(engine_factory, 4)
    rng = random.Random(7)
    histories = [[rng.randrange(3, 250) for _ in range(n)] for n in (5, 61, 140)]
    nexts = [rng.randrange(3, 250) for _ in histories]
    alone, pairs = [], []
    for hist, tok in zip(histories, nexts):
        a, b = one.new_lineage(), many.new_lineage()
        prefill_now(one, a, hist)
        prefill_now(many, b, hist)
        one.prefill(a, [tok])
        alone.append((one.logits(a).numpy(), one.digest(a)))
        pairs.append(b)
    out = many.kv.forward_steps([StepRequest(b, many.get_lineage(b), tok, 0) for b, tok in zip(pairs, nexts)])
    for got, b, (logits, digest) in zip(out, pairs, alone):
        assert np.array_equal(got, logits)
        assert many.digest(b) == digest


def test_a_batch_of_prefill_chunks_equals_each_chunk_alone(engine_factory):
    """One forward of five lineages' prefill chunks of other lengths, up to ``max_forward``
    (so llama.cpp cuts it into micro-batches of an equal share of every stream, and cuts the
    longer chunks): each lineage's logits and KV equal its chunk's own forward on a one-slot
    engine, and a chunk longer than ``max_forward`` is refused before anything runs."""
    one, many = make(engine_factory, 1), make(engine_factory, 5)
    cap = many.lm.max_forward
    assert cap >= 40 and many.max_forward == cap
    rng = random.Random(11)
    histories = [[rng.randrange(3, 250) for _ in range(n)] for n in (0, 5, 61, 140, 9)]
    chunks = [[rng.randrange(3, 250) for _ in range(n)] for n in (cap, 2, 37, cap - 1, 3)]
    alone, handles = [], []
    for hist, chunk in zip(histories, chunks):
        a, b = one.new_lineage(), many.new_lineage()
        for engine, h in ((one, a), (many, b)):
            if hist:
                prefill_now(engine, h, hist)
        one.prefill(a, chunk)
        alone.append((one.logits(a).numpy(), one.digest(a)))
        handles.append(b)
    steps = [StepRequest(b, many.get_lineage(b), c[-1], 0, tuple(c)) for b, c in zip(handles, chunks)]
    with pytest.raises(ValueError, match="max_forward"):
        many.kv.forward_steps([*steps[:1], StepRequest(handles[1], many.get_lineage(handles[1]), 5, 0,
                                                        (5,) * (cap + 1))])
    assert [len(many.tokens(b)) for b in handles] == [len(h) for h in histories]
    out = many.kv.forward_steps(steps)
    for got, b, (logits, digest) in zip(out, handles, alone):
        assert np.array_equal(got, logits)
        assert many.digest(b) == digest


def test_a_batch_never_parks_one_of_its_own_lineages(engine_factory):
    """Two slots, three lineages, a batch of the two not resident together: loading the
    second parks the least recently used slot that is not the first's, and each lineage
    gets its token (equal histories, equal digests)."""
    engine = make(engine_factory, 2)
    handles = [engine.new_lineage() for _ in range(3)]
    for h in handles:
        prefill_now(engine, h, [10, 11, 12])  # handles[0] is parked by handles[2]'s prefill
    steps = [StepRequest(h, engine.get_lineage(h), 13, 0) for h in (handles[2], handles[0])]
    engine.kv.forward_steps(steps)
    assert [engine.tokens(h) for h in handles] == [[10, 11, 12, 13], [10, 11, 12], [10, 11, 12, 13]]
    assert engine.digest(handles[0]) == engine.digest(handles[2])
    with pytest.raises(ValueError, match="distinct lineages"):
        engine.kv.forward_steps(steps[:1] * 2)


@pytest.mark.parametrize("slots", [1, 3])
def test_memory_counts_resident_rows_in_place_as_reading_them_out_would(engine_factory, slots):
    """A server counts memory after every request: resident lineages changed since they were
    parked are counted without reading their rows out (none is parked by counting), at the
    bytes their parked copies hold once read."""
    engine = make(engine_factory, slots)
    handles = [engine.new_lineage() for _ in range(slots)]
    for i, h in enumerate(handles):
        engine.prefill(h, list(range(5, 40 + 9 * i)))
        engine.generate(h, 3, stop_ids=())
    assert all(engine.get_lineage(h).kv is None for h in handles)  # resident, changed since parked
    counted = engine.budget.memory().held_bytes
    assert all(engine.get_lineage(h).kv is None for h in handles)  # counting read nothing out
    for h in handles:
        engine.kv.park(h, engine.get_lineage(h))
    assert engine.budget.memory().held_bytes == counted


def test_a_sliding_window_model_keeps_one_slot(engine_factory):
    engine = engine_factory("llamacpp-tiny-gemma2", n_ctx=256, slots=4)
    assert engine.lm.n_swa and engine.kv.slots == 1 and not engine.kv.can_batch


def test_a_batch_in_any_order_gives_each_step_its_own_logits_in_the_order_given(engine_factory):
    """The batch is fed by ascending slot (facts.forward_steps: llama.cpp computes a batch over a
    stream per sequence in micro-batches of consecutive sequence ids, in batch order); each step's
    logits come back where it was asked, equal to its step alone."""
    one, many = make(engine_factory, 1), make(engine_factory, 4)
    histories = [[5 + i, 40 + i, 90 + i] for i in range(3)]
    handles = [many.new_lineage() for _ in histories]
    alone = []
    for hist, b in zip(histories, handles):
        prefill_now(many, b, hist)
        a = one.new_lineage()
        one.prefill(a, [*hist, 7])
        alone.append(one.logits(a).numpy())
    order = [2, 0, 1]  # not the slots' order
    out = many.kv.forward_steps([StepRequest(handles[i], many.get_lineage(handles[i]), 7, 0) for i in order])
    for got, i in zip(out, order):
        assert np.array_equal(got, alone[i])
    fed = [many.kv.batch.seq_id[row][0] for row in range(3)]
    assert fed == sorted(fed) and fed != [many.kv.get_slot(handles[i]) for i in order]  # fed by slot, not as asked


def test_micro_batches_follow_llamacpps_split_of_a_batch_over_streams():
    from unsee.impl.engines.llamacpp.facts import count_micro_batches

    assert count_micro_batches([0, 1, 2, 3]) == 1
    assert count_micro_batches([3, 0, 1, 2]) == 2  # unsorted: {3}, then {0, 1, 2}
    assert count_micro_batches([0, 2, 5]) == 3 and count_micro_batches(sorted([5, 0, 2])) == 3
    assert count_micro_batches([1, 0]) == 2 and count_micro_batches([]) == 0
