"""The one place that talks to `transformers`.

The transformers API moves between releases: the DynamicCache storage went
from `key_cache`/`value_cache` lists to per-layer objects (4.54+), a positive
`crop(n)` meant "keep n" in 4.x and is an error in 5.x, 5.x dropped
`cache_position`, `torch_dtype` became `dtype`, ... Everything above this
module -- models.py, kv.py and the runtime -- sees only these few functions,
so a version bump is fixed here.

Supported: transformers 4.56+ and 5.x, torch 2.4+.

Functions:
    load_gguf(path)                -> (model, tokenizer)  dequantised, fp32
    load_checkpoint(dir)           -> (model, tokenizer)  local files only
    place(model, device, dtype)    -> model  on device, parameters cast
    save_dequantised(model, tok, d)   write a GGUF-loaded model as a local checkpoint
    load_dequantised(d)            -> (model, tokenizer)
    build_tiny_llama(..., seed)    -> model               random weights, no files
    forward_last_logits(model, ids, cache) -> logits of the last position
    forward_all_logits(model, ids, cache)  -> logits of every position
    forward_logits(model, ids, cache, k)   -> the last k positions' logits (0: all)
    hf_encode(tok, text), hf_decode(tok, ids), eos_ids_of(model, tok)
    chat_template_of(tok), special_tokens_of(tok)   what chat templates read

The KV cache's functions (new_cache, cache_length, crop_cache, ...) live in
cache.py, the other module that calls transformers; they are re-exported
here so that callers keep reading ``adapter.new_cache``.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file as save_safetensors
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
)

from unsee.impl.engines.hf.cache import (  # noqa: F401  re-exported: adapter.new_cache, ...
    add_storage,
    cache_length,
    cache_storages,
    cache_tensors,
    clone_cache,
    crop_cache,
    excise_cache_span,
    new_cache,
    share_cache_prefix,
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
#
# We register eager under our own name (see grouped_eager_attention) so that
# long contexts skip transformers' `repeat_kv`, a copy of the whole cache per
# query head in every forward; the numbers are eager's, bit for bit.
ATTN_IMPLEMENTATION = "unsee_eager"

#: Key lengths from which `grouped_eager_attention` runs per key/value head
#: instead of calling the model's eager function. Below it the per-group loop
#: (30 layers x 3 groups of small ops on SmolLM2) costs more than the copy it
#: saves. One-token forwards on SmolLM2, one thread, eager vs grouped: 62.8 vs
#: 65.0 ms at 512 tokens of context, 72.5 vs 67.4 at 1,024, 87.9 vs 74.4 at
#: 2,048, 227 vs 113 at 7,168. Either side gives the same bits.
GROUPED_ATTENTION_FROM = 1024


def grouped_eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """The model's eager attention, without copying the KV cache per query head.

    Grouped-query attention shares each key/value head among
    ``module.num_key_value_groups`` query heads; transformers' eager path
    materialises that sharing (`repeat_kv`: expand, then a reshape that
    copies), so every forward writes the whole cache that many times over.
    Here each key/value head is instead *broadcast* (a stride-0 expand, no
    copy) into a batched matmul over its own query heads. Every (head, query)
    row is the same matmul of the same operands with the same shapes as in the
    eager path, so the outputs are equal bit for bit; tests/test_attention.py
    checks that against the model's own eager function over decode and
    prefill shapes in fp32 and bf16, and end to end.

    Everything else goes straight to the model's eager function (see
    `_is_grouped_case`): short keys, single-group models, head-specific masks,
    batches, non-CPU devices (the grouped form was only measured on CPU, and
    on a GPU its per-group launches may cost more than the copy), and model
    families whose eager function is not the Llama one this reimplements
    (Gemma 2's soft-capping, for one).
    """
    eager = _model_eager_attention(module)
    if not _is_grouped_case(module, eager, query, key, attention_mask):
        return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    groups = module.num_key_value_groups
    n_kv, length, dim = key.shape[1], key.shape[2], key.shape[3]
    outputs = []
    for g in range(n_kv):
        keys = key[0, g].unsqueeze(0).expand(groups, length, dim)
        values = value[0, g].unsqueeze(0).expand(groups, length, value.shape[-1])
        weights = torch.bmm(query[0, g * groups:(g + 1) * groups], keys.transpose(1, 2)).unsqueeze(0) * scaling
        if attention_mask is not None:
            weights = weights + attention_mask
        weights = torch.nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
        weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
        outputs.append(torch.bmm(weights[0], values).unsqueeze(0))
    return torch.cat(outputs, dim=1).transpose(1, 2).contiguous(), None


def _is_grouped_case(module, eager, query, key, attention_mask) -> bool:
    """Whether `grouped_eager_attention` computes this call itself (see there)."""
    groups = getattr(module, "num_key_value_groups", 1)
    return (groups > 1 and key.shape[-2] >= GROUPED_ATTENTION_FROM and query.shape[0] == 1
            and query.device.type == "cpu"
            and (attention_mask is None or attention_mask.shape[1] == 1)
            and _is_llama_eager(eager))


_LLAMA_EAGER_CODE: dict = {}


def _is_llama_eager(eager) -> bool:
    """Whether ``eager`` is Llama's eager attention or a copy of it with the
    same code (Mistral, Qwen2, Qwen3, Phi-3, ... in transformers 5.x)."""
    from transformers.models.llama import modeling_llama

    reference = modeling_llama.eager_attention_forward
    if eager is reference:
        return True
    if eager not in _LLAMA_EAGER_CODE:
        a, b = getattr(eager, "__code__", None), reference.__code__
        _LLAMA_EAGER_CODE[eager] = a is not None and (a.co_code, a.co_names, a.co_varnames) == (
            b.co_code, b.co_names, b.co_varnames)
    return _LLAMA_EAGER_CODE[eager]


def _model_eager_attention(module):
    """The eager attention function of the module's own modeling file."""
    import sys

    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise NotImplementedError(f"{type(module).__name__}: its modeling file has no eager_attention_forward")
    return eager


def _register_attention() -> str:
    """Register `grouped_eager_attention` (with eager's mask) under
    ATTN_IMPLEMENTATION; return the name to load models with ("eager" where
    this transformers cannot register one)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    except ImportError:
        return "eager"
    AttentionInterface.register(ATTN_IMPLEMENTATION, grouped_eager_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    return ATTN_IMPLEMENTATION


ATTN_IMPLEMENTATION = _register_attention()

WEIGHTS_FILE = "model.safetensors"  # what save_dequantised writes


def _prepare(model: torch.nn.Module) -> torch.nn.Module:
    # Inference only: eval() turns dropout off; no parameter needs a gradient.
    model.eval()
    model.requires_grad_(False)
    return model


def place(model, device: str, dtype: torch.dtype):
    """Move the model to `device` and cast its *parameters* to `dtype`, each
    into freshly allocated memory.

    Not `model.to(dtype)`: that also casts floating buffers, and the rotary
    embedding's `inv_freq` buffer rounded to bf16/fp16 shifts every position's
    rotation.

    Fresh memory because CPU matmul results depend on the alignment of the
    operands: safetensors mmaps weights at whatever offset the file gives
    (8-byte aligned for SmolLM2), GGUF dequantisation leaves numpy buffers,
    and the same weights gave logits differing by ~1e-5 between the two. The
    torch allocator aligns every tensor alike (64 bytes on CPU), so a model
    gives the same bits however it was loaded. It also un-mmaps the weights.
    Tied parameters are one Parameter object, so they stay tied.
    """
    with torch.no_grad():
        for p in model.parameters():
            target = dtype if p.is_floating_point() else p.dtype
            p.data = torch.empty_like(p.data, device=device, dtype=target).copy_(p.data)
        for b_owner, name, b in [
            (m, n, b) for m in model.modules() for n, b in m.named_buffers(recurse=False)
        ]:
            b_owner._buffers[name] = torch.empty_like(b, device=device).copy_(b)
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
    """Write a model loaded from GGUF as a plain local HF checkpoint
    (config.json, model.safetensors, tokenizer files), which
    `load_checkpoint` reads back in about a second.

    Such a model refuses `save_pretrained`, but its config and state dict are
    ordinary. The config still names the GGUF quantisation; that entry is
    dropped, or loading would try to dequantise again. Why not torch.save +
    from_config + load_state_dict: from_config first initialises 135M random
    weights and torch.load reads everything eagerly (measured ~10x slower
    than from_pretrained, which builds on the meta device and mmaps).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.save_pretrained(str(folder))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(folder))
    # safetensors refuses two names for one storage; a tied model's state
    # dict has that (lm_head.weight is embed_tokens.weight). Keep the first
    # name, as save_pretrained does; loading re-ties from the config.
    tensors, seen = {}, set()
    for name, t in model.state_dict().items():
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        tensors[name] = t.detach().to("cpu").contiguous()
    save_safetensors(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    tokenizer.save_pretrained(str(folder))


def load_dequantised(folder: str | Path):
    """Inverse of `save_dequantised`."""
    return load_checkpoint(folder)


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
    tie_scale: float = 0.0,
) -> LlamaForCausalLM:
    """A tiny Llama with random weights and no files.

    Weights are drawn here, parameter by parameter in name order, from a CPU
    torch.Generator seeded with `seed`, instead of relying on transformers'
    own initialisation (which changes between releases and uses the global
    RNG). So the tiny model is the same on every version and device.
    init_std=1.0 gives logits with a spread of about 1, so greedy decoding is
    not decided by near-ties.

    tie_scale > 0 builds the opposite on purpose: every LM-head row becomes
    row 0 plus tie_scale times a random vector, so all logits agree to about
    tie_scale and the argmax is decided in the last bits, where a multi-token
    prefill and a one-token decode step round differently. That is the
    near-tie family the draft-replay guard is tested on (impl/agent/drafts.py).
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
        if tie_scale > 0:
            head = model.get_output_embeddings().weight
            noise = torch.randn(head.shape, generator=gen, dtype=torch.float32)
            head.copy_(head[0] + tie_scale * noise)
    return _prepare(model)


def build_tiny_model(model_type: str, config_fields: dict, *, seed: int = 0, init_std: float = 1.0):
    """A tiny random model of any transformers family (``model_type``, e.g.
    'qwen2', 'gemma3_text'), from config fields alone, no files; the zoo's
    builder (impl/engines/hf/zoo.py).

    Weights are drawn as `build_tiny_llama` draws them (a seeded CPU
    generator, parameter by parameter in name order), so a family's model is
    the same on every version and device: norm gains 1, biases N(0, 0.5^2),
    every matrix N(0, init_std^2 / fan_in) (embeddings N(0, init_std^2)).
    """
    config = transformers.AutoConfig.for_model(model_type, **config_fields)
    config._attn_implementation = ATTN_IMPLEMENTATION
    model = AutoModelForCausalLM.from_config(config, attn_implementation=ATTN_IMPLEMENTATION)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() == 1:
                noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
                p.copy_(noise * 0.5 if name.endswith("bias") else torch.ones_like(noise))
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


def chat_template_of(tokenizer) -> str | None:
    """The tokenizer's chat template: its one template, or the one named
    'default' where it holds several; None where it has none."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    return template if isinstance(template, str) and template else None


