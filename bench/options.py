"""The options the bench scripts share, each declared here once with one default.

A script builds its parser with :func:`get_parser` and adds the shared
options it takes (``add_model(parser)``, ...), then its own. The defaults are
the CLI's where the CLI has the option (``unsee run --model``, ``--engine``,
``--device``, ``--dtype``), so ``python -m unsee.bench.X`` and ``unsee`` load
the same model when neither is told which. A documented command that measured
another model names it (``--model tiny``, ``--model qwen2.5-1.5b --engine
llamacpp``).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from unsee.impl.cli.options import DEFAULT_MODEL
from unsee.impl.engines.registry import BACKENDS, DEFAULT_BACKEND

#: the one-word engine name (impl/engines/registry.py) a script that compares
#: engines by name starts from: llama.cpp over SmolLM2's GGUF
DEFAULT_ENGINE = "llamacpp"
#: the same for a script that measures vLLM alone: the tiny model on vLLM
DEFAULT_VLLM_ENGINE = "vllm-tiny"
DEFAULT_DEVICE = "cpu"
DEFAULT_DTYPE = "float32"
#: repeats of every measurement; a report takes the median (p50) of same-round figures
DEFAULT_ROUNDS = 3
DEFAULT_THREADS = 1
#: a figure's label line in docs/*.md, which a bench that writes markdown writes as it is
#: (tests/test_docs.py checks every figure has one): build, attention, dtype, CPU and command
FIGURE_LABEL = re.compile(r"> build (`[0-9a-f]{7,40}`|not recorded)[^·]* · attention [^·]+ · dtype [^·]+ · CPU [^·]+"
                          r" · command `[^`]*(python|pytest|make|unsee )[^`]*`")


def get_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The parser of ``python -m unsee.bench.<name>``, described by the first line of its docstring."""
    return argparse.ArgumentParser(prog=f"python -m unsee.bench.{name}", description=doc.strip().splitlines()[0])


def add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="a catalogue name (smollm2, tiny, qwen2.5-1.5b, gemma3-270m: docs/models.md) or a "
                             f"local checkpoint folder / .gguf file; default: {DEFAULT_MODEL}")


def add_backend(parser: argparse.ArgumentParser, flag: str = "--engine") -> None:
    """The backend that runs ``--model`` (the CLI's ``--engine``; some scripts spell it ``--backend``)."""
    parser.add_argument(flag, default=DEFAULT_BACKEND, choices=BACKENDS,
                        help=f"the backend that runs --model; default: {DEFAULT_BACKEND}")


def add_engine(parser: argparse.ArgumentParser, choices: tuple[str, ...] | None = None) -> None:
    """``--engine`` as a one-word engine name (model and backend in one word)."""
    parser.add_argument("--engine", default=DEFAULT_ENGINE, choices=choices,
                        help=f"a one-word engine name (impl/engines/registry.py); default: {DEFAULT_ENGINE}")


def add_vllm_engine(parser: argparse.ArgumentParser, choices: tuple[str, ...] | None = None) -> None:
    parser.add_argument("--engine", default=DEFAULT_VLLM_ENGINE, choices=choices,
                        help=f"a one-word vLLM engine name (impl/engines/registry.py); default: {DEFAULT_VLLM_ENGINE}")


def add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=DEFAULT_DEVICE, help=f"cpu or cuda; default: {DEFAULT_DEVICE}")


def add_dtype(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default=DEFAULT_DTYPE,
                        help=f"float32, bfloat16 or float16; default: {DEFAULT_DTYPE}")


def add_rounds(parser: argparse.ArgumentParser, help: str = "repeats of every measurement") -> None:
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help=f"{help}; default: {DEFAULT_ROUNDS}")


def add_threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                        help=f"CPU threads of the model's forwards; default: {DEFAULT_THREADS}")


def add_out(parser: argparse.ArgumentParser, default: str | None = None, help: str | None = None) -> None:
    """``--out``: where the script writes its figures. The default is the
    script's own artifact (a file or folder it names), or None: print only."""
    parser.add_argument("--out", type=Path, default=None if default is None else Path(default),
                        help=help or ("where the figures go" + (f"; default: {default}" if default else
                                                                 "; default: print them only")))


def write_rows(out: str | None, rows: list) -> None:
    """``rows`` as indented JSON at ``out`` (its folder made), where ``--out`` named one."""
    if out:
        import json
        from pathlib import Path

        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(rows, indent=1))


__all__ = ["DEFAULT_DEVICE", "DEFAULT_DTYPE", "DEFAULT_ENGINE", "DEFAULT_ROUNDS", "DEFAULT_THREADS",
           "DEFAULT_VLLM_ENGINE", "add_backend", "add_device", "add_dtype", "add_engine", "add_model", "add_out",
           "add_rounds", "add_threads", "add_vllm_engine", "get_parser", "write_rows"]
