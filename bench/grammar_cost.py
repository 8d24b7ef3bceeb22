"""What a grammar's mask costs per decoded token, against the decode step it rides on (issue 49's
goal: at most 5% of a step), on a real model through the engine's own turns.

One conversation prompt, then for each case a turn decoded under that case's constraints
(``unsee.impl.agent.tools.grammars.get_constraints``): a response format (``json_schema``), a
forced call (``required``), a free ``auto`` turn whose lazy grammar watches for a call's opening,
and the same prompt with no rule. Every constraint call is timed (``get_allowed``, ``is_done``)
inside the turn, so the figure is the mask's own time per decided token, beside the turn's
time per token; their ratio is the goal's figure. Tokens and forwards are counted beside the
wall time (timings drift within a run: compare the same round's ratios).

    python -m unsee.bench.grammar_cost --model qwen2.5-1.5b --engine llamacpp --out out/grammar-cost
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import time

from unsee import load_engine
from unsee.bench import options
from unsee.bench.forget_policy import get_cpu_name
from unsee.impl.agent.render import get_renderer
from unsee.impl.agent.tools.grammars import get_constraints
from unsee.impl.agent.tools.native import get_call_format
from unsee.impl.engines.decoding import Rule
from unsee.impl.engines.files import get_cpu_isa
from unsee.impl.util.build import get_build

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                                                "required": ["city", "unit"]}}}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "facts": {"type": "array", "items": {
    "type": "string"}}, "population": {"type": "integer"}}, "required": ["city", "facts", "population"]}
PROMPT = "Tell me about Oslo: its population and three facts. What is the weather there?"
CASES = ("none", "json_schema", "required", "auto")


class Timed:
    """A constraint whose every call is timed (seconds, summed)."""

    def __init__(self, inner):
        self.inner, self.seconds, self.calls = inner, 0.0, 0

    def get_allowed(self, out):
        start = time.perf_counter()
        try:
            return self.inner.get_allowed(out)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1

    def is_done(self, out):
        start = time.perf_counter()
        try:
            return self.inner.is_done(out)
        finally:
            self.seconds += time.perf_counter() - start


def get_case(lm, fmt, case: str) -> tuple[tuple, str]:
    """The constraints of ``case`` and what the turn opens with (a forced call's opening)."""
    if case == "json_schema":
        return get_constraints(lm, fmt, [], "auto", None, True, {"type": "json_schema", "schema": SCHEMA}), ""
    if case == "required":
        return get_constraints(lm, fmt, [WEATHER], "required", None, True, None), fmt.opening
    if case == "auto":
        return get_constraints(lm, fmt, [WEATHER], "auto", None, True, None), ""
    return (), ""


def run_case(engine, renderer, fmt, case: str, max_tokens: int) -> dict:
    lm = engine.lm
    system = renderer.render_first("You are a helpful assistant.", [WEATHER], lm.encode, lm.name)
    constraints, opening = get_case(lm, fmt, case)
    timed = tuple(Timed(c) for c in constraints)
    lineage = engine.new_lineage()
    try:
        engine.prefill(lineage, lm.encode(system + renderer.render_message("user", PROMPT)
                                          + renderer.render_header(opening)))
        before = engine.counters.snapshot()
        start = time.perf_counter()
        out = engine.generate(lineage, max_tokens, stop_ids=lm.eos_ids, rule=Rule(constraints=timed))
        wall = time.perf_counter() - start
        spent = engine.counters.snapshot() - before
    finally:
        engine.drop(lineage)
    mask_s = sum(t.seconds for t in timed)
    decided = max(1, len(out))
    return {"case": case, "tokens": len(out), "forwards": spent.forward_calls, "decoded": spent.decoded_tokens,
            "turn_s": round(wall, 4), "mask_s": round(mask_s, 4), "mask_calls": sum(t.calls for t in timed),
            "step_ms": round(1000 * (wall - mask_s) / decided, 3), "mask_ms": round(1000 * mask_s / decided, 3),
            "text": lm.decode([t for t in out if t not in lm.eos_ids])[:160]}


def render(result: dict) -> str:
    label = result["label"]
    lines = [f"> build `{label['build']}` · attention llama.cpp flash attention, exact kernels, {label['threads']} "
             f"thread · dtype {label['model']} GGUF, f16 KV · CPU {label['cpu']} ({label['load']}) · command "
             f"`{label['command']}`", "",
             "| case | tokens | decode step (ms) | mask (ms per token) | mask / step |",
             "|---|---:|---:|---:|---:|"]
    for row in result["summary"]:
        lines.append(f"| {row['case']} | {row['tokens']} | {row['step_ms']} | {row['mask_ms']} | "
                     f"{row['ratio']:.2%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = options.get_parser("grammar_cost", __doc__)
    options.add_model(parser)
    options.add_backend(parser)
    options.add_rounds(parser)
    parser.add_argument("--max-tokens", type=int, default=64, help="each turn's output cap; default: 64")
    options.add_out(parser, "out/grammar-cost")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    build = get_build()  # read as the work starts: the checkout may move on during the run
    engine = load_engine(args.model, backend=args.engine)
    renderer = get_renderer(engine.lm)
    fmt = get_call_format(renderer.segments, renderer.has_native_calls())
    if fmt is None:
        parser.error(f"{args.model}: its chat template has no call format this server parses")
    get_case(engine.lm, fmt, "auto")  # the vocabulary read once, outside the timings
    rows = []
    for round_ in range(args.rounds):
        for case in CASES:
            rows.append({**run_case(engine, renderer, fmt, case, args.max_tokens), "round": round_})
            print(f"round {round_ + 1}/{args.rounds} {case}: {rows[-1]['tokens']} tokens, "
                  f"mask {rows[-1]['mask_ms']} ms of {rows[-1]['step_ms']} ms a step", file=sys.stderr, flush=True)
    summary = []
    for case in CASES:
        mine = [r for r in rows if r["case"] == case]
        step = statistics.median(r["step_ms"] for r in mine)
        mask = statistics.median(r["mask_ms"] for r in mine)
        summary.append({"case": case, "tokens": mine[0]["tokens"], "step_ms": step, "mask_ms": mask,
                        "ratio": mask / step if step else 0.0})
    label = {"build": build[:7], "model": args.model, "cpu": f"{get_cpu_name()} ({get_cpu_isa()})",
             "threads": getattr(engine.lm, "threads", 1), "load": "the machine shared with other work",
             "command": "python -m unsee.bench.grammar_cost " + shlex.join(argv)}
    result = {"label": label, "rows": rows, "summary": summary}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(json.dumps(result, indent=1))
    (args.out / "table.md").write_text(render(result))
    print(render(result))


if __name__ == "__main__":
    main()
