"""The registered attention (adapter.grouped_eager_attention) gives the bits of
the model's own eager attention: on random operands over decode and prefill
shapes, and end to end through the tiny model."""

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, eager_attention_forward

from unsee.impl.engines.hf import adapter
from unsee.impl.engines.registry import make_engine
from unsee.properties.engines import get_model


def get_attention_module(heads: int, kv_heads: int) -> LlamaAttention:
    config = LlamaConfig(hidden_size=heads * 64, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=64)
    return LlamaAttention(config, layer_idx=0).eval()


def get_causal_mask(queries: int, keys: int, dtype: torch.dtype) -> torch.Tensor:
    """An additive causal mask as eager's mask function builds it: the last
    ``queries`` keys are the queries' own positions."""
    mask = torch.zeros(1, 1, queries, keys, dtype=dtype)
    mask[..., keys - queries:] = torch.triu(torch.full((queries, queries), torch.finfo(dtype).min, dtype=dtype), 1)
    return mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (4, 2)])
def test_grouped_attention_gives_eager_bits(monkeypatch, dtype, heads, kv_heads):
    monkeypatch.setattr(adapter, "GROUPED_ATTENTION_FROM", 0)  # always the grouped form
    module = get_attention_module(heads, kv_heads)
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for queries in (1, 2, 3, 5, 8, 32):
        for keys in (queries, 40, 300, 1100):
            if keys < queries:
                continue
            q = torch.randn(1, heads, queries, 64, generator=gen).to(dtype)
            # the cache hands attention views into longer storage (a shared prefix)
            k = torch.randn(1, kv_heads, keys + 17, 64, generator=gen).to(dtype)[:, :, :keys]
            v = torch.randn(1, kv_heads, keys + 17, 64, generator=gen).to(dtype)[:, :, :keys]
            for mask in (get_causal_mask(queries, keys, dtype), None):
                ours, weights = adapter.grouped_eager_attention(module, q, k, v, mask, scaling=0.125)
                theirs, _ = eager_attention_forward(module, q, k, v, mask, scaling=0.125)
                assert weights is None
                assert ours.shape == theirs.shape == (1, queries, heads, 64)
                assert torch.equal(ours, theirs), f"queries={queries} keys={keys} mask={mask is not None}"
                checked += 1
    assert checked == 48


def run_episode(lm) -> tuple[str, list[int]]:
    engine = make_engine(lm)
    lin = engine.new_lineage()
    ids = lm.encode("the grouped heads must not change a single bit " * 3)
    for i in range(0, len(ids), 16):
        engine.prefill(lin, ids[i:i + 16])
    out = engine.generate(lin, 12, stop_ids=())
    return engine.digest(lin), out


def test_models_load_with_grouped_attention_and_keep_eager_bits(monkeypatch, one_thread):
    lm = get_model("tiny", attn="unsee_eager")  # 4 query heads over 2 key/value heads (sdpa is the default)
    assert lm.model.config._attn_implementation == adapter.ATTN_IMPLEMENTATION == "unsee_eager"
    monkeypatch.setattr(adapter, "GROUPED_ATTENTION_FROM", 10**9)  # the model's eager function throughout
    eager = run_episode(lm)
    monkeypatch.setattr(adapter, "GROUPED_ATTENTION_FROM", 20)  # grouped once the context reaches 20 tokens
    grouped = run_episode(lm)
    assert grouped == eager


def test_only_llama_style_eager_functions_are_grouped(monkeypatch):
    """A family whose eager attention differs from Llama's (Gemma 2 soft-caps
    its scores) keeps its own function, also past the grouping threshold."""
    from transformers import Gemma2Config
    from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_eager
    from transformers.models.mistral.modeling_mistral import eager_attention_forward as mistral_eager

    assert adapter._is_llama_eager(eager_attention_forward)
    assert adapter._is_llama_eager(mistral_eager)  # the same code under another name
    assert not adapter._is_llama_eager(gemma2_eager)
    monkeypatch.setattr(adapter, "GROUPED_ATTENTION_FROM", 0)
    config = Gemma2Config(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                          attn_logit_softcapping=5.0)
    module = Gemma2Attention(config, layer_idx=0).eval()
    gen = torch.Generator().manual_seed(1)
    q = 10 * torch.randn(1, 4, 3, 64, generator=gen)  # large scores, so the soft-cap bites
    k, v = torch.randn(1, 2, 40, 64, generator=gen), torch.randn(1, 2, 40, 64, generator=gen)
    mask = get_causal_mask(3, 40, torch.float32)
    ours, _ = adapter.grouped_eager_attention(module, q, k, v, mask, scaling=0.125, softcap=5.0)
    theirs, _ = gemma2_eager(module, q, k, v, mask, scaling=0.125, softcap=5.0)
    llama_style, _ = eager_attention_forward(module, q, k, v, mask, scaling=0.125)
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, llama_style)
