"""Tiny random GGUF files of the architecture families llama.cpp runs, for fast llama.cpp properties.

``tiny_gguf_path(family=...)`` writes one once under the cache dir
($UNSEE_CACHE or ~/.cache/unsee) and returns the path; each file is a pure
function of its family, :data:`TINY_GGUF_SHAPE`, the quantisation and the
seed, so every machine writes the same bytes. Written with the ``gguf``
package the project already depends on. The families (:data:`FAMILIES`):

=========  ===============================================================
llama      the tiny Llama (``llamacpp-tiny``)
qwen2      Llama plus q/k/v biases
qwen3      Llama plus per-head q/k RMS norms
gemma2     sliding-window attention on every other layer (window
           :data:`TINY_WINDOW`), post-attention and post-FFN norms, attention
           and final logit soft-capping, tied embeddings
gemma3     5 sliding-window layers to 1 global (llama.cpp's fixed pattern
           for gemma3), q/k norms, a local RoPE base of 10,000 beside the
           global one
phi3       one fused qkv projection, one fused gate+up projection; the file
           carries a window (:data:`TINY_WINDOW`) as converted Phi-3 files
           do, which llama.cpp turns off for this architecture (one cache)
qwen2moe   Qwen2's q/k/v biases, and a mixture of :data:`TINY_MOE` experts
           (top 2, softmax router) beside a shared expert behind a sigmoid
           gate, in every layer
=========  ===============================================================

Mistral has no family here: llama.cpp converts it to the ``llama``
architecture, whose loader reads no sliding window (a ``llama`` file that
carries one loads with ``n_swa == 0``), so it would be ``llama`` again.

llama.cpp keeps two KV caches for the sliding-window families (the engine
asks for full-size ones, so that crops are exact; state.py parses both).

The vocabulary is the tiny transformers model's byte tokenizer
(:class:`unsee.impl.engines.files.ByteTokenizer`: ids 0..255 are bytes, then
``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``). llama.cpp needs a
vocabulary to load a model, so the file carries one in SentencePiece form
(byte tokens named ``<0xNN>``), but the engine tokenises with
``ByteTokenizer`` itself and only ever hands llama.cpp token ids.

The files' ``general.name`` is ``unsee-tiny-<family>``, but for phi3:
llama.cpp's vocabulary loader recognises Phi-3 by a model name containing
``phi3`` or ``phi-3`` and then sets text-tokenizer attributes on the tokens
``<s>``, ``</s>``, ``<unk>`` and ``<|endoftext|>``, looked up by text with
``unordered_map::at``; the byte vocabulary has no ``<s>``, ``</s>`` or
``<unk>``, so the load fails ("error loading model vocabulary:
unordered_map::at"). Those attributes only change how llama.cpp splits
text around special tokens, which the engine never asks it to do, so the
phi3 file is named ``unsee-tiny-phi_3`` instead of growing the vocabulary
past the byte tokenizer's 259 ids.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from unsee.impl.engines.files import ByteTokenizer, default_cache_dir

#: Dimensions of the tiny GGUFs (those of the tiny transformers model); gemma3 has 6 layers (its 5:1 pattern).
TINY_GGUF_SHAPE = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 128, "context": 4096}
#: the Q4_K file's (:func:`write_tiny_q4k_gguf`): a Q4_K row holds 256 weights, so every width is a multiple
TINY_Q4K_SHAPE = {**TINY_GGUF_SHAPE, "hidden": 256, "ffn": 512}
#: llama.cpp's file type of Q4_K_M (llama_ftype), as Qwen2.5's GGUF is quantised
LLAMA_FTYPE_Q4_K_M = 15
TINY_GGUF_SEED = 0
#: the sliding window of the windowed families, in tokens: short, so that properties cross it
TINY_WINDOW = 16
#: the mixture of experts of qwen2moe (the transformers zoo's tiny-qwen2moe): experts, experts used per token,
#: each expert's FFN width and the shared expert's
TINY_MOE = {"experts": 4, "used": 2, "ffn": 32, "shared_ffn": 64}
_FORMAT = "v3"  # part of the file name: bump when the writer changes
#: how the linear weights are stored: Q4_1, as in SmolLM2's GGUF, whose CPU
#: kernels give decode == prefill bitwise (facts.py), so drafts run on the
#: tiny file as on SmolLM2's; "f32" writes every tensor in f32, where
#: llama.cpp's batched matmul differs from its decode in the last bits
TINY_GGUF_QUANT = "q4_1"

# SentencePiece token types as llama.cpp reads them (gguf.TokenType)
_NORMAL, _CONTROL, _BYTE = 1, 3, 6


@dataclass(frozen=True)
class Family:
    """What a family's file holds beyond the Llama layout."""

    arch: str  # the GGUF architecture name llama.cpp dispatches on
    layers: int = 2
    qkv_bias: bool = False
    qk_norm: bool = False
    fused: bool = False  # phi3's layout: one qkv projection, one gate+up projection
    moe: bool = False  # qwen2moe's FFN: TINY_MOE's experts and a gated shared expert
    post_norms: bool = False  # gemma: norms after attention and after the FFN
    tied: bool = False  # no output matrix: the token embedding is the LM head
    window: int = 0  # sliding window in tokens (0: none)
    softcap: bool = False  # gemma2's attention and final logit soft-capping
    name: str = ""  # general.name, when not unsee-tiny-<family> (phi3: see the module's docstring)


