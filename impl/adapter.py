"""The one place that talks to `transformers`.

The transformers API moves between releases (4.56 -> 5.x renamed the
DynamicCache storage, changed what a positive `crop` argument means, dropped
`cache_position`, ...). Everything above this module -- models.py, kv.py and
the runtime -- sees only these few functions, so a version bump is fixed here.

Supported: transformers 4.56+ and 5.x, torch 2.4+.

Functions:
    load_gguf(path)                -> (model, tokenizer)  dequantised, fp32
    load_checkpoint(dir)           -> (model, tokenizer)  local files only
    save_dequantised(model, tok, d)   write config + state dict + tokenizer
    load_dequantised(d)            -> (model, tokenizer)
    build_tiny_llama(..., seed)    -> model               random weights, no files
    new_cache(model)               -> empty DynamicCache
    forward_last_logits(model, ids, cache) -> logits of the last position
    cache_length(cache), crop_cache(cache, keep), cache_tensors(cache),
    clone_cache(cache)
    hf_encode(tok, text), hf_decode(tok, ids), eos_ids_of(model, tok)
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Iterator, Sequence

import torch

import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
)

TRANSFORMERS_VERSION = transformers.__version__

# Eager attention: a plain matmul -> softmax -> matmul, the same code path for
# a one-token decode step and for a long prefill chunk, with no kernel
# selection behind our back. SDPA picks among flash / memory-efficient / math
# back-ends by device, dtype, shape and mask, and that choice can change with
# the chunk length or the torch build; eager leaves only the matmuls, which
# torch.use_deterministic_algorithms (plus CUBLAS_WORKSPACE_CONFIG on CUDA)
# makes deterministic. The cost (materialising the attention matrix) is
# negligible for a 135M model at agent-sized contexts.
ATTN_IMPLEMENTATION = "eager"

STATE_FILE = "state_dict.pt"


def _prepare(model: torch.nn.Module) -> torch.nn.Module:
    # Inference only: eval() turns dropout off; no parameter needs a gradient.
    model.eval()
    model.requires_grad_(False)
    return model


# --------------------------------------------------------------------- loading


def load_gguf(path: str | Path):
    """Load a causal LM and its tokenizer from a GGUF file (dequantised to fp32).

    transformers wants the folder and the file name separately.
    """
    path = Path(path)
    folder, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=name,
        local_files_only=True,
        attn_implementation=ATTN_IMPLEMENTATION,
    )
    return _prepare(model), tokenizer


def load_checkpoint(folder: str | Path):
    """Load a causal LM and tokenizer from a local HF checkpoint directory."""
    folder = str(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, attn_implementation=ATTN_IMPLEMENTATION
    )
    return _prepare(model), tokenizer


def save_dequantised(model, tokenizer, folder: str | Path) -> None:
    """Write what `load_dequantised` needs: config.json, a torch.save'd state
    dict and the tokenizer files.

    A model loaded from GGUF refuses `save_pretrained`, but its config and
    state dict are ordinary. The config still names the GGUF quantisation;
    that entry is dropped, or from_config would try to quantise again.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.save_pretrained(str(folder))
    # The state dict of a tied model holds the same tensor twice; torch.save
    # keeps the sharing, so the file is not twice the size.
    torch.save(model.state_dict(), folder / STATE_FILE)
    tokenizer.save_pretrained(str(folder))


def load_dequantised(folder: str | Path):
    """Inverse of `save_dequantised`: from_config + load_state_dict (strict)."""
    folder = Path(folder)
    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    config._attn_implementation = ATTN_IMPLEMENTATION
    model = AutoModelForCausalLM.from_config(config, attn_implementation=ATTN_IMPLEMENTATION)
    state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return _prepare(model), tokenizer


def build_tiny_llama(
    *,
    vocab_size: int,
    bos_token_id: int,
    eos_token_id: int,
    pad_token_id: int,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 4096,
    seed: int = 0,
    init_std: float = 1.0,
) -> LlamaForCausalLM:
    """A tiny Llama with random weights and no files.

    Weights are drawn here, parameter by parameter in name order, from a CPU
    torch.Generator seeded with `seed`, instead of relying on transformers'
    own initialisation (which changes between releases and uses the global
    RNG). So the tiny model is the same on every version and device.
    A large init_std keeps the logits far from uniform, so greedy decoding is
    not decided by near-ties.
    """
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        tie_word_embeddings=False,
    )
    config._attn_implementation = ATTN_IMPLEMENTATION
    model = LlamaForCausalLM(config)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() == 1:  # RMSNorm gains
                p.fill_(1.0)
            else:
                scale = init_std / (p.shape[-1] ** 0.5) if "embed" not in name else init_std
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * scale)
    return _prepare(model)


# ------------------------------------------------------------------ tokenizer


