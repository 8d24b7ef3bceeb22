"""What keeping every token of a sliding-window layer costs in KV memory.

The transformers engine's sliding-window layers (``FullWindowLayer``,
impl/engines/hf/cache.py) keep the full sequence so that a crop, clone or
excision can go back past the window's edge; the model's own layers keep the
last ``window - 1`` tokens. This prints, per model and context length, the KV
bytes of both and their ratio:

- measured, for the zoo's windowed families: the bytes of the tensors each
  cache holds after one prefill, ours against the model's own
  (``DynamicCache(config=...)``), checked against the formula;
- from the published configs (layer kinds, KV heads, head size, window) of
  real models, by the same formula, in bf16 (2 bytes a value).

    python -m unsee.bench.window_memory
"""

from __future__ import annotations

from transformers import DynamicCache

from unsee.bench import options
from unsee.impl.engines.hf import cache
from unsee.impl.engines.registry import load_model_for

#: Published configs: (layer kinds as 'S'liding / 'F'ull, KV heads, head size, window).
REAL_MODELS = {
    "Mistral-7B-v0.1": ("S" * 32, 8, 128, 4096),
    "Gemma-2-2B": ("SF" * 13, 4, 256, 4096),
    "Gemma-3-1B": (("S" * 5 + "F") * 4 + "SS", 1, 256, 512),
    "Gemma-3-4B": (("S" * 5 + "F") * 5 + "SSSS", 4, 256, 1024),
}
LENGTHS = (512, 2048, 8192, 32768)
ZOO_WINDOWED = ("tiny-mistral", "tiny-gemma2", "tiny-gemma3")


def compute_kv_bytes(kinds: str, kv_heads: int, head_dim: int, window: int, n: int, value_bytes: int,
                     windowed: bool) -> int:
    """KV bytes after ``n`` tokens: keys and values per layer; a sliding layer
    holds ``min(n, window - 1)`` tokens when ``windowed``, else ``n``."""
    per_token = 2 * kv_heads * head_dim * value_bytes
    return sum(per_token * (min(n, window - 1) if windowed and kind == "S" else n) for kind in kinds)


def get_tensor_bytes(kv) -> int:
    return sum(t.numel() * t.element_size() for pair in cache.cache_tensors(kv) for t in pair if t is not None)


def measure_zoo(name: str, n: int) -> tuple[int, int, str]:
    """(ours, the model's own) KV bytes after one prefill of ``n`` tokens, and the family's layer kinds."""
    from unsee.impl.engines.hf import adapter

    model = load_model_for("transformers", name).model
    ids = [(7 * i + 3) % 256 for i in range(n)]
    ours, own = cache.new_cache(model), DynamicCache(config=model.config)
    adapter.forward_last_logits(model, ids, ours)
    adapter.forward_last_logits(model, ids, own)
    kinds = "".join("S" if getattr(layer, "is_sliding", False) else "F" for layer in ours.layers)
    return get_tensor_bytes(ours), get_tensor_bytes(own), kinds


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("window_memory", __doc__)
    parser.add_argument("--zoo-length", type=int, default=200)
    args = parser.parse_args(argv)
    print(f"{'model':<18} {'tokens':>7} {'full KV':>12} {'windowed KV':>12} {'ratio':>7}  bytes/token full, windowed")
    for name in ZOO_WINDOWED:
        n = args.zoo_length
        ours, own, kinds = measure_zoo(name, n)
        config = load_model_for("transformers", name).model.config
        expect = [compute_kv_bytes(kinds, config.num_key_value_heads, config.head_dim, config.sliding_window, n, 4, w)
                  for w in (False, True)]
        if [ours, own] != expect:
            raise SystemExit(f"{name}: measured {ours, own} bytes, the formula says {expect}")
        print(f"{name:<18} {n:>7} {ours:>12,} {own:>12,} {ours / own:>7.2f}  {ours / n:,.0f}, {own / n:,.0f} (fp32, measured)")
    for name, (kinds, heads, dim, window) in REAL_MODELS.items():
        for n in LENGTHS:
            full, win = (compute_kv_bytes(kinds, heads, dim, window, n, 2, w) for w in (False, True))
            print(f"{name:<18} {n:>7} {full:>12,} {win:>12,} {full / win:>7.2f}  {full / n:,.0f}, {win / n:,.0f} (bf16)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