FAMILIES = {
    "llama": Family("llama"),
    "qwen2": Family("qwen2", qkv_bias=True),
    "qwen3": Family("qwen3", qk_norm=True),
    "gemma2": Family("gemma2", post_norms=True, tied=True, window=TINY_WINDOW, softcap=True),
    "gemma3": Family("gemma3", layers=6, qk_norm=True, post_norms=True, tied=True, window=TINY_WINDOW),
    "phi3": Family("phi3", fused=True, window=TINY_WINDOW, name="unsee-tiny-phi_3"),
    "qwen2moe": Family("qwen2moe", qkv_bias=True, moe=True),
}


#: the transformers zoo's families (``impl/engines/hf/zoo.py``, by name) that exist on llama.cpp: zoo name ->
#: family here (engine ``llamacpp-tiny`` for llama, ``llamacpp-tiny-<family>`` for the others)
ZOO_FAMILIES = {"tiny-llama": "llama", "tiny-qwen2": "qwen2", "tiny-qwen3": "qwen3", "tiny-gemma2": "gemma2",
                "tiny-gemma3": "gemma3", "tiny-phi3": "phi3", "tiny-qwen2moe": "qwen2moe"}
#: the zoo's families with no tiny GGUF, and why
NOT_ON_LLAMACPP = {"tiny-mistral": "llama.cpp converts Mistral to the llama architecture, whose loader reads no "
                                   "sliding window (a llama file that carries one loads with n_swa 0): it would be "
                                   "llamacpp-tiny again"}


def get_engine_name(family: str) -> str:
    """The one-word engine name (``UNSEE_ENGINE``) of tiny GGUF ``family``."""
    get_family(family)
    return "llamacpp-tiny" if family == "llama" else f"llamacpp-tiny-{family}"


def get_family(name: str) -> Family:
    """The family ``name``, or a ValueError naming the known ones."""
    if name not in FAMILIES:
        raise ValueError(f"tiny GGUF family {name!r} is not one of {tuple(FAMILIES)}")
    return FAMILIES[name]