def special_tokens_of(tokenizer) -> dict[str, str]:
    """The texts of the special tokens chat templates name (``bos_token``...)."""
    names = ("bos_token", "eos_token", "pad_token", "unk_token")
    return {name: str(getattr(tokenizer, name)) for name in names if getattr(tokenizer, name, None) is not None}


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


# -------------------------------------------------------------------- forward


def forward_last_logits(model, token_ids: Sequence[int], cache) -> torch.Tensor:
    """One forward over `token_ids` appended to `cache` (which grows in place).

    Returns the logits of the last position, shape [vocab], on the model's
    device, in the model's dtype. Positions are passed explicitly rather than
    left to the model (4.x derived a `cache_position` argument from the cache,
    5.x dropped it), so they are the cache length onward on every version.
    `logits_to_keep=1`
    computes the LM head for the last position only; every call uses it, so
    prefill and decode logits go through the same-shaped matmul.
    """
    return forward_logits(model, token_ids, cache, logits_to_keep=1)[-1]


def forward_all_logits(model, token_ids: Sequence[int], cache) -> torch.Tensor:
    """One forward over `token_ids` appended to `cache`, returning the logits
    of *every* position, shape [len(token_ids), vocab].

    The KV it writes is the KV of `forward_last_logits` over the same chunk
    (the LM head reads the hidden states, it never feeds the cache); only the
    logits differ in shape, which is why draft verification guards them
    (see impl/agent/drafts.py).
    """
    return forward_logits(model, token_ids, cache, logits_to_keep=0)  # 0 keeps every position


