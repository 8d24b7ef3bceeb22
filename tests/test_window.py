"""Sliding-window and local/global attention on the transformers engine:
`FullWindowLayer` (impl/engines/hf/cache.py) against the model's own cache
and its own cache-less forward, on the zoo's windowed families (8-token
windows): Mistral (every layer), Gemma 2 (alternating, soft-capping) and
Gemma 3 (5 local : 1 global, two RoPE bases).

Every comparison is bitwise. Chunk plans run from shorter than the window to
several windows long, and crops fall at chunk boundaries before and after the
window's edge (a crop inside a chunk has no model-own counterpart: the kept
prefix was computed by a forward longer than itself).
"""

from __future__ import annotations

import hashlib

import pytest
import torch
from transformers import DynamicCache

from unsee.impl.engines.hf import adapter, cache, zoo
from unsee.impl.engines.lineage import crop
from unsee.properties.engines import get_model, make_engine

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOWED = ("tiny-mistral", "tiny-gemma2", "tiny-gemma3")
#: chunk lengths: one prefill shorter than the window, then single-token decodes across its edge,
#: then a chunk longer than the window, then more decodes and a mid-size chunk
PLAN = (5, 1, 1, 1, 1, 1, 12, 1, 1, 7, 1, 20, 1)


def token_ids(n: int, salt: int = 0) -> list[int]:
    return [(37 * i + 11 + salt) % 256 for i in range(n)]


def run_plan(model, kv, ids: list[int], plan) -> list[str]:
    """Prefill ``ids`` in chunks of ``plan``'s lengths; per forward, a hash of
    the bytes of every position's logits (short to print when unequal)."""
    out, at = [], 0
    for n in plan:
        logits = adapter.forward_all_logits(model, ids[at:at + n], kv)
        out.append(hashlib.sha256(logits.numpy().tobytes()).hexdigest()[:16])
        at += n
    return out


def own_cache(model):
    """The model's own cache (sliding layers drop tokens past the window)."""
    return DynamicCache(config=model.config)


@pytest.mark.parametrize("name", WINDOWED)
def test_window_layers_replace_the_models_own(name):
    model = get_model(name).model
    kinds = [type(layer).__name__ for layer in cache.new_cache(model).layers]
    own = [type(layer).__name__ for layer in own_cache(model).layers]
    assert "FullWindowLayer" in kinds and "DynamicSlidingWindowLayer" not in kinds
    assert [k == "FullWindowLayer" for k in kinds] == [k == "DynamicSlidingWindowLayer" for k in own]
    if name == "tiny-gemma3":
        assert kinds == ["FullWindowLayer"] * 5 + ["DynamicLayer"]


@pytest.mark.parametrize("name", WINDOWED)
def test_every_forward_equals_the_models_own_cache(name):
    model = get_model(name).model
    ids = token_ids(sum(PLAN))
    ours, own = cache.new_cache(model), own_cache(model)
    assert run_plan(model, ours, ids, PLAN) == run_plan(model, own, ids, PLAN)
    assert cache.cache_length(ours) == cache.cache_length(own) == sum(PLAN) > 4 * zoo.WINDOW
    # ours kept every token; the model's own sliding layers only the last window - 1
    full = [k.shape[-2] for k, _ in cache.cache_tensors(ours)]
    assert set(full) == {sum(PLAN)}


@pytest.mark.parametrize("name", WINDOWED)
@pytest.mark.parametrize("length", [5, zoo.WINDOW - 1, zoo.WINDOW, 3 * zoo.WINDOW + 3])
def test_one_prefill_equals_the_cacheless_forward(name, length):
    model = get_model(name).model
    ids = token_ids(length)
    ours = adapter.forward_all_logits(model, ids, cache.new_cache(model))
    with torch.inference_mode():
        plain = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    assert torch.equal(ours, plain)


