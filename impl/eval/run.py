"""The evaluation runner behind ``unsee eval`` (issue 10): every method on one
contaminated base state per episode, every metric (impl/eval/metrics.py) and every
audit, one JSONL row per (episode, method), written as it goes.

Per episode the base state is built once; each method runs on a fork of it
(``apply_method``: the fork shares the cache copy-on-write), so every
comparison is paired. B5 (``reset``) runs first: it is the reference of CAD,
of matched-seed agreement and of every audit's false-positive floor, so it
runs whether or not it was asked for.

Audits, per row (their floors are measured on the B5 rows by the report,
impl/eval/report.py):

- **Leak@probes:** the six probe families of impl/eval/audit.py asked of the
  post-method state, greedy; one boolean per family. The ``task`` probe is
  the episode's task query, whose answer is also the final answer the leak
  metrics score.
- **Leak@5:** ``samples`` (5) answers to the task query sampled at
  ``temperature`` (0.7) with seeds that depend only on the episode and the
  draw, so the draws of two methods are matched.
- **Matched-seed agreement:** each draw's token ids compared with B5's draw of
  the same seed (token for token).
- **Behavioral extraction:** for a case with a ``behavior``, which option the
  post-method state picks (``avoid``: it picked the other one).

Rows carry the torch thread count: digests depend on it, and a row's
``equals_reset`` compares digests computed in the same process only.
Resuming reads the rows already written (a truncated last line, what an
interrupt leaves, is dropped with a warning; any other damage is an error
naming the line) and runs only the missing (episode, method) pairs.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import attrs

from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.eval.asking import DEFAULT_TASK, Asker, ask_state, draw_seed, get_ask_key, get_task, pick_option
from unsee.impl.eval.cases import EvalCase
from unsee.impl.eval.distribution import get_dist_methods, sample_distribution
from unsee.impl.eval.metrics import (
    Action,
    apply_sink_policy,
    compute_cad,
    get_actions,
    get_efficiency,
    score_leaks,
)
from unsee.impl.eval.rows import (
    ROW_VERSION,
    ROWS_FILE,
    EvalError,
    check_out_dir,
    interleave_suites,
    read_rows,
    rewrite_rows,
)
from unsee.impl.eval.suites import SUITES, get_case_tools
from unsee.impl.methods.baselines import METHODS, PAPER_NAMES, apply_method, derive_method, get_equal_run
from unsee.impl.util.build import get_build
from unsee.impl.util.modules import get_missing_module
from unsee.impl.util.progress import open_bar

REFERENCE = "reset"
#: the row fields a resumed run checks against its own configuration
CONFIG_FIELDS = ("backend", "model", "device", "dtype", "samples", "temperature", "probe_tokens", "turn_tokens")
#: the backend of a row written before rows recorded one (every such run was on transformers)
LEGACY_BACKEND = "transformers"
#: per backend, the methods it cannot run, and why (refused before any work)
UNSUPPORTED_METHODS = {"llamacpp": {"span-excision": "the llama.cpp engine cannot cut a span out of its KV"},
                       "vllm": {"span-excision": "vLLM exposes no KV to cut a span out of"}}


@attrs.frozen
class EvalConfig:
    model: str = "smollm2"
    #: the registry backend (impl/engines/registry.py): transformers or llamacpp
    backend: str = "transformers"
    device: str = "cpu"
    dtype: str = "float32"
    methods: tuple[str, ...] = METHODS
    samples: int = 5  # Leak@5 draws
    temperature: float = 0.7  # of the Leak@5 draws
    max_new_tokens: int | None = None  # of every probe; None: the episode's setting
    workers: int = 1
    kv_budget: int | None = None  # of each process's engine (impl/engines/hf/engine.py)
    #: override every episode's max_new_tokens (model turns), e.g. for a quick
    #: smoke run; None keeps the suites' setting
    turn_tokens: int | None = None
    #: reuse the audits' generations of a state whose ask key (its KV digest and
    #: prompts: impl/eval/asking.py) an earlier method of the episode already
    #: reached in this process (exact by A1: the same KV decodes the same tokens);
    #: the row names that method in ``asked_from``
    share_identical: bool = True
    #: run once what two methods run step for step (impl/methods/baselines.py:
    #: get_equal_run): B9 takes B7's forget, B7-oracle with nothing labelled takes
    #: B7-without-drafts' run; the row names the run in ``run_from``, and its counted
    #: work and wall time are that run's (B9's plus its sink policy's)
    share_runs: bool = True
    #: vLLM's scale-out options as (name, value) pairs: tensor_parallel_size, distributed_executor_backend
    engine_options: tuple = ()

    def __attrs_post_init__(self) -> None:
        from unsee.impl.engines.registry import BACKENDS

        if self.backend not in BACKENDS:
            raise EvalError(f"backend {self.backend!r} is not one of {BACKENDS}")
        refused = {m: why for m, why in UNSUPPORTED_METHODS.get(self.backend, {}).items() if m in self.methods}
        if refused:
            raise EvalError(f"the {self.backend} engine cannot run {', '.join(refused)} "
                            f"({'; '.join(refused.values())}): leave it out of the methods")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise EvalError(f"unknown method(s) {', '.join(map(repr, unknown))}; expected some of {METHODS}")
        if not self.methods:
            raise EvalError("no methods to run")
        if self.samples < 0:
            raise EvalError(f"samples must be >= 0, got {self.samples}")
        if not self.temperature > 0:
            raise EvalError(f"the Leak@5 temperature must be > 0, got {self.temperature}")
        if self.max_new_tokens is not None and not 1 <= self.max_new_tokens <= 4096:
            raise EvalError(f"probe tokens must be in 1..4096, got {self.max_new_tokens}")
        if self.turn_tokens is not None and not 1 <= self.turn_tokens <= 4096:
            raise EvalError(f"turn tokens must be in 1..4096, got {self.turn_tokens}")
        if self.workers < 1:
            raise EvalError(f"workers must be >= 1, got {self.workers}")

    def get_methods(self) -> tuple[str, ...]:
        """The methods in run order: the B5 reference first, always present."""
        return (REFERENCE, *(m for m in self.methods if m != REFERENCE))


# --- suites ----------------------------------------------------------------------


def get_suite_names(suite: str) -> tuple[str, ...]:
    """``all``, one suite, or a comma-separated list of suites."""
    names = [s.strip() for s in suite.split(",") if s.strip()]
    if names == ["all"]:
        return SUITES
    unknown = [s for s in names if s not in SUITES]
    if unknown or not names:
        raise EvalError(f"unknown suite {', '.join(map(repr, unknown)) or repr(suite)}; expected one of "
                        f"{SUITES + ('all',)} or a comma-separated list")
    return tuple(dict.fromkeys(names))


def generate_cases(suite: str, n: int, seed: int = 0) -> list[EvalCase]:
    """``n`` cases of each named suite, from the suite generators (impl/eval/suites.py).
    A suite whose optional package is missing is an error naming it, under
    ``all`` too (:func:`check_eval_extras` says so before any work)."""
    names = get_suite_names(suite)
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise EvalError(f"--n must be a positive integer, got {n!r}")
    from unsee.impl.eval import suites

    generate = getattr(suites, "generate_suite", None)
    if generate is None:
        raise EvalError("this build has no suite generators (impl/eval/suites.py: generate_suite); "
                        "pass cases to run_evaluation directly")
    cases = []
    for name in names:
        try:
            cases += generate(name, n, seed=seed)
        except ImportError as exc:  # an optional suite's package (agentdojo) is missing
            raise EvalError(f"suite {name!r} cannot be generated here: {exc}") from None
    return cases


# --- the optional packages ---------------------------------------------------------


def check_eval_extras(suites: Sequence[str]) -> None:
    """The optional packages an evaluation of ``suites`` needs, checked before
    any model loads or any row is written: scipy (the ``eval`` extra: the
    report's paired tests, impl/eval/stats.py) always, and agentdojo when the
    ``agentdojo`` suite is asked for, by name or under ``all``. A missing one
    is an :class:`EvalError` naming the install command; nothing is changed."""
    missing = get_missing_module("scipy", "scipy.stats")
    if missing is not None:
        raise EvalError(f"unsee eval needs scipy for its report's statistics ({missing!r} cannot be imported): "
                        "pip install 'unsee[eval]'; nothing was run")
    if "agentdojo" in suites:
        from unsee.impl.eval.agentdojo import PACKAGE_VERSION

        missing = get_missing_module("agentdojo", "agentdojo.task_suite.load_suites")
        if missing is not None:
            others = ",".join(s for s in suites if s != "agentdojo") or "memory"
            raise EvalError(f"suite 'agentdojo' needs the optional package agentdojo=={PACKAGE_VERSION} "
                            f"({missing!r} cannot be imported): pip install 'unsee[test]' or "
                            f"pip install agentdojo=={PACKAGE_VERSION}; or leave the suite out "
                            f"(--suite {others}); nothing was run")


# --- rows on disk (impl/eval/rows.py reads and writes them) ----------------------------


def check_resumable(rows: Sequence[dict], config: EvalConfig, path: Path) -> None:
    """Rows from another configuration would mix two experiments in one report."""
    wanted = {"backend": config.backend, "model": config.model, "device": config.device, "dtype": config.dtype,
              "samples": config.samples,
              "temperature": config.temperature, "probe_tokens": config.max_new_tokens,
              "turn_tokens": config.turn_tokens}
    for number, row in enumerate(rows, start=1):
        for field in CONFIG_FIELDS:
            had = row.get(field, LEGACY_BACKEND) if field == "backend" else row.get(field, wanted[field])
            if had != wanted[field]:
                raise EvalError(f"{path}: row {number} was run with {field} {had!r}, this run asks for "
                                f"{wanted[field]!r}: use another --out folder or the same settings")


# --- one episode -------------------------------------------------------------------


def make_runtime(engine, case: EvalCase, progress=None) -> AgentRuntime:
    """The contaminated base state of a case: a tool runtime (impl/agent/tools.py)
    when every plan step names a default tool, else the plain runtime, whose
    plans stay pending calls."""
    from unsee.impl.agent.tools import ToolAgentRuntime

    # a suite may bring its own tools (EvalCase.get_tools, where the build has it)
    tools = get_case_tools(case)
    plans = [s for s in case.episode.steps if s.kind == "plan"]
    if plans and all(s.tool in tools for s in plans):
        return ToolAgentRuntime.from_episode(engine, case.episode, progress, tools=tools)
    return AgentRuntime.from_episode(engine, case.episode, progress)


def get_sink_map(case: EvalCase) -> dict[str, dict[str, str]]:
    """``{tool: {argument: sink class}}`` of a case: what B8/B9's policy reads."""
    if hasattr(case, "get_sink_map"):
        return case.get_sink_map()
    out: dict[str, dict[str, str]] = {}
    for sink in case.sinks:
        out.setdefault(sink.tool, {})[sink.arg] = sink.sink_class
    return out


def run_method(base: AgentRuntime, method: str, case: EvalCase):
    """``apply_method`` with the case's sink classes where this build's B8 reads them."""
    target = case.episode.target
    if "sinks" in inspect.signature(apply_method).parameters:
        return apply_method(base, method, target.source, target.value, sinks=get_sink_map(case))
    return apply_method(base, method, target.source, target.value)


def get_blocked_args(result) -> tuple[tuple[str, str], ...]:
    """What the IFC policy blocked: ``(plan, argument)`` pairs, or whole plans
    (``(plan, "*")``) from a build whose B8 blocks every tainted plan."""
    blocked = getattr(result, "blocked_args", None)
    if blocked is None:
        blocked = tuple((plan, "*") for plan in result.blocked_plans)
    return tuple(tuple(b) for b in blocked)


def evaluate_state(runtime: AgentRuntime, result, case: EvalCase, config: EvalConfig,
                   reference: dict | None, asked: dict | None = None) -> dict:
    """Every metric and audit of one post-method state (the row's body).
    ``asked``: the state's generations (:func:`ask_state`), when they are
    already known (a state with the same digest in this process)."""
    asked = ask_state(runtime, case, config) if asked is None else asked
    final_answer = asked["probes"]["task"]["answer"]
    blocked = get_blocked_args(result)
    actions = apply_sink_policy(get_actions(runtime, case), blocked)
    leaks = score_leaks(runtime, case, final_answer, actions)
    draws = asked["draws"]
    row: dict = {"final_answer": final_answer, "leak": leaks.to_json(), "probes": asked["probes"],
                 "leak5": {"draws": draws, "leaked": any(d["leaked"] for d in draws)},
                 "actions": [a.to_json() for a in actions], "blocked_args": [list(b) for b in blocked],
                 "utility": asked["utility"], "behavior": asked["behavior"],
                 "security": get_security(case, actions)}
    if reference is not None:
        ref_actions = [Action.from_json(a) for a in reference["actions"]]
        row["cad"] = compute_cad(actions, ref_actions)
        ref_draws = {d["seed"]: d["sha"] for d in reference["leak5"]["draws"]}
        matched = [d["sha"] == ref_draws.get(d["seed"]) for d in draws]
        row["agreement"] = {"matched": sum(matched), "draws": len(matched)}
        row["equals_reset"] = (result.digest == reference["digest"]
                               if reference.get("threads") == _threads() else None)
    return row


def get_security(case: EvalCase, actions: Sequence[Action]) -> bool | None:
    """AgentDojo's own verdict on the state's plan: the injection task's
    security check (True: the attacker's goal was reached) on the environment
    the plan's calls leave when run through AgentDojo's ``FunctionsRuntime``
    (:func:`~unsee.impl.eval.agentdojo.check_security`). The plan is what
    the post-method state would execute; blocked arguments (B8) were already
    removed. None outside the agentdojo suite and for a state with no plan."""
    if case.suite != "agentdojo" or not actions:
        return None
    from unsee.impl.eval.agentdojo import check_security

    return check_security(case, [(a.tool, dict(a.args)) for a in actions])


def add_security(rows: Iterable[dict], cases: Sequence[EvalCase]) -> int:
    """Fill ``security`` (:func:`get_security`) into rows written before it
    was recorded, from their actions; rows of cases not in ``cases`` are left
    as they are. Returns how many rows it filled."""
    by_id = {(c.suite, c.id): c for c in cases}
    filled = 0
    for row in rows:
        case = by_id.get((row["suite"], row["case"]))
        if "security" not in row and case is not None:
            row["security"] = get_security(case, [Action.from_json(a) for a in row["actions"]])
            filled += 1
    return filled


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def run_case(engine, case: EvalCase, config: EvalConfig, done: dict[str, dict] | None = None,
             progress=None) -> Iterator[dict]:
    """The rows of one case: every method of ``config`` not already in
    ``done`` (method -> row), each on a fork of the one base state."""
    done = dict(done or {})
    methods = [m for m in config.get_methods() if m not in done]
    if not methods:
        return
    if config.turn_tokens is not None:
        settings = attrs.evolve(case.episode.settings, max_new_tokens=config.turn_tokens)
        case = attrs.evolve(case, episode=attrs.evolve(case.episode, settings=settings))
    target = case.episode.target
    if target is None or not target.value:
        raise EvalError(f"case {case.suite}/{case.id}: the episode names no target with a value")
    base = make_runtime(engine, case, progress)
    carries = any(target.source in base.graph[b].source_ids for b in base.memory)
    reference = done.get(REFERENCE)
    asked_by_key: dict[str, tuple[str, dict]] = {}  # the state's ask key -> (method, its generations)
    samplers: dict[str, Asker] = {}  # the distributional audit's, by ask key (shared like the answers)
    try:
        yield from _run_methods(engine, base, case, config, methods, reference, carries, asked_by_key, samplers)
    finally:
        for asker in samplers.values():
            asker.close()


def _run_methods(engine, base: AgentRuntime, case: EvalCase, config: EvalConfig, methods: Sequence[str],
                 reference: dict | None, carries: bool, asked_by_key: dict, samplers: dict) -> Iterator[dict]:
    # a method whose run is another's, step for step (B9: B7's forget; B7-oracle with
    # no labelled step: B7 without drafts), takes that run where this episode has it
    twins = {get_equal_run(base, m) for m in methods} - {None} if config.share_runs else set()
    runs: dict[str, tuple[AgentRuntime, object]] = {}
    for method in methods:
        twin = get_equal_run(base, method) if config.share_runs else None
        if twin in runs:
            runtime, result = derive_method(method, *runs[twin], case.episode.target.source, get_sink_map(case))
        else:
            runtime, result, twin = *run_method(base, method, case), None
        if method in twins:
            runs[method] = (runtime.fork(), result)
        key = get_ask_key(runtime, case) if config.share_identical else None
        shared = asked_by_key.get(key) if key else None
        asked = shared[1] if shared else ask_state(runtime, case, config)
        if key:
            asked_by_key.setdefault(key, (method, asked))
        row = _row(case, method, result, config, carries, base)
        row["engine_options"] = get_engine_options(engine)
        row["asked_from"] = shared[0] if shared else None
        row["run_from"] = twin
        if method == REFERENCE:
            row |= evaluate_state(runtime, result, case, config, None, asked)
            reference = dict(row)
            row["cad"] = 0.0 if row["actions"] else None
            row["agreement"] = {"matched": len(row["leak5"]["draws"]), "draws": len(row["leak5"]["draws"])}
            row["equals_reset"] = True
        else:
            row |= evaluate_state(runtime, result, case, config, reference, asked)
        sampler = None
        if key and method in get_dist_methods():
            sampler = samplers.get(key) or samplers.setdefault(key, Asker(engine, runtime.lineage))
        row["dist"] = sample_distribution(runtime, case, config, method, get_task(case),
                                          tuple(get_case_tools(case)), sampler)
        del runtime
        engine.budget.enforce()
        yield row


def get_engine_options(engine) -> dict:
    """The loader options the engine's bits depend on, as a store records them
    (impl/store/backend.py): llama.cpp's threads, flash attention, context size
    and kernels (``UNSEE_LLAMA_KERNELS``); rows of other options are another experiment."""
    from unsee.impl.store.backend import get_engine_meta

    return json.loads(get_engine_meta(engine)["engine_options"])


def check_engine_options(rows: Sequence[dict], row: dict, path: Path) -> None:
    """An EvalError, before ``row`` is written, when the rows already in ``path``
    were made with other engine options (rows written before rows recorded
    them are not checked: they name none)."""
    mine = row.get("engine_options")
    for number, other in enumerate(rows, start=1):
        had = other.get("engine_options")
        if mine is not None and had is not None and had != mine:
            raise EvalError(f"{path}: row {number} was run with engine options {had}, this run's engine has "
                            f"{mine} (llama.cpp's kernels: UNSEE_LLAMA_KERNELS): use another --out folder "
                            "or the same settings; the rows so far are kept")


def _row(case: EvalCase, method: str, result, config: EvalConfig, carries: bool, base: AgentRuntime) -> dict:
    report = result.report
    return {"row_version": ROW_VERSION, "suite": case.suite, "case": case.id, "method": method,
            "paper_name": PAPER_NAMES.get(method, method), "backend": config.backend, "model": config.model,
            "device": config.device,
            "dtype": config.dtype, "threads": _threads(), "samples": config.samples,
            "temperature": config.temperature, "probe_tokens": config.max_new_tokens,
            "turn_tokens": config.turn_tokens, "T": base.t,
            "tau": report.tau if report is not None else base.graph.first_entry(case.episode.target.source),
            "memory_carries_target": carries, "digest": result.digest, "build": get_build(),
            "efficiency": get_efficiency(result)}


# --- the whole run -------------------------------------------------------------------


def run_evaluation(cases: Sequence[EvalCase], config: EvalConfig, out: str | Path,
                   progress: bool = True, engine=None) -> list[dict]:
    """Run every missing (case, method) pair, appending rows to
    ``out/rows.jsonl`` as they finish; returns all rows (old and new).

    ``engine``: an already loaded KVEngine (tests; one worker only); else the
    model of ``config`` is loaded once per process."""
    get_build()  # read now: the rows name the code this run loaded, not where the checkout is later
    out = check_out_dir(Path(out))
    path = out / ROWS_FILE
    rows = read_rows(path)
    check_resumable(rows, config, path)
    ids = [(c.suite, c.id) for c in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise EvalError(f"duplicate case ids {duplicates}")
    done: dict[tuple[str, str], dict[str, dict]] = {}
    for row in rows:
        done.setdefault((row["suite"], row["case"]), {})[row["method"]] = row
    methods = config.get_methods()
    todo = interleave_suites([c for c in cases if set(methods) - set(done.get((c.suite, c.id), {}))])
    total = sum(len(set(methods) - set(done.get((c.suite, c.id), {}))) for c in todo)
    bar = open_bar("unsee eval", total, unit="row", dynamic_ncols=True) if progress else None
    try:
        with path.open("a", encoding="utf-8") as sink:
            def emit(row: dict) -> None:
                check_engine_options(rows, row, path)
                sink.write(json.dumps(row, default=str) + "\n")
                sink.flush()
                rows.append(row)
                if bar is not None:
                    bar.set_postfix_str(f"{row['suite']}/{row['case']} {row['method']}", refresh=False)
                    bar.update(1)

            if config.workers > 1 and engine is None and len(todo) > 1:
                _run_workers(todo, config, done, emit)
            elif todo:  # a finished run re-run (to re-render its report) loads no model
                if engine is None:
                    engine = load_engine(config)
                for case in todo:
                    for row in run_case(engine, case, config, done.get((case.suite, case.id))):
                        emit(row)
    finally:
        if bar is not None:
            bar.close()
    if add_security(rows, cases):  # rows of an older build: keep their verdicts with them
        rewrite_rows(rows, path)
    return rows


def load_engine(config: EvalConfig):
    from unsee.impl.engines.registry import load_engine

    options = {"device": config.device, "dtype": config.dtype} if config.backend != "llamacpp" else {}
    options |= dict(config.engine_options)
    return load_engine(config.model, config.backend, kv_budget=config.kv_budget, **options)


def _worker(index: int, cases: list[EvalCase], config: EvalConfig, done: dict, queue) -> None:
    """Worker ``index``: one torch thread, the model loaded once (messages: impl/eval/workers.py)."""
    import torch

    torch.set_num_threads(1)
    get_build()  # read at the start, as the parent does
    try:
        engine = load_engine(config)
        for case in cases:
            for row in run_case(engine, case, config, done.get((case.suite, case.id))):
                queue.put(("row", index, row))
        queue.put(("done", index, None))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent, which keeps the finished rows
        queue.put(("error", index, f"{type(exc).__name__}: {exc}"))


def _run_workers(cases: Sequence[EvalCase], config: EvalConfig, done: dict, emit: Callable[[dict], None]) -> None:
    """``config.workers`` processes, the cases dealt round robin; the parent
    alone writes rows, so a file never holds a half-written line of two. A
    worker that raises or is killed ends the run with an error naming it."""
    import multiprocessing

    from unsee.impl.eval.workers import collect, join_all, raise_errors, run_watched, stop_all, stopping_on_signals

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    k = min(config.workers, len(cases))
    workers = [context.Process(target=run_watched, args=(_worker, i, list(cases[i::k]), config, done, queue),
                               daemon=True) for i in range(k)]
    with stopping_on_signals():
        for w in workers:
            w.start()
        try:
            errors = collect(queue, workers, emit)
        except BaseException:  # interrupted or stopped: the workers' cases are abandoned, not awaited
            stop_all(workers)
            raise
        join_all(workers)
    raise_errors(errors, ROWS_FILE)


__all__ = [
    "DEFAULT_TASK",
    "LEGACY_BACKEND",
    "ROWS_FILE",
    "UNSUPPORTED_METHODS",
    "EvalConfig",
    "EvalError",
    "ask_state",
    "check_eval_extras",
    "check_out_dir",
    "draw_seed",
    "evaluate_state",
    "generate_cases",
    "get_suite_names",
    "get_task",
    "make_runtime",
    "pick_option",
    "read_rows",
    "run_case",
    "run_evaluation",
]
