"""Repacked Q4_K summed in decode's order (impl/engines/llamacpp/repack.py; issue 50).

llama.cpp repacks Q4_K weights for its CPU and multiplies them by one activation row
(a decode step) with one kernel, by four or more (a prefill chunk, a batch of
conversations' steps) with another, whose float sums are made in another order. The
library's second switch (``make install`` builds it) makes the batched kernel keep the
one-row kernel's order. These tests pin what the engine rests on, on a tiny Q4_K_M file
quantised by llama.cpp itself: with the switch, a forward of 40 tokens (the 16-row and the
4-row loops, and a one-row remainder) gives each row the logits and KV of decode steps,
and the loader's facts find forwards of 32 tokens and more equal; the control, the switch
off for the block, differs. The patch itself refuses a source it was not written for, and a
store records the setting (one written before it reopens on the file's layout)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

from unsee.impl.engines.llamacpp import engine as llamacpp

pytestmark = pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed")

TOKENS = 40  # 16 + 16 + 4 rows in the batched kernel, 4 more by the one-row kernel: 36 + 4


def has_row_order() -> bool:
    from unsee.impl.engines.llamacpp.kernels import find_setter
    from unsee.impl.engines.llamacpp.model import llama_module
    from unsee.impl.engines.llamacpp.repack import ROW_ORDER_SETTER

    return find_setter(llama_module(), ROW_ORDER_SETTER) is not None


needs_switch = pytest.mark.skipif(not llamacpp.available() or not has_row_order(),
                                  reason="this llama-cpp-python lacks the row-order switch (`make install` builds it)")


@contextlib.contextmanager
def row_order_off():
    """llama.cpp's own gemm order for the block (the control), then the row order again."""
    from unsee.impl.engines.llamacpp.kernels import set_repack_row_order
    from unsee.impl.engines.llamacpp.model import llama_module

    assert set_repack_row_order(llama_module(), False)
    try:
        yield
    finally:
        assert set_repack_row_order(llama_module(), True)


@pytest.fixture(scope="module")
def q4k(tmp_path_factory):
    """The tiny Q4_K_M GGUF on one thread, its decode facts measured once for the module."""
    from unsee.impl.engines.llamacpp.model import load_llamacpp
    from unsee.impl.engines.llamacpp.tiny_gguf import write_tiny_q4k_gguf

    root = tmp_path_factory.mktemp("q4k")
    return load_llamacpp(write_tiny_q4k_gguf(root / "tiny-q4k.gguf"), threads=1, n_ctx=256, cache_dir=root)


def run(lm, at_once: bool) -> tuple[np.ndarray, bytes]:
    """:data:`TOKENS` fixed tokens from position 0 as one forward (``at_once``) or as decode steps:
    every position's logits, the KV blob."""
    from unsee.impl.engines.llamacpp.facts import forward, read_state
    from unsee.impl.engines.llamacpp.model import llama_module

    lc = llama_module()
    ctx, batch = lm.new_context(64), lc.llama_batch_init(64, 0, 1)
    try:
        tokens = [int(t) for t in np.random.default_rng(3).integers(0, lm.vocab_size, TOKENS)]
        if at_once:
            logits = forward(lc, ctx, batch, tokens, 0, True, lm.vocab_size)
        else:
            logits = np.stack([forward(lc, ctx, batch, [t], i, False, lm.vocab_size) for i, t in enumerate(tokens)])
        return logits.reshape(TOKENS, lm.vocab_size), read_state(lc, ctx)
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)


@needs_switch
def test_a_q4k_forward_gives_every_row_its_decode_steps_bits_and_the_control_does_not(q4k):
    assert q4k.row_order
    assert "repacked Q4_K summed in decode's order" in q4k.determinism_statement
    steps, steps_kv = run(q4k, at_once=False)
    prefill, prefill_kv = run(q4k, at_once=True)
    assert np.array_equal(prefill, steps) and prefill_kv == steps_kv
    with row_order_off():  # llama.cpp's own order: the same weights, other sums
        own, own_kv = run(q4k, at_once=True)
        own_steps, _ = run(q4k, at_once=False)
    assert np.array_equal(own_steps, steps)  # a lone row takes the one-row kernel either way
    assert not np.array_equal(own, steps) and own_kv != steps_kv


@needs_switch
def test_the_loaders_facts_find_long_forwards_equal_on_q4k(q4k):
    """Under llama.cpp's own repacked kernels a forward of 4 tokens already differs
    (docs/engines.md, ``max_forward`` 3); in decode's order the facts find 32 and more equal."""
    assert q4k.max_forward >= 32 and q4k.draft_bound == 0.0


