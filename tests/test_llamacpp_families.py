"""The tiny GGUF families beside llama (impl/engines/llamacpp/tiny_gguf.py):
what llama.cpp makes of the files, and why each is written as it is.

The verbs and forget == reset run on every family in
properties/prop_zoo_llamacpp.py; the two-cache windowed families in
tests/test_llamacpp_swa.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from unsee.impl.engines.llamacpp import engine as llamacpp
from unsee.impl.engines.llamacpp import tiny_gguf
from unsee.impl.engines.llamacpp.model import llama_module
from unsee.impl.engines.llamacpp.tiny_gguf import TINY_MOE, TINY_WINDOW, Family, write_tiny_gguf
from unsee.properties.differential import engine_scope

needs_llamacpp = pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed")


def load_model(path):
    """llama.cpp's model of the file at ``path`` (no context), or None where llama.cpp refuses it."""
    lc = llama_module()
    lc.llama_backend_init()
    params = lc.llama_model_default_params()
    params.n_gpu_layers = 0
    return lc.llama_model_load_from_file(str(path).encode(), params) or None


def n_swa_of(path) -> int:
    """llama.cpp's sliding window for the file at ``path`` (0: none), read at load."""
    model = load_model(path)
    assert model is not None, path
    try:
        return int(llama_module().llama_model_n_swa(model))
    finally:
        llama_module().llama_model_free(model)


@pytest.mark.parametrize("family", ["phi3", "qwen2moe"])
def test_new_families_are_pure_functions_of_their_seed(tmp_path, family):
    a = write_tiny_gguf(tmp_path / "a.gguf", family=family)
    b = write_tiny_gguf(tmp_path / "b.gguf", family=family)
    c = write_tiny_gguf(tmp_path / "c.gguf", family=family, seed=1)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_qwen2moe_file_holds_the_experts_quantised_and_the_router_in_f32(tmp_path):
    import gguf

    reader = gguf.GGUFReader(write_tiny_gguf(tmp_path / "moe.gguf", family="qwen2moe"))
    tensors = {t.name: t for t in reader.tensors}
    kinds = {name: t.tensor_type.name for name, t in tensors.items() if name.startswith("blk.0.ffn")}
    assert kinds == {"blk.0.ffn_norm.weight": "F32", "blk.0.ffn_gate_inp.weight": "F32",
                     "blk.0.ffn_gate_exps.weight": "Q4_1", "blk.0.ffn_up_exps.weight": "Q4_1",
                     "blk.0.ffn_down_exps.weight": "Q4_1", "blk.0.ffn_gate_inp_shexp.weight": "F32",
                     "blk.0.ffn_gate_shexp.weight": "Q4_1", "blk.0.ffn_up_shexp.weight": "Q4_1",
                     "blk.0.ffn_down_shexp.weight": "Q4_1"}
    # GGUF lists dimensions innermost first: (in, out, experts)
    assert [int(n) for n in tensors["blk.0.ffn_gate_exps.weight"].shape] == [64, TINY_MOE["ffn"], TINY_MOE["experts"]]
    assert reader.fields["qwen2moe.expert_used_count"].parts[-1][0] == TINY_MOE["used"]


@needs_llamacpp
@pytest.mark.parametrize("name", ["unsee-tiny-phi3", "Phi-3 mini"])
def test_phi3_under_a_phi3_name_is_refused_by_llamacpps_vocabulary(tmp_path, monkeypatch, name):
    # llama.cpp keys Phi-3's token attributes on the model's name and looks up <s>, </s>, <unk> by text,
    # which the byte vocabulary lacks: the reason the family's file carries another name
    shipped = tiny_gguf.FAMILIES["phi3"]
    assert n_swa_of(write_tiny_gguf(tmp_path / "shipped.gguf", family="phi3")) == 0  # it loads
    monkeypatch.setitem(tiny_gguf.FAMILIES, "phi3", dataclasses.replace(shipped, name=name))
    assert load_model(write_tiny_gguf(tmp_path / "named.gguf", family="phi3")) is None


@needs_llamacpp
def test_phi3_window_is_turned_off_by_llamacpp(engine_factory):
    # the file carries a 16-token window, as converted Phi-3 files carry theirs; llama.cpp disables
    # Phi-3's window, so the engine sees one full-attention cache holding every position
    engine = engine_factory("llamacpp-tiny-phi3", n_ctx=256)
    assert engine.lm.n_swa == 0
    with engine_scope(engine):
        lin = engine.new_lineage()
        engine.prefill(lin, [int(t) for t in np.random.default_rng(0).integers(0, 256, 3 * TINY_WINDOW)])
        engine.flush(lin)  # a chunk that short is otherwise pending, not yet in the backend
        state = engine.kv.read_seq()
    assert len(state.caches) == 1
    assert list(state.caches[0].positions) == list(range(3 * TINY_WINDOW))


@needs_llamacpp
def test_llama_architecture_reads_no_window(tmp_path, monkeypatch):
    # why there is no llamacpp-tiny-mistral: llama.cpp converts Mistral to the llama architecture,
    # and a llama file that carries a window loads without one
    monkeypatch.setitem(tiny_gguf.FAMILIES, "mistral", Family("llama", window=TINY_WINDOW))
    assert n_swa_of(write_tiny_gguf(tmp_path / "mistral.gguf", family="mistral")) == 0
    assert n_swa_of(tiny_gguf.tiny_gguf_path(tmp_path, family="gemma2")) == TINY_WINDOW  # a window llama.cpp reads