@pytest.mark.parametrize("name", WINDOWED)
@pytest.mark.parametrize("cut", [5, 7, 9, 10, 24, 31])  # chunk boundaries of PLAN, before and after the window's edge
def test_crop_then_continue_equals_the_models_own_fresh_run(name, cut):
    """Run the whole plan, crop back to a chunk boundary, continue with other
    tokens: every forward after the crop equals the model's own cache fed the
    kept chunks and then the same continuation."""
    model = get_model(name).model
    ids, more = token_ids(sum(PLAN)), token_ids(30, salt=101)
    kept_plan = _plan_up_to(cut)
    later = (1, 1, 9, 1, 14, 1, 1)
    ours = cache.new_cache(model)
    run_plan(model, ours, ids, PLAN)
    cache.crop_cache(ours, cut)
    after_crop = run_plan(model, ours, more, later)
    own = own_cache(model)
    run_plan(model, own, ids, kept_plan)
    assert after_crop == run_plan(model, own, more, later)


def _plan_up_to(cut: int) -> tuple[int, ...]:
    """The chunks of PLAN that end at ``cut`` (a chunk boundary)."""
    plan, total = [], 0
    for n in PLAN:
        if total == cut:
            break
        plan.append(n)
        total += n
    if total != cut:
        raise ValueError(f"cut={cut} is not a chunk boundary of {PLAN}")
    return tuple(plan)


@pytest.mark.parametrize("name", WINDOWED)
def test_clone_share_and_excise_keep_the_window(name):
    """A shared prefix and a clone continue exactly as the source would; an
    excision (the span-only ablation) leaves a cache that continues like
    any other, and the source is untouched."""
    model = get_model(name).model
    ids, more = token_ids(40), token_ids(12, salt=7)
    src = cache.new_cache(model)
    run_plan(model, src, ids, (20, 20))
    shared = cache.share_cache_prefix(model, src, 20)
    twin = cache.new_cache(model)
    run_plan(model, twin, ids, (20,))
    assert run_plan(model, shared, more, (12,)) == run_plan(model, twin, more, (12,))
    clone = cache.clone_cache(src)
    before = [k.clone() for k, _ in cache.cache_tensors(src)]
    cache.excise_cache_span(clone, 3, 17)
    assert cache.cache_length(clone) == 26
    run_plan(model, clone, more, (1, 4))
    assert all(torch.equal(a, k) for a, (k, _) in zip(before, cache.cache_tensors(src)))


def test_tokens_past_the_window_change_nothing():
    """The window is really applied: on tiny-mistral (2 layers, every one
    windowed, so a position sees at most 2 * (window - 1) tokens back),
    changing the first token leaves the logits of positions 2 * (window - 1)
    + 1 onward bitwise equal; on tiny-llama (full attention) it changes
    them (the check can fail)."""
    reach = 2 * (zoo.WINDOW - 1)
    for name, changes in (("tiny-mistral", False), ("tiny-llama", True)):
        model = get_model(name).model
        a, b = token_ids(40), token_ids(40)
        b[0] = (b[0] + 1) % 256
        la = adapter.forward_all_logits(model, a, cache.new_cache(model))
        lb = adapter.forward_all_logits(model, b, cache.new_cache(model))
        assert not torch.equal(la[reach], lb[reach])  # still inside the reach
        assert torch.equal(la[reach + 1:], lb[reach + 1:]) is not changes, name


def test_engine_crops_past_the_window_edge():
    """Through the engine: crop back across the window's edge, continue, and
    get the digest and logits of a fresh lineage with the same chunks."""
    engine = make_engine("tiny-gemma3")
    ids = token_ids(40)
    a = engine.new_lineage()
    for part in (ids[:6], ids[6:30], ids[30:]):
        engine.prefill(a, part)
    a = crop(engine, a, 6)
    engine.prefill(a, ids[6:30])
    b = engine.new_lineage()
    for part in (ids[:6], ids[6:30]):
        engine.prefill(b, part)
    assert engine.digest(a) == engine.digest(b)
    assert torch.equal(engine.logits(a), engine.logits(b))


def test_unsupported_layer_kind_is_refused_by_name(monkeypatch):
    """A cache layer kind that cannot be cropped exactly is refused with its name."""
    from transformers.cache_utils import DynamicLayer

    class OddLayer(DynamicLayer):
        pass

    original = DynamicCache.__init__

    def with_odd_layer(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.layers[1] = OddLayer()

    monkeypatch.setattr(DynamicCache, "__init__", with_odd_layer)
    with pytest.raises(ValueError, match="layer 1 has a OddLayer cache"):
        cache.new_cache(get_model("tiny-qwen2").model)
