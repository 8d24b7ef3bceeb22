"""Loading a model into vLLM: ``load_vllm(name_or_path, cache_dir, **options)``.

vLLM reads a Hugging Face folder (config.json + safetensors); prompts go in
as token ids (vLLM's tokenizer is never loaded), so the tokenizer is ours:

``tiny``     a 2-layer random Llama over the byte tokenizer, saved once as an HF
             folder under the cache. vLLM's CPU attention refuses a head
             dimension of 16 (``tiny``'s), so this one has 2 heads of 32 and one
             KV head; its weights are drawn as ``tiny``'s are (seed 0), and the
             transformers engine loads the same folder for the differential report.
``smollm2``  SmolLM2-135M-Instruct: the embedded GGUF dequantised to fp32 and
             cached as an HF folder by :func:`unsee.impl.engines.hf.models.load_model`
             (the folder the transformers engine reads), with its HF tokenizer.
a folder     any local HF checkpoint with config.json (its tokenizer through transformers).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unsee.impl.engines.files import ByteTokenizer, default_cache_dir, publish_entry
from unsee.impl.engines.hf.tokenizer import TokenizerMethods
from unsee.impl.engines.vllm import adapter

_DONE = "unsee-complete"
#: the vLLM tiny models' shapes (see the module docstring); part of their cache keys.
#: ``tiny-ties`` is the near-tie family of the margin guard's test: SmolLM2's width
#: (576, where vLLM's decode steps moved logits by ~3e-6 from the cold run on the
#: CPU that measured its bound; at 64 and 256 they were bitwise) and LM-head rows
#: tied to 3e-7, so near-ties are in every turn.
TINY_MODELS = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
             "intermediate_size": 128, "seed": 0},
    "tiny-ties": {"hidden_size": 576, "num_hidden_layers": 2, "num_attention_heads": 9, "num_key_value_heads": 1,
                  "intermediate_size": 1152, "seed": 0, "tie_scale": 3e-7},
}


@dataclass(eq=False)
class VllmModel(TokenizerMethods):
    """A model loaded in vLLM, with our tokenizer and what it promises
    (satisfies :class:`unsee.impl.engines.protocol.ModelInfo`; the tokenizer's
    methods are the transformers engine's,
    :class:`~unsee.impl.engines.hf.tokenizer.TokenizerMethods`)."""

    name: str
    source: str  # the HF folder vLLM read
    llm: Any  # vllm.LLM
    tokenizer: Any  # ByteTokenizer or a transformers tokenizer
    eos_ids: tuple[int, ...]
    vocab_size: int
    block_size: int
    determinism_statement: str  # what repeatability is and is not promised, in words
    device: str = "cpu"
    dtype: str = "float32"
    info: dict = field(default_factory=dict)

    # the loader options a stored session records (impl/store/backend.py), read as attributes
    @property
    def max_model_len(self) -> int:
        return self.info["options"].max_model_len

    @property
    def tensor_parallel_size(self) -> int:
        return self.info["options"].tensor_parallel_size

    @property
    def pipeline_parallel_size(self) -> int:
        return self.info["options"].pipeline_parallel_size


class _NoTokenizerFiles:
    """vLLM runs with ``skip_tokenizer_init``: the tiny folder needs no tokenizer files."""

    def save_pretrained(self, folder) -> None:
        return None


def tiny_folder(cache_dir=None, name: str = "tiny") -> Path:
    """A vLLM tiny model's HF folder (:data:`TINY_MODELS`), written once (atomically) under the cache."""
    from unsee.impl.engines.hf import adapter as hf

    shape = TINY_MODELS[name]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = hashlib.sha256(f"vllm-{name}-v1|{sorted(shape.items())}|{hf.TRANSFORMERS_VERSION}".encode())
    entry = root / f"vllm-{name}-{key.hexdigest()[:16]}"
    if (entry / _DONE).is_file():
        return entry
    tok = ByteTokenizer()
    model = hf.build_tiny_llama(vocab_size=tok.vocab_size, bos_token_id=tok.bos_token_id,
                                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **shape)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=entry.name + ".tmp-", dir=root))
    try:
        hf.save_dequantised(model, _NoTokenizerFiles(), tmp)
        (tmp / _DONE).write_text("vllm tiny\n")
        publish_entry(tmp, entry, _DONE)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


