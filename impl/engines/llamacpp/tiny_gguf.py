"""A tiny random Llama as a GGUF file (linear weights in Q4_1), for fast llama.cpp properties.

``tiny_gguf_path()`` writes it once under the cache dir ($UNSEE_CACHE or
~/.cache/unsee) and returns the path; the file is a pure function of
:data:`TINY_GGUF_SHAPE` and the seed, so every machine writes the same bytes.
Written with the ``gguf`` package the project already depends on.

Its vocabulary is the tiny transformers model's byte tokenizer
(:class:`unsee.impl.engines.files.ByteTokenizer`: ids 0..255 are bytes, then
``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``). llama.cpp needs a
vocabulary to load a model, so the file carries one in SentencePiece form
(byte tokens named ``<0xNN>``), but the engine tokenises with
``ByteTokenizer`` itself and only ever hands llama.cpp token ids.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from unsee.impl.engines.files import ByteTokenizer, default_cache_dir

#: Dimensions of the tiny GGUF (those of the tiny transformers model).
TINY_GGUF_SHAPE = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 128, "context": 4096}
TINY_GGUF_SEED = 0
_FORMAT = "v2"  # part of the file name: bump when the writer changes
#: how the linear weights are stored: Q4_1, as in SmolLM2's GGUF, whose CPU
#: kernels give decode == prefill bitwise (facts.py), so drafts run on the
#: tiny file as on SmolLM2's; "f32" writes every tensor in f32, where
#: llama.cpp's batched matmul differs from its decode in the last bits
TINY_GGUF_QUANT = "q4_1"

# SentencePiece token types as llama.cpp reads them (gguf.TokenType)
_NORMAL, _CONTROL, _BYTE = 1, 3, 6


def _weights(rng: np.random.Generator, vocab: int) -> dict[str, np.ndarray]:
    """Every tensor, drawn in a fixed order; linear weights are (out, in) as
    in HF checkpoints (the writer stores them in ggml's reversed order).
    Entries of scale 1/sqrt(fan_in) keep activations and logits of order
    one, so greedy decisions are not near-ties."""
    s = TINY_GGUF_SHAPE
    hidden, head_dim = s["hidden"], s["hidden"] // s["heads"]
    kv = s["kv_heads"] * head_dim

    def linear(out: int, inp: int) -> np.ndarray:
        return (rng.standard_normal((out, inp)) / np.sqrt(inp)).astype(np.float32)

    out = {"token_embd.weight": rng.standard_normal((vocab, hidden)).astype(np.float32)}
    for i in range(s["layers"]):
        p = f"blk.{i}."
        out[p + "attn_norm.weight"] = np.ones(hidden, dtype=np.float32)
        out[p + "attn_q.weight"] = linear(hidden, hidden)
        out[p + "attn_k.weight"] = linear(kv, hidden)
        out[p + "attn_v.weight"] = linear(kv, hidden)
        out[p + "attn_output.weight"] = linear(hidden, hidden)
        out[p + "ffn_norm.weight"] = np.ones(hidden, dtype=np.float32)
        out[p + "ffn_gate.weight"] = linear(s["ffn"], hidden)
        out[p + "ffn_up.weight"] = linear(s["ffn"], hidden)
        out[p + "ffn_down.weight"] = linear(hidden, s["ffn"])
    out["output_norm.weight"] = np.ones(hidden, dtype=np.float32)
    out["output.weight"] = (rng.standard_normal((vocab, hidden)) * 4 / np.sqrt(hidden)).astype(np.float32)
    return out


def write_tiny_gguf(path: str | os.PathLike, seed: int = TINY_GGUF_SEED, quant: str = TINY_GGUF_QUANT) -> Path:
    """Write the tiny random Llama GGUF to ``path``, its linear weights in
    ``quant`` (``"q4_1"`` or ``"f32"``)."""
    import gguf

    if quant not in ("q4_1", "f32"):
        raise ValueError(f"quant={quant!r} is not 'q4_1' or 'f32'")

    tok = ByteTokenizer()
    s = TINY_GGUF_SHAPE
    w = gguf.GGUFWriter(os.fspath(path), "llama")
    w.add_name("unsee-tiny")
    w.add_context_length(s["context"])
    w.add_embedding_length(s["hidden"])
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_dimension_count(s["hidden"] // s["heads"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(0 if quant == "f32" else 3)  # llama_ftype: ALL_F32, MOSTLY_Q4_1
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
    for name, array in _weights(np.random.default_rng(seed), tok.vocab_size).items():
        if quant == "q4_1" and array.ndim == 2 and name != "token_embd.weight":
            q4_1 = gguf.GGMLQuantizationType.Q4_1
            w.add_tensor(name, gguf.quants.quantize(array, q4_1), raw_dtype=q4_1)
        else:  # norms and the embedding table (a row lookup) stay f32
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def tiny_gguf_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """The tiny GGUF's path, written on first use (to a temporary sibling,
    then renamed, so a concurrent reader never sees half a file)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = root / f"unsee-tiny-{_FORMAT}-seed{TINY_GGUF_SEED}.gguf"
    if path.is_file():
        return path
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".tmp-", dir=root)
    os.close(fd)
    try:
        write_tiny_gguf(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
