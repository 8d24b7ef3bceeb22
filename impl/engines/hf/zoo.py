"""The architecture zoo: tiny random models of the main transformers families,
built from a config with no download, loadable by name (``tiny-qwen2``, ...).

Each family is a transformers ``model_type`` and the config fields that
make it small and exercise what sets the family apart: q/k/v biases (Qwen2),
q/k norms (Qwen3), a sliding window on every layer (Mistral), alternating
sliding/global layers with logit soft-capping (Gemma 2), 5:1 local/global
layers with two RoPE bases (Gemma 3), a fused qkv projection (Phi-3), a
mixture of experts with a shared expert (Qwen2-MoE). The windows are
:data:`WINDOW` tokens, so a short episode crosses them. Every family uses
the byte tokenizer of ``tiny`` (ChatML, no chat template), so episodes run
unchanged. ``tiny-llama`` is ``tiny`` itself.

:func:`check_family` refuses, by name and with the reason, a family listed
in :data:`REFUSED` before anything is built. The weights are drawn by
:func:`unsee.impl.engines.hf.adapter.build_tiny_model`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: the sliding window of the zoo's windowed families, in tokens
WINDOW = 8


@dataclass(frozen=True)
class Family:
    """One zoo member: its transformers ``model_type``, the config fields
    beyond the common ones (:data:`COMMON`), and what it exercises."""

    model_type: str
    config: dict = field(default_factory=dict)
    exercises: str = ""


#: the config fields every family shares (the byte tokenizer's ids are added at build time)
COMMON = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 128, "max_position_embeddings": 4096, "tie_word_embeddings": False}

ZOO: dict[str, Family] = {
    "tiny-qwen2": Family("qwen2", {}, "q/k/v projection biases"),
    "tiny-qwen3": Family("qwen3", {"head_dim": 16}, "q/k RMSNorms"),
    "tiny-mistral": Family("mistral", {"head_dim": 16, "sliding_window": WINDOW},
                           f"a {WINDOW}-token sliding window on every layer"),
    "tiny-gemma2": Family("gemma2", {"head_dim": 16, "sliding_window": WINDOW, "query_pre_attn_scalar": 16,
                                     "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
                          f"alternating {WINDOW}-token sliding and global layers, attention and final "
                          "logit soft-capping"),
    "tiny-gemma3": Family("gemma3_text", {"head_dim": 16, "num_hidden_layers": 6, "sliding_window": WINDOW,
                                          "query_pre_attn_scalar": 16},
                          f"5 local ({WINDOW}-token window, RoPE base 1e4) to 1 global layer (RoPE base "
                          "1e6), q/k norms"),
    "tiny-phi3": Family("phi3", {}, "fused qkv and gate/up projections"),
    "tiny-qwen2moe": Family("qwen2_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                          "shared_expert_intermediate_size": 64},
                            "a mixture of 4 experts (top 2) and a shared expert"),
}

#: families that cannot be made exact, with the reason (none today); loading one fails before any work
REFUSED: dict[str, str] = {}

#: the zoo's names, ``tiny-llama`` (an alias of ``tiny``) first
ZOO_NAMES = ("tiny-llama", *ZOO)


def is_zoo_name(name: str) -> bool:
    """Whether ``name`` is a zoo family (``tiny-llama`` included), refused or not."""
    return name in ZOO_NAMES or name in REFUSED


def check_family(name: str) -> Family | None:
    """The family ``name`` builds (None for ``tiny-llama``, which is ``tiny``);
    a ValueError naming it and the reason if it is refused or unknown."""
    if name in REFUSED:
        raise ValueError(f"model family {name!r} is refused: {REFUSED[name]}")
    if name == "tiny-llama":
        return None
    if name not in ZOO:
        raise ValueError(f"{name!r} is not a zoo family; known: {ZOO_NAMES}")
    return ZOO[name]


def get_config_fields(family: Family, token_ids: dict[str, int], vocab_size: int) -> dict:
    """Every config field of ``family``: :data:`COMMON`, the family's own, the tokenizer's."""
    return {**COMMON, "vocab_size": vocab_size, **token_ids, **family.config}
