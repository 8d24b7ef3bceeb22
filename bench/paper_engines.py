"""The engines of one bench/paper.py run (``--engines``): each name (a backend
or a one-word engine name) as ``(backend, model, options)``, all loaded
before any measurement."""

from __future__ import annotations

from unsee.impl.cli.options import check_vllm_scale_out
from unsee.impl.engines import registry
from unsee.impl.engines.protocol import Engine

#: vLLM's scale-out options (``--tensor-parallel-size``, ``--distributed-executor-backend``),
#: passed to every vLLM engine of ``--engines`` as vLLM's own CLI takes them.
VLLM_OPTIONS = ("tensor_parallel_size", "distributed_executor_backend")


def get_engine_spec(name: str, model: str, device: str, dtype: str,
                    vllm_options: dict | None = None) -> tuple[str, str, dict]:
    """``(backend, model, options)`` that ``name`` (a backend or a one-word
    engine name) stands for: ``--device``/``--dtype`` go to transformers
    and vLLM (whose restore bound is looked up by them), ``vllm_options`` to vLLM; a ValueError naming both lists otherwise."""
    if name in registry.BACKENDS:
        backend, named_model = name, model
    elif name in registry.ENGINE_NAMES:
        backend, named_model = registry.parse_engine_name(name)
    else:
        raise ValueError(f"engine {name!r} is neither a backend {registry.BACKENDS} nor an engine name "
                         f"{tuple(registry.ENGINE_NAMES)}")
    options = {"transformers": {"device": device, "dtype": dtype},
               "vllm": {"device": device, "dtype": dtype, **(vllm_options or {})}}
    return backend, named_model, options.get(backend, {})


def parse_engines(text: str) -> list[str]:
    """The comma-separated names of ``--engines``, each once, in order; a
    ValueError for an empty list."""
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise ValueError(f"--engines {text!r}: expected one or more comma-separated engine names")
    return names


def get_engine_specs(names: list[str], args) -> dict[str, tuple[str, str, dict]]:
    """Every name's :func:`get_engine_spec`; vLLM's scale-out options given
    with no vLLM engine among ``names`` are bad input (a ValueError)."""
    vllm_options = {k: getattr(args, k) for k in VLLM_OPTIONS if getattr(args, k, None) is not None}
    check_vllm_scale_out(vllm_options)
    specs = {name: get_engine_spec(name, args.model, args.device, args.dtype, vllm_options) for name in names}
    if vllm_options and not any(backend == "vllm" for backend, _, _ in specs.values()):
        raise ValueError(f"--{next(iter(vllm_options)).replace('_', '-')} is a vLLM option; no engine of "
                         f"--engines {','.join(names)} runs on vLLM")
    return specs


def load_engines(specs: dict[str, tuple[str, str, dict]]) -> dict[str, Engine]:
    """Every engine of ``specs``, loaded now: a missing extra (the backend's
    ImportError, with its install hint) fails here, before any measurement."""
    return {name: registry.load_engine(m, backend, **options) for name, (backend, m, options) in specs.items()}