def get_cache_argument(model) -> str:
    """The name a model's forward takes its KV cache by: ``cache`` from
    transformers 5.24 on (``past_key_values`` is deprecated there and goes in
    5.40), ``past_key_values`` before. Read from the signature, per class."""
    forward = type(model).forward
    name = _CACHE_ARGUMENT.get(forward)
    if name is None:
        name = "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
        _CACHE_ARGUMENT[forward] = name
    return name


_CACHE_ARGUMENT: dict = {}  # a model class's forward -> the name of its cache argument


def forward_logits(model, token_ids: Sequence[int], cache, logits_to_keep: int) -> torch.Tensor:
    """One forward appending `token_ids` to `cache` in place; logits [kept, vocab]
    (``logits_to_keep``: 1, the last position's, as :func:`forward_last_logits`;
    0, every position's, as :func:`forward_all_logits`)."""
    device = model.get_input_embeddings().weight.device
    past = cache_length(cache)
    n = len(token_ids)
    argument = get_cache_argument(model)
    with torch.inference_mode():
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)
        position_ids = torch.arange(past, past + n, dtype=torch.long, device=device).unsqueeze(0)
        out = model(input_ids=input_ids, position_ids=position_ids, use_cache=True, logits_to_keep=logits_to_keep,
                    **{argument: cache})
        if getattr(out, argument) is not cache:  # the cache must be updated in place
            raise RuntimeError(f"transformers {TRANSFORMERS_VERSION}: model returned a new cache object")
        return out.logits[0]
