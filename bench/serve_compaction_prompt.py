"""Why the Agents SDK run of bench/serve_compaction_agents.py stopped: the prompt the model
answered its tool's output on, read back from the conversation's store, and what the model's
first token would be on it and on two variants.

The last compaction's tool step is taken from ``session.db`` (its blocks' tokens, as the
server prefilled them): the system block, the summary, the user turn, the model's call, the
tool output, then the assistant header. The variants: the same without the summary (no
compaction at all), the same with the tool round before the compaction kept verbatim
between the summary and the user turn (the user turn, the call, the output and the answer in
prose), and with only that round's call, output and answer kept (without its user turn). Each is prefilled in one forward on a fresh llama.cpp context (so its logits differ from
the server's block-by-block ones in the last bits: a near tie can fall either way) and reports
the first token's four likeliest pieces and the greedy answer::

    python -m unsee.bench.serve_compaction_prompt --store out/serve-compaction/agents/store/conv_...
"""

from __future__ import annotations

import array
import sqlite3
from pathlib import Path

import numpy as np

from unsee.bench import options

HEADER = "<|im_start|>assistant\n"


def get_text(db, lm, block_id: str) -> str:
    """A stored block's tokens, detokenized with the special tokens."""
    (raw,) = db.execute("select tokens from blocks where id = ?", (block_id,)).fetchone()
    tokens = array.array("i")
    tokens.frombytes(raw)
    return lm.detokenize(list(tokens), special=True).decode()


def get_prompts(db, lm) -> dict[str, str]:
    """The four prompts (module docstring), from the steps around the last compaction."""
    steps = [row[0] for row in db.execute("select id from steps order by seq")]
    kinds = dict(db.execute("select id, kind from steps"))
    last = max(i for i, s in enumerate(steps) if kinds[s] == "compact")
    user, tool = steps[last + 1], steps[last + 2]
    before = [s for s in steps[:last] if kinds[s] in ("user", "tool")][-2:]
    system, summary = get_text(db, lm, f"{steps[last]}/system"), get_text(db, lm, f"{steps[last]}/context")
    turn = "".join(get_text(db, lm, b) for b in (user, f"{user}/answer", tool)) + HEADER
    kept = "".join(get_text(db, lm, b) for s in before for b in (s, f"{s}/answer"))
    round_ = "".join(get_text(db, lm, b) for b in (f"{before[0]}/answer", before[1], f"{before[1]}/answer"))
    return {"as served": system + summary + turn, "no summary": system + turn,
            "previous tool round kept": system + summary + kept + turn,
            "previous call, output and answer kept": system + summary + round_ + turn}


def probe(lm, prompt: str, tokens: int = 24) -> dict:
    """The first token's likeliest pieces and the greedy answer on ``prompt``."""
    ids = lm.tokenize(prompt.encode(), add_bos=False, special=True)
    lm.reset()
    lm.eval(ids)
    logits = np.asarray(lm.scores[lm.n_tokens - 1], dtype=np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    top = [(lm.detokenize([int(i)]).decode(), round(float(p[i]), 3)) for i in np.argsort(-p)[:4]]
    out = []
    for _ in range(tokens):
        token = int(np.argmax(lm.scores[lm.n_tokens - 1]))
        if token == lm.token_eos() or lm.detokenize([token], special=True) == b"<|im_end|>":
            break
        out.append(token)
        lm.eval([token])
    return {"prompt_tokens": len(ids), "first_token": top, "answer": lm.detokenize(out).decode()}


def main() -> None:
    from llama_cpp import Llama

    from unsee.impl.engines.catalog import get_entry, get_model_path

    parser = options.get_parser("serve_compaction_prompt", __doc__)
    parser.add_argument("--store", type=Path, required=True, help="a conversation's folder (holds session.db)")
    options.add_model(parser)
    parser.set_defaults(model="qwen2.5-1.5b")  # the model of make serve-compaction's store
    args = parser.parse_args()
    lm = Llama(str(get_model_path(get_entry(args.model))), n_ctx=2048, logits_all=True, verbose=False)
    db = sqlite3.connect(args.store / "session.db")
    for name, prompt in get_prompts(db, lm).items():
        print(name, probe(lm, prompt), flush=True)


if __name__ == "__main__":
    main()
