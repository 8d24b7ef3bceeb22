"""Time to the first streamed delta against a turn's whole time, through
``unsee serve`` and the ``openai`` client (issue 38, docs/serve.md "Streaming").

One conversation, ``--turns`` streamed responses (``responses.stream()``),
each a question whose answer runs to ``--max-output-tokens``; for each turn:
the seconds from the request to its first ``response.output_text.delta``, to
``response.completed``, the deltas and the output tokens. Before issue 38 the
server decoded a turn whole before its first event, so the first delta came
with the last; the ratio is what streaming saves.

    UNSEE_LLAMA_THREADS=1 python -m unsee.bench.serve_stream --model qwen2.5-1.5b --backend llamacpp
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from unsee import Settings, load_engine
from unsee.bench import options
from unsee.bench.serve_load import report

QUESTIONS = ("Explain in a few sentences how a refrigerator keeps food cold.",
             "Now explain how a heat pump warms a house.", "Which of the two uses more energy, and why?",
             "Summarise both in one paragraph.")


def stream_turn(client, conv_id: str, question: str) -> dict:
    """One streamed turn's timings (seconds from the request)."""
    start = time.perf_counter()
    first, deltas, final = None, 0, None
    with client.responses.stream(model="m", conversation=conv_id, input=question) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                first = first or time.perf_counter() - start
                deltas += 1
            final = getattr(event, "response", final)  # the helper's final response needs `completed`, not
            # `incomplete` (an answer cut at the output cap)
    return {"first_delta_s": first, "turn_s": time.perf_counter() - start, "deltas": deltas, "status": final.status,
            "output_tokens": final.usage.output_tokens, "input_tokens": final.usage.input_tokens}


def run(args: argparse.Namespace) -> dict:
    import openai

    from unsee.impl.serve.pool import Pool
    from unsee.impl.serve.server import ServerThread

    engine = load_engine(args.model, backend=args.backend)
    pool = Pool(engine, tempfile.mkdtemp(prefix="serve-stream-"), defaults=Settings(max_new_tokens=args.max_output_tokens))
    with ServerThread(pool, args.model) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=600)
        conv = client.conversations.create().id
        turns = [stream_turn(client, conv, QUESTIONS[i % len(QUESTIONS)]) for i in range(args.turns)]
    ratios = [t["first_delta_s"] / t["turn_s"] for t in turns if t["first_delta_s"] is not None]
    return {"model": args.model, "backend": args.backend, "max_output_tokens": args.max_output_tokens,
            "determinism": engine.lm.determinism_statement, "turns": turns,
            "median_first_delta_s": statistics.median(t["first_delta_s"] or t["turn_s"] for t in turns),
            "median_turn_s": statistics.median(t["turn_s"] for t in turns),
            "median_ratio": statistics.median(ratios) if ratios else None}


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("serve_stream", __doc__)
    options.add_model(parser)
    options.add_backend(parser, "--backend")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-output-tokens", type=int, default=64)
    options.add_out(parser, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    report(run(args), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