def _layer_weights(rng: np.random.Generator, family: Family, p: str, s: dict) -> dict[str, np.ndarray]:
    """One layer's tensors, drawn in a fixed order; linear weights are (out, in)
    as in HF checkpoints. Entries of scale 1/sqrt(fan_in) keep activations of
    order one, so greedy decisions are not near-ties."""
    hidden, head_dim = s["hidden"], s["hidden"] // s["heads"]
    kv = s["kv_heads"] * head_dim

    def linear(out: int, inp: int) -> np.ndarray:
        return (rng.standard_normal((out, inp)) / np.sqrt(inp)).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    out = {p + "attn_norm.weight": ones(hidden)}
    if family.fused:
        out[p + "attn_qkv.weight"] = linear(hidden + 2 * kv, hidden)
    else:
        out |= {p + "attn_q.weight": linear(hidden, hidden), p + "attn_k.weight": linear(kv, hidden),
                p + "attn_v.weight": linear(kv, hidden)}
    if family.qkv_bias:
        out |= {p + f"attn_{x}.bias": (rng.standard_normal(n) * 0.1).astype(np.float32)
                for x, n in (("q", hidden), ("k", kv), ("v", kv))}
    if family.qk_norm:
        out |= {p + "attn_q_norm.weight": ones(head_dim), p + "attn_k_norm.weight": ones(head_dim)}
    out[p + "attn_output.weight"] = linear(hidden, hidden)
    if family.post_norms:
        out[p + "post_attention_norm.weight"] = ones(hidden)
    out[p + "ffn_norm.weight"] = ones(hidden)
    if family.moe:
        out |= _moe_weights(rng, p)
    elif family.fused:
        out[p + "ffn_up.weight"] = linear(2 * s["ffn"], hidden)
    else:
        out |= {p + "ffn_gate.weight": linear(s["ffn"], hidden), p + "ffn_up.weight": linear(s["ffn"], hidden)}
    if not family.moe:
        out[p + "ffn_down.weight"] = linear(hidden, s["ffn"])
    if family.post_norms:
        out[p + "post_ffw_norm.weight"] = ones(hidden)
    return out


