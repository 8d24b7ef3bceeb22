"""Which attention implementation a transformers model runs, and what it guarantees bit for bit.

Names (``--attn``, ``load_model(attn=...)``):

``unsee_eager``  transformers' eager attention with the key/value heads broadcast instead
                 of copied (adapter.grouped_eager_attention): eager's bits, less copying
``eager``        transformers' own eager attention (matmul, softmax, matmul)
``sdpa``         torch's scaled_dot_product_attention, which picks a kernel by device,
                 dtype, shape and mask
``flash_attention_2`` / ``flash_attention_3``  the flash-attn package's kernels, CUDA only,
                 fp16/bf16 only, where that package is installed

:data:`ATTN_FACTS` holds the bitwise facts measured per (device, attention, dtype) with
``python -m unsee.bench.bitwise`` (docs/engines.md, "Attention and dtypes");
:func:`get_determinism_facts` turns a configuration into those facts, so that
:class:`~unsee.impl.engines.protocol.Determinism` (and its canonical chunking)
follows the configuration. :func:`get_default_attn` is the fastest exact choice per device.
"""

from __future__ import annotations

from collections.abc import Mapping

from unsee.impl.engines.hf import adapter

OURS = adapter.ATTN_IMPLEMENTATION  # "unsee_eager" (or "eager" where it cannot be registered)
FLASH = ("flash_attention_2", "flash_attention_3")
ATTN_NAMES = ("unsee_eager", "eager", "sdpa") + FLASH

#: The bitwise facts, in the order of Determinism's fields: same_chunking_repeats,
#: crop_continue_is_fresh, chunk_invariant, decode_is_prefill, thread_invariant. Measured
#: on this project's CPU (x86-64, AVX2/AVX-512) with torch 2.13 and transformers 5.23,
#: tiny and SmolLM2, by ``python -m unsee.bench.bitwise --engine E --attn A --dtype T``
#: (docs/engines.md has the table). A configuration not listed gets the conservative
#: facts (:data:`UNMEASURED`): only what the engine's construction guarantees.
ATTN_FACTS: Mapping[tuple[str, str, str], tuple[bool, bool, bool, bool, bool]] = {
    ("cpu", "unsee_eager", "float32"): (True, True, False, False, False),
    ("cpu", "eager", "float32"): (True, True, False, False, False),
    ("cpu", "sdpa", "float32"): (True, True, False, False, False),
    ("cpu", "unsee_eager", "bfloat16"): (True, True, False, False, False),
    ("cpu", "eager", "bfloat16"): (True, True, False, False, False),
    ("cpu", "sdpa", "bfloat16"): (True, True, False, False, False),
}

#: What holds by construction on any configuration: a prefill is one forward of the same
#: shapes, and a crop keeps the tensors' first rows. Chunkings, decode steps and thread
#: counts are assumed to differ until measured.
UNMEASURED = (True, True, False, False, False)

#: The default implementation per device kind: the fastest exact one with a shipped draft
#: bound (docs/engines.md, "Attention and dtypes", has the speeds and the reasoning). On the
#: CPU that is ``sdpa``: exact under the canonical chunking (its facts above), faster than
#: ours in prefill and decode (``python -m unsee.bench.attention``), with its own shipped
#: rows (decoding.SDPA_DRAFT_BOUNDS). A store records the attention it ran with, and is
#: rebuilt with that one, not with this default (store/backend.py). On CUDA it stays eager's
#: bits (``unsee_eager`` runs eager off the CPU): the one ``make gpu`` run (docs/gpu.md, an
#: H100) found sdpa's decode differing from its prefill there, and no CUDA bound ships.
DEFAULT_ATTN = {"cpu": "sdpa", "cuda": "unsee_eager"}


def flash_available(name: str) -> bool:
    """Whether transformers finds the flash-attn package for ``name`` here."""
    from transformers import utils

    check = {"flash_attention_2": "is_flash_attn_2_available", "flash_attention_3": "is_flash_attn_3_available"}
    return bool(getattr(utils, check[name], lambda: False)())


def get_device_kind(device: str) -> str:
    return "cuda" if device.startswith("cuda") else device


def get_default_attn(device: str) -> str:
    """The default attention on ``device``: the fastest exact one (:data:`DEFAULT_ATTN`)."""
    choice = DEFAULT_ATTN.get(get_device_kind(device), "eager")
    return OURS if choice == "unsee_eager" else choice


def check_attn(attn: str | None, device: str, dtype: str) -> str:
    """The implementation name to load with, for ``attn`` (None: the device's default);
    a ValueError naming the bad choice otherwise (nothing is changed)."""
    if attn is None:
        return get_default_attn(device)
    if attn not in ATTN_NAMES:
        raise ValueError(f"attn={attn!r} is not one of {ATTN_NAMES}")
    if attn in FLASH:
        if get_device_kind(device) != "cuda":
            raise ValueError(f"attn={attn!r} runs on CUDA only, not on device={device!r}")
        if dtype not in ("float16", "bfloat16"):
            raise ValueError(f"attn={attn!r} needs dtype float16 or bfloat16, not {dtype!r}")
        if not flash_available(attn):
            raise ValueError(f"attn={attn!r}: the flash-attn package for it is not installed here")
    return OURS if attn == "unsee_eager" else attn


def set_attention(model, attn: str):
    """Switch a loaded model to the ``attn`` implementation (every layer); the model."""
    if getattr(model.config, "_attn_implementation", None) != attn:
        model.set_attn_implementation(attn)
    return model


def set_default_attention(model, attn: str):
    """``(model, name)``: the device's default ``attn`` on ``model``, or ours where the
    model's class has no ``attn`` path (transformers refuses it: Gemma 2's soft-capped
    attention has no sdpa one), so that a default never refuses a model."""
    try:
        return set_attention(model, attn), attn
    except ValueError:
        if attn == OURS:
            raise
        return set_attention(model, OURS), OURS


def get_determinism_facts(device: str, attn: str, dtype: str) -> dict[str, bool]:
    """The measured bitwise facts of a configuration (:data:`ATTN_FACTS`), by field name."""
    key = (get_device_kind(device), "unsee_eager" if attn == OURS else attn, dtype)
    values = ATTN_FACTS.get(key, UNMEASURED)
    names = ("same_chunking_repeats", "crop_continue_is_fresh", "chunk_invariant", "decode_is_prefill",
             "thread_invariant")
    return dict(zip(names, values))


def is_measured(device: str, attn: str, dtype: str) -> bool:
    return (get_device_kind(device), "unsee_eager" if attn == OURS else attn, dtype) in ATTN_FACTS


__all__ = ["ATTN_FACTS", "ATTN_NAMES", "DEFAULT_ATTN", "FLASH", "OURS", "check_attn", "flash_available",
           "get_default_attn", "get_determinism_facts", "is_measured", "set_attention", "set_default_attention"]