@needs_switch
def test_a_process_takes_one_side_of_the_switch(q4k):
    from unsee.impl.engines.llamacpp.model import load_llamacpp

    with pytest.raises(ValueError, match="in a process of their own"):
        load_llamacpp(q4k.source, threads=1, n_ctx=256, exact_kernels=False)
    with pytest.raises(ValueError, match="needs exact kernels"):
        load_llamacpp(q4k.source, exact_kernels=False, row_order=True)


def test_after_llamacpps_own_repacking_an_exact_load_keeps_the_files_layout(monkeypatch):
    from unsee.impl.engines.llamacpp import model

    monkeypatch.setitem(model._BACKEND, "repacking", "llama.cpp's own")  # as an earlier repacked load leaves it
    lc = model.llama_module()
    assert model.use_row_order(lc, exact_kernels=True, row_order=None) is False
    assert model.use_row_order(lc, exact_kernels=True, row_order=False) is False
    with pytest.raises(ValueError, match="with llama.cpp's own kernels for an earlier load"):
        model.use_row_order(lc, exact_kernels=True, row_order=True)


def read_vendored(part: Path) -> str:
    """``part`` of the llama.cpp that llama-cpp-python 0.3.36 vendors, as its sdist holds it (kept by
    ``make install`` under out/llama-kernels, whose extracted copy is the patched one)."""
    import tarfile

    sdist = Path("out/llama-kernels/llama_cpp_python-0.3.36.tar.gz")
    if not sdist.is_file():
        pytest.skip("the llama.cpp source is fetched by `make install` (out/llama-kernels)")
    with tarfile.open(sdist) as tar:
        return tar.extractfile(f"llama_cpp_python-0.3.36/vendor/llama.cpp/{part.as_posix()}").read().decode()


def test_the_repack_patch_rewrites_the_source_it_was_written_for():
    from unsee.impl.engines.llamacpp.repack import (
        GEMM,
        LOOP_4,
        LOOP_16,
        REPACK,
        ROW_ORDER_SETTER,
        X86_REPACK,
        patch_repack,
        patch_repack_types,
    )

    x86, types = read_vendored(X86_REPACK), read_vendored(REPACK)
    patched = patch_repack(x86)
    gemm = patched[patched.index(GEMM):]
    # 8 multiply-adds held as integer sums in each of the two row loops, 8 made once per super-block
    assert gemm.count("if (row_order) { isum") == 16 and gemm.count("_mm256_cvtepi32_ps(isum_rows[") == 8
    assert patched.count("extern std::atomic<bool> ggml_cpu_repack_row_order;") == 1
    assert LOOP_16 in gemm and LOOP_4 in gemm
    with pytest.raises(ValueError, match="multiply-adds"):
        patch_repack(patched)  # once only: the multiply-adds it moves are gone
    with pytest.raises(ValueError, match="another llama.cpp"):
        patch_repack(x86.replace(GEMM, "void renamed("))
    typed = patch_repack_types(types)
    assert ROW_ORDER_SETTER in typed and "cur->type != GGML_TYPE_Q4_K" in typed
    with pytest.raises(ValueError, match="another llama.cpp"):
        patch_repack_types(typed.replace('#include "repack.h"', ""))


def test_a_store_records_the_row_order_and_one_written_before_reopens_on_the_files_layout():
    from unsee.impl.store.backend import read_stored_engine

    before = {"backend": "llamacpp", "model": "tiny", "model_ref": "tiny",
              "engine_options": json.dumps({"flash_attn": True, "n_ctx": 256, "exact_kernels": True})}
    assert read_stored_engine(before).options["row_order"] is False
    now = {**before, "engine_options": json.dumps({"flash_attn": True, "exact_kernels": True, "row_order": True})}
    assert read_stored_engine(now).options["row_order"] is True
    from unsee.impl.store.backend import RECORDED_OPTIONS

    assert "row_order" in RECORDED_OPTIONS["llamacpp"]


def test_the_row_order_bench_puts_each_setting_against_llamacpps_own():
    from unsee.bench.llamacpp_row_order import KERNELS, get_table

    def row(kind, decode, prefill):
        return {"kernels": kind, "threads": 2, "max_forward": 63, "decode_ms": decode, "decode_cpu_ms": 2 * decode,
                "prefill_ms": prefill, "prefill_cpu_ms": 2 * prefill}

    table = get_table([row("row", 44.0, 15.0), row("repacked", 40.0, 12.0)]).splitlines()
    assert "| row | 2 | 63 | 44.0 (88.0) | 15.0 (30.0) | 1.10x | 1.25x |" in table
    assert "| repacked | 2 | 63 | 40.0 (80.0) | 12.0 (24.0) | 1.00x | 1.00x |" in table
    assert get_table([row("file", 50.0, 20.0)]).splitlines()[-1].endswith("| - | - |")  # no reference run
    assert set(KERNELS) == {"file", "row", "repacked"} and KERNELS["row"]["row_order"] is True