def _moe_weights(rng: np.random.Generator, p: str) -> dict[str, np.ndarray]:
    """qwen2moe's FFN tensors (llama.cpp's names): the router, each expert's
    gate, up and down projections stacked (experts, out, in), the shared
    expert's sigmoid gate (one row) and its projections."""
    hidden, m = TINY_GGUF_SHAPE["hidden"], TINY_MOE

    def linear(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    return {p + "ffn_gate_inp.weight": linear(m["experts"], hidden),
            p + "ffn_gate_exps.weight": linear(m["experts"], m["ffn"], hidden),
            p + "ffn_up_exps.weight": linear(m["experts"], m["ffn"], hidden),
            p + "ffn_down_exps.weight": linear(m["experts"], hidden, m["ffn"]),
            p + "ffn_gate_inp_shexp.weight": linear(hidden),
            p + "ffn_gate_shexp.weight": linear(m["shared_ffn"], hidden),
            p + "ffn_up_shexp.weight": linear(m["shared_ffn"], hidden),
            p + "ffn_down_shexp.weight": linear(hidden, m["shared_ffn"])}


def _weights(rng: np.random.Generator, vocab: int, family: Family, shape: dict) -> dict[str, np.ndarray]:
    """Every tensor of the file, drawn in a fixed order."""
    hidden = shape["hidden"]
    out = {"token_embd.weight": rng.standard_normal((vocab, hidden)).astype(np.float32)}
    for i in range(family.layers):
        out |= _layer_weights(rng, family, f"blk.{i}.", shape)
    out["output_norm.weight"] = np.ones(hidden, dtype=np.float32)
    if not family.tied:
        out["output.weight"] = (rng.standard_normal((vocab, hidden)) * 4 / np.sqrt(hidden)).astype(np.float32)
    return out


def _add_hparams(w, family: Family, s: dict) -> None:
    """The architecture's metadata: dimensions, RoPE, window, soft-capping, experts."""
    head_dim = s["hidden"] // s["heads"]
    w.add_context_length(s["context"])
    w.add_embedding_length(s["hidden"])
    w.add_block_count(family.layers)
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(1_000_000.0 if family.arch == "gemma3" else 10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if family.window:
        w.add_sliding_window(family.window)
    if family.softcap:
        w.add_attn_logit_softcapping(50.0)
        w.add_final_logit_softcapping(30.0)
    if family.moe:
        w.add_expert_count(TINY_MOE["experts"])
        w.add_expert_used_count(TINY_MOE["used"])
        w.add_expert_feed_forward_length(TINY_MOE["ffn"])
        w.add_expert_shared_feed_forward_length(TINY_MOE["shared_ffn"])


def _add_vocab(w, tok: ByteTokenizer) -> None:
    w.add_tokenizer_model("llama")
    names = [f"<0x{b:02X}>".encode() for b in range(256)] + [t.encode() for t in tok.SPECIALS]
    w.add_token_list(names)
    w.add_token_scores([0.0] * len(names))
    w.add_token_types([_BYTE] * 256 + [_CONTROL] * len(tok.SPECIALS))
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_unk_token_id(tok.pad_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)


def is_quantised(name: str, array: np.ndarray) -> bool:
    """Whether a Q4_1 file stores tensor ``name`` in Q4_1: the linear weights,
    experts' stacks included. Norms, biases, the embedding table (a row
    lookup) and the MoE routers stay f32, as llama.cpp's own quantiser keeps
    ``ffn_gate_inp`` (the router decides which experts run, so it keeps full
    precision)."""
    return array.ndim >= 2 and name != "token_embd.weight" and "ffn_gate_inp" not in name


def write_tiny_gguf(path: str | os.PathLike, seed: int = TINY_GGUF_SEED, quant: str = TINY_GGUF_QUANT,
                    family: str = "llama", shape: dict = TINY_GGUF_SHAPE) -> Path:
    """Write the tiny random GGUF of ``family`` (:data:`FAMILIES`) to
    ``path``, its linear weights in ``quant`` (``"q4_1"`` or ``"f32"``), of ``shape``'s dimensions."""
    import gguf

    if quant not in ("q4_1", "f32"):
        raise ValueError(f"quant={quant!r} is not 'q4_1' or 'f32'")
    fam = get_family(family)
    tok = ByteTokenizer()
    w = gguf.GGUFWriter(os.fspath(path), fam.arch)
    w.add_name(fam.name or ("unsee-tiny" if family == "llama" else f"unsee-tiny-{family}"))
    _add_hparams(w, fam, shape)
    w.add_file_type(0 if quant == "f32" else 3)  # llama_ftype: ALL_F32, MOSTLY_Q4_1
    _add_vocab(w, tok)
    for name, array in _weights(np.random.default_rng(seed), tok.vocab_size, fam, shape).items():
        if quant == "q4_1" and is_quantised(name, array):
            q4_1 = gguf.GGMLQuantizationType.Q4_1
            w.add_tensor(name, gguf.quants.quantize(array, q4_1), raw_dtype=q4_1)
        else:
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def write_tiny_q4k_gguf(path: str | os.PathLike) -> Path:
    """Write a tiny random GGUF quantised to Q4_K_M by llama.cpp's own quantiser (gguf-py writes no
    Q4_K): the Llama layout at :data:`TINY_Q4K_SHAPE`, Q4_K and Q6_K weights as a real Q4_K_M file
    has, the weights llama.cpp repacks for its CPU (repack.py)."""
    import llama_cpp

    path = Path(path)
    f32 = path.with_name(path.name + ".f32")
    write_tiny_gguf(f32, quant="f32", shape=TINY_Q4K_SHAPE)
    try:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = LLAMA_FTYPE_Q4_K_M
        if llama_cpp.llama_model_quantize(os.fsencode(f32), os.fsencode(path), params) != 0:
            raise RuntimeError(f"llama.cpp could not quantise {f32} to Q4_K_M")
    finally:
        f32.unlink(missing_ok=True)
    return path


def tiny_gguf_path(cache_dir: str | os.PathLike | None = None, family: str = "llama") -> Path:
    """The tiny GGUF's path, written on first use (to a temporary sibling,
    then renamed, so a concurrent reader never sees half a file)."""
    get_family(family)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    kind = "" if family == "llama" else f"{family}-"
    path = root / f"unsee-tiny-{kind}{_FORMAT}-seed{TINY_GGUF_SEED}.gguf"
    if path.is_file():
        return path
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".tmp-", dir=root)
    os.close(fd)
    try:
        write_tiny_gguf(tmp, family=family)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


__all__ = ["FAMILIES", "LLAMA_FTYPE_Q4_K_M", "NOT_ON_LLAMACPP", "TINY_GGUF_SHAPE", "TINY_MOE", "TINY_Q4K_SHAPE",
           "TINY_WINDOW", "ZOO_FAMILIES", "Family", "get_engine_name", "get_family", "is_quantised", "tiny_gguf_path",
           "write_tiny_gguf", "write_tiny_q4k_gguf"]