def hf_encode(tokenizer, text: str) -> list[int]:
    # No BOS/EOS: the caller frames turns itself. Special tokens written in the
    # text (e.g. "<|im_start|>") still come out as their single ids.
    return list(tokenizer.encode(text, add_special_tokens=False))


def hf_decode(tokenizer, ids: Sequence[int]) -> str:
    # Keep special tokens and spacing exactly, so decode(encode(t)) == t.
    return tokenizer.decode(
        list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
    )


def eos_ids_of(model, tokenizer, extra_tokens: Sequence[str] = ("<|im_end|>",)) -> tuple[int, ...]:
    """Every id that ends a turn: the tokenizer's EOS, the config's and the
    generation config's EOS (an int or a list), and chat end markers."""
    ids: set[int] = set()

    def add(x):
        if x is None:
            return
        if isinstance(x, (list, tuple)):
            for y in x:
                add(y)
        else:
            ids.add(int(x))

    add(getattr(tokenizer, "eos_token_id", None))
    add(getattr(model.config, "eos_token_id", None))
    gen_cfg = getattr(model, "generation_config", None)
    if gen_cfg is not None:
        add(getattr(gen_cfg, "eos_token_id", None))
    vocab = tokenizer.get_vocab()
    for tok in extra_tokens:
        if tok in vocab:
            ids.add(int(vocab[tok]))
    return tuple(sorted(ids))


def vocab_size_of(model) -> int:
    return int(model.get_input_embeddings().num_embeddings)


# ---------------------------------------------------------------------- cache


def new_cache(model) -> DynamicCache:
    """An empty DynamicCache for `model`.

    With the config, 5.x pre-builds one layer object per model layer of the
    right kind; a sliding-window layer would silently drop old tokens (and
    crop differently), which breaks exact replay, so such models are refused.
    """
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # older 4.x: no config argument
        cache = DynamicCache()
    for layer in getattr(cache, "layers", ()):
        if getattr(layer, "is_sliding", False):
            raise ValueError(
                f"model {type(model).__name__} uses sliding-window attention; "
                "its cache cannot be cropped exactly"
            )
    return cache


def cache_length(cache) -> int:
    """Number of tokens held by the cache."""
    return int(cache.get_seq_length())


def crop_cache(cache, keep: int) -> None:
    """Keep the first `keep` tokens of the cache, in place.

    `crop(n)` with n > 0 meant "keep n" in 4.x and is an error in 5.x; a
    negative n means "remove |n|" in both. So always pass the negative count.
    """
    cur = cache_length(cache)
    if not 0 <= keep <= cur:
        raise ValueError(f"crop_cache: keep={keep} outside [0, {cur}]")
    if keep == cur:
        return
    with torch.inference_mode():
        cache.crop(keep - cur)
    got = cache_length(cache)
    if got != keep:  # guard against a future change of meaning
        raise RuntimeError(f"transformers {TRANSFORMERS_VERSION}: crop left {got} tokens, wanted {keep}")


def cache_tensors(cache) -> Iterator[tuple[torch.Tensor | None, torch.Tensor | None]]:
    """Yield (keys, values) per layer, each [batch, kv_heads, seq, head_dim].

    5.x (and 4.56+): `cache.layers[i].keys/.values` (None before first use).
    Older 4.x: parallel lists `cache.key_cache` / `cache.value_cache`.
    """
    if hasattr(cache, "layers"):
        for layer in cache.layers:
            yield getattr(layer, "keys", None), getattr(layer, "values", None)
    else:
        yield from zip(cache.key_cache, cache.value_cache)


def clone_cache(cache):
    """An independent deep copy (new tensor storage) of the cache."""
    with torch.inference_mode():
        return copy.deepcopy(cache)


# -------------------------------------------------------------------- forward


def forward_last_logits(model, token_ids: Sequence[int], cache) -> torch.Tensor:
    """One forward over `token_ids` appended to `cache` (which grows in place).

    Returns the logits of the last position, shape [vocab], on the model's
    device, in the model's dtype. Positions are passed explicitly (5.x no
    longer takes `cache_position`; both derive from them). `logits_to_keep=1`
    computes the LM head for the last position only; every call uses it, so
    prefill and decode logits go through the same-shaped matmul.
    """
    device = model.get_input_embeddings().weight.device
    past = cache_length(cache)
    n = len(token_ids)
    with torch.inference_mode():
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)
        position_ids = torch.arange(past, past + n, dtype=torch.long, device=device).unsqueeze(0)
        out = model(
            input_ids=input_ids,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        if out.past_key_values is not cache:  # the cache must be updated in place
            raise RuntimeError(f"transformers {TRANSFORMERS_VERSION}: model returned a new cache object")
        return out.logits[0, -1]