def resolve_folder(name_or_path, cache_dir=None) -> tuple[str, Path, Any, tuple[int, ...]]:
    """``(name, folder, tokenizer, eos_ids)`` of a model name or folder, or a
    ValueError naming it."""
    key = os.fspath(name_or_path)
    if key in TINY_MODELS:
        tok = ByteTokenizer()
        return f"vllm-{key}", tiny_folder(cache_dir, key), tok, (tok.eos_token_id,)
    from unsee.impl.engines.hf import adapter as hf
    from unsee.impl.engines.hf.models import load_model

    if key == "smollm2":
        lm = load_model("smollm2", cache_dir=cache_dir)  # dequantises once, then reads the cached folder
        return "smollm2", Path(lm.info["cache_entry"]), lm.tokenizer, lm.eos_ids
    folder = Path(key).expanduser()
    if not (folder / "config.json").is_file():
        raise ValueError(f"name_or_path={key!r} is neither {tuple(TINY_MODELS)}, 'smollm2' nor an HF folder "
                     "with config.json")
    model, tok = hf.load_checkpoint(folder)
    return key, folder, tok, tuple(hf.eos_ids_of(model, tok))


def _determinism_text(block: int) -> str:
    return (f"vLLM cpu float32, prefix caching in blocks of {block} tokens (a restore keeps whole blocks: prefill "
            "resumes at a block boundary); a prefix-cache hit moves logits in the "
            "last bits (docs/engines.md, vLLM); every decision whose margin is under the measured bound is "
            "recomputed cold (skip_reading_prefix_cache), so the tokens are a function of the tokens before them; "
            "the digest covers token ids (vLLM exposes no KV), and logits() is the cold run's")


def load_vllm(name_or_path: str | os.PathLike = "tiny", cache_dir: str | os.PathLike | None = None,
              max_model_len: int | None = None, tensor_parallel_size: int | None = None,
              pipeline_parallel_size: int | None = None, distributed_executor_backend: str | None = None,
              dtype: str | None = None, device: str | None = None, block_size: int | None = None) -> VllmModel:
    """Load ``'tiny'``, ``'smollm2'`` or an HF folder into vLLM (fp32 on the
    CPU unless ``dtype`` says otherwise; ``device`` is vLLM's: the CPU build
    runs on the CPU, a CUDA build on the GPUs). Tensor/pipeline parallel
    sizes and the distributed executor backend (``ray``, ``mp``) go to vLLM as
    its CLI takes them; ``block_size`` is the prefix cache's (None: the
    platform's, 128 on the CPU)."""
    adapter.import_vllm()  # the install hint before any work
    platform = adapter.get_platform_device()
    if device is not None and device.split(":")[0] != platform:
        # the bound and the receipt go by the device: a label vLLM does not run on would be wrong
        raise ValueError(f"device={device!r}: this vLLM build runs on {platform!r}; pass {platform!r} or nothing")
    options = adapter.LLMOptions(dtype=dtype or "float32", max_model_len=int(max_model_len or 4096),
                                 tensor_parallel_size=int(1 if tensor_parallel_size is None else tensor_parallel_size),
                                 pipeline_parallel_size=int(1 if pipeline_parallel_size is None
                                                            else pipeline_parallel_size),
                                 distributed_executor_backend=distributed_executor_backend,
                                 block_size=None if block_size is None else int(block_size))
    adapter.check_scale_out(options, platform, adapter.is_ray_supported())
    name, folder, tok, eos = resolve_folder(name_or_path, cache_dir)
    t0 = time.perf_counter()
    llm = adapter.build_llm(str(folder), options)
    block = adapter.block_size(llm)
    vocab = adapter.vocab_size(llm)
    return VllmModel(name=name, source=str(folder), llm=llm, tokenizer=tok, eos_ids=eos, vocab_size=vocab,
                     block_size=block, determinism_statement=_determinism_text(block), device=platform,
                     dtype=options.dtype, info={"vllm": adapter.version(), "load_s": round(time.perf_counter() - t0, 3),
                                                "options": options})


__all__ = ["TINY_MODELS", "VllmModel", "load_vllm", "resolve_folder", "tiny_folder"]
