"""Does decoding parallel sequences in one forward pay on llama.cpp, one thread?
(issue 27, item 5: the audits' generations batched as parallel sequences).

    python -m unsee.bench.llamacpp_batch --model qwen2.5-1.5b [--prompt 800] [--steps 3]

After a prompt of ``--prompt`` pseudo-random tokens in sequence 0, copied to
the others (cells shared, no copy), times one decode step of k sequences in
one ``llama_decode`` (one token each) for k = 1, 2, 4, 8, and one prefill
forward of 16 and 32 tokens, in CPU seconds (``time.process_time``, the
median of ``--steps``). If a step of k sequences costs about k steps of one,
batching the audits' generations saves nothing on this machine: the forward
is bound by arithmetic, not by reading the weights.
"""

from __future__ import annotations

import os
import statistics
import time

from unsee.bench import options

SEQUENCES = (1, 2, 4, 8)
CHUNKS = (16, 32)


def make_tokens(n: int, vocab: int, salt: int = 0) -> list[int]:
    """Fixed pseudo-random ids (no tokenizer needed)."""
    return [(i * 7919 + salt * 104729) % (vocab - 200) + 100 for i in range(n)]


def run(model: str, prompt: int, steps: int) -> dict:
    from unsee.impl.engines.llamacpp.model import llama_module
    from unsee.impl.engines.registry import load_engine

    lm = load_engine(model, "llamacpp").lm
    lc = llama_module()
    k_max = max(SEQUENCES)
    ctx = lm.new_context(n_ctx=prompt + k_max * (steps + max(CHUNKS)) + 64, n_seq=k_max)
    mem = lc.llama_get_memory(ctx)
    batch = lc.llama_batch_init(max(prompt, k_max * max(CHUNKS)), 0, 1)

    def decode(items: list[tuple[int, int, int, bool]]) -> float:
        """One llama_decode of (token, position, sequence, wants logits); its CPU seconds."""
        for i, (tok, pos, seq, logits) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, int(logits)
        batch.n_tokens = len(items)
        started = time.process_time()
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError(f"llama_decode failed on {len(items)} tokens")
        return time.process_time() - started

    try:
        ids = make_tokens(prompt, lm.vocab_size)
        out = {"prefill_prompt_s": decode([(t, i, 0, i == prompt - 1) for i, t in enumerate(ids)])}
        for seq in range(1, k_max):
            lc.llama_memory_seq_cp(mem, 0, seq, -1, -1)
        for k in SEQUENCES:
            times = [decode([(100 + s + step, prompt + step, s, True) for s in range(k)]) for step in range(steps)]
            for seq in range(k_max):
                lc.llama_memory_seq_rm(mem, seq, prompt, -1)
            out[f"decode_{k}_s"] = statistics.median(times)
        for n in CHUNKS:
            chunk = make_tokens(n, lm.vocab_size, salt=n)
            times = []
            for _ in range(steps):
                times.append(decode([(t, prompt + i, 0, i == n - 1) for i, t in enumerate(chunk)]))
                lc.llama_memory_seq_rm(mem, 0, prompt, -1)
            out[f"prefill_{n}_s"] = statistics.median(times)
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("llamacpp_batch", __doc__)
    options.add_model(parser)
    parser.add_argument("--prompt", type=int, default=800)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ.setdefault("UNSEE_LLAMA_THREADS", "1")
    out = run(args.model, args.prompt, args.steps)
    print(f"model {args.model}, llama.cpp, one thread, after a prompt of {args.prompt} tokens "
          f"(its prefill: {out['prefill_prompt_s']:.2f} CPU s)")
    print(f"{'forward':<32} {'CPU s':>7} {'per token':>9}")
    for k in SEQUENCES:
        print(f"{f'decode step, {k} sequence(s)':<32} {out[f'decode_{k}_s']:>7.3f} {out[f'decode_{k}_s'] / k:>9.3f}")
    for n in CHUNKS:
        print(f"{f'prefill of {n} tokens, 1 sequence':<32} {out[f'prefill_{n}_s']:>7.3f} "
              f"{out[f'prefill_{n}_s'] / n:>9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
