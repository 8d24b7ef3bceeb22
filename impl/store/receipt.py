"""Erasure receipts: what a committed forget claims, in a form a third party
can check with ``unsee verify`` (docs/persistence.md, "Receipts").

A receipt is one small JSON document per committed forget. It names the
session and generation, the forgotten source ids (never values), the hash of
the sanitised observation log (the counterfactual stream ``o^-z_1..o^-z_T``),
the model's identity and weights hash, the environment the state digest
depends on (engine, device, dtype, torch threads, library versions, CPU
features), the forget's tau, boundary and invocations, the resulting state
digest and a hash of every generated token. Its last field,
``receipt_sha256``, hashes all the others in canonical JSON, and the receipt
is stored in that canonical form, so one changed byte anywhere is detected.

The hash is an integrity check, not a signature: anyone can write a
consistent receipt. What makes a receipt worth something is that
``unsee verify`` recomputes its claims from the stored log (see
``impl/store/verify.py``).
"""

from __future__ import annotations

import hashlib
import json
import platform
import sqlite3
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

RECEIPT_FORMAT = "unsee.receipt"
RECEIPT_VERSION = 1

#: Environment facts a state digest depends on: where they differ from the
#: receipt's and the digest does not reproduce, verify says "cannot verify
#: here" instead of "failed". (``python`` and ``sqlite`` are recorded, not
#: compared: neither enters the digest.)
DIGEST_FACTS = ("engine", "device", "dtype", "threads", "torch", "transformers", "machine", "cpu_capability",
                "cpu_flags", "flash_attn", "n_ctx", "exact_kernels", "row_order", "llama_cpp_python", "attn", "vllm", "block_size",
                "tensor_parallel_size", "pipeline_parallel_size")

#: The CPU flags that select torch's CPU kernels (and so the bits of a
#: float reduction); the full /proc/cpuinfo list would differ between
#: machines for reasons that never reach the digest.
#: Block types the model writes (as :meth:`AgentRuntime.generated_tokens` selects them).
GENERATED_TYPES = ("answer", "summary", "plan", "memory_write")

KERNEL_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "amx_tile", "amx_bf16", "asimd", "sve")


class ReceiptError(ValueError):
    """A receipt that is not a well-formed, self-consistent receipt (the
    message says which check failed)."""


# --- the facts a receipt records ----------------------------------------------------------


_WEIGHTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def weights_hash(lm) -> str:
    """sha256 naming a loaded model's weights: of its file (a GGUF), of every
    file of its checkpoint folder (relative path and bytes, sorted), or, for a
    model built in memory (``tiny``), of its state dict (name, dtype, shape and
    bytes of every tensor, sorted by name). Computed once per loaded model."""
    if lm in _WEIGHTS:
        return _WEIGHTS[lm]
    h = hashlib.sha256()
    source = Path(lm.source) if lm.source else None
    if source is not None and source.is_file():
        h.update(b"file\0")
        _hash_file(h, source)
    elif source is not None and source.is_dir():
        h.update(b"folder\0")
        for p in sorted(q for q in source.rglob("*") if q.is_file()):
            h.update(p.relative_to(source).as_posix().encode() + b"\0")
            _hash_file(h, p)
    else:
        h.update(b"state_dict\0")
        for name, tensor in sorted(lm.model.state_dict().items()):
            t = tensor.detach().to("cpu").contiguous().reshape(-1)
            h.update(f"{name}\0{t.dtype}\0{tuple(tensor.shape)}\0".encode())
            h.update(t.view(_uint8()).numpy().tobytes())
    _WEIGHTS[lm] = h.hexdigest()
    return _WEIGHTS[lm]


def _uint8():
    import torch

    return torch.uint8


def _hash_file(h, path: Path) -> None:
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)


def cpu_features() -> dict:
    """The machine, torch's CPU kernel level and the kernel-selecting flags."""
    import torch

    flags: list[str] = []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                present = set(line.split(":", 1)[1].split())
                flags = [f for f in KERNEL_FLAGS if f in present]
                break
    except OSError:  # not Linux: the capability below still names the kernels
        pass
    capability = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "unknown"
    return {"machine": platform.machine(), "cpu_capability": capability, "cpu_flags": flags}


def environment(engine) -> dict:
    """Engine, device, dtype, torch threads, library versions and CPU features
    of this process: what the state digest of ``engine`` depends on (for a
    llama.cpp engine, :func:`llamacpp_environment`)."""
    import torch

    lm = engine.lm
    if type(lm).__name__ == "LlamaCppModel":
        return llamacpp_environment(engine)
    if type(lm).__name__ == "VllmModel":
        return vllm_environment(engine)
    from unsee.impl.engines.hf import adapter

    return {"engine": f"{type(engine).__module__}.{type(engine).__qualname__}", "device": lm.device,
            "dtype": lm.dtype, "attn": getattr(lm, "attn", None), "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": adapter.TRANSFORMERS_VERSION, "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version, **cpu_features()}


def llamacpp_environment(engine) -> dict:
    """What a llama.cpp engine's state digest depends on: the engine, its
    thread count (with ``thread_invariant``: whether the bits are one thread's whatever the
    count, as they are where decode steps are fed as two rows; then a count that differs is
    no reason a digest would not reproduce), attention kernel (flash attention or not), matmul kernels
    (``exact_kernels``: the file's layout, or repacked; ``row_order``: repacked Q4_K in decode's order) and context size,
    the llama-cpp-python build and the CPU. Neither torch nor transformers
    computes anything there, so neither is recorded."""
    lm = engine.lm
    return {"engine": f"{type(engine).__module__}.{type(engine).__qualname__}", "device": lm.device,
            "dtype": lm.dtype, "threads": lm.threads, "thread_invariant": bool(getattr(lm, "thread_invariant", False)),
            "flash_attn": lm.flash_attn, "n_ctx": lm.n_ctx,
            "exact_kernels": lm.exact_kernels, "row_order": bool(getattr(lm, "row_order", False)),
            "llama_cpp_python": lm.info.get("llama_cpp_python", "?"),
            "python": platform.python_version(), "sqlite": sqlite3.sqlite_version, **cpu_features()}


def vllm_environment(engine) -> dict:
    """What a vLLM engine's tokens depend on: the engine, dtype, the prefix
    cache's block size, the parallel sizes (the cold run's reductions), the
    vLLM, torch and transformers builds and the CPU (vLLM's digest is of token
    ids: these facts name what could move a near-tie the guard recomputes)."""
    import torch

    lm = engine.lm
    return {"engine": f"{type(engine).__module__}.{type(engine).__qualname__}", "device": lm.device,
            "dtype": lm.dtype, "block_size": lm.block_size, "tensor_parallel_size": lm.tensor_parallel_size,
            "pipeline_parallel_size": lm.pipeline_parallel_size, "vllm": lm.info.get("vllm", "?"),
            "torch": torch.__version__, "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
            **cpu_features()}


def environment_differences(recorded: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    """The digest-relevant facts that differ, as ``'name: receipt X, here Y'`` (the thread
    count not, where both sides are thread-invariant)."""
    invariant = bool(recorded.get("thread_invariant")) and bool(here.get("thread_invariant"))
    return [f"{k}: receipt {recorded.get(k)!r}, here {here.get(k)!r}" for k in DIGEST_FACTS
            if recorded.get(k) != here.get(k) and not (invariant and k == "threads")]


def log_hash(steps: Sequence[Mapping[str, Any]]) -> str:
    """sha256 of an observation log (steps as in the session record: id, kind,
    tool, items with source and text) in canonical JSON."""
    return _sha256([{"id": s["id"], "kind": s["kind"], "tool": s["tool"],
                     "items": [{"source": i["source"], "text": i["text"]} for i in s["items"]]} for s in steps])


def generated_hash(generated: Sequence[tuple[str, Sequence[int]]]) -> str:
    """sha256 of every model-written block's id and token ids, in creation order."""
    return _sha256([[block_id, list(tokens)] for block_id, tokens in generated])


def generated_of(record: Mapping[str, Any], upto: int | None = None) -> list[tuple[str, list[int]]]:
    """The model-written blocks of a session record (turn <= ``upto``), as
    :meth:`AgentRuntime.generated_tokens` lists them."""
    return [(b["id"], list(b["tokens"])) for b in record["blocks"]
            if b["type"] in GENERATED_TYPES and (upto is None or b["turn"] <= upto)]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _sha256(value: Any) -> str:
    return hashlib.sha256(_canonical(value).encode("utf-8", "surrogatepass")).hexdigest()


# --- writing and reading a receipt --------------------------------------------------------


def build_receipt(*, session_id: str, generation: int, record: Mapping[str, Any], digest: str, engine,
                  report, forgotten_now: Sequence[str], committed_at: str) -> str:
    """The canonical text of the receipt for a forget committed as
    ``generation`` (``record``: the session record that commit stores)."""
    body = {
        "format": RECEIPT_FORMAT, "version": RECEIPT_VERSION,
        "session_id": session_id, "generation": generation, "committed_at": committed_at,
        "method": report.method, "forgotten": list(forgotten_now), "all_forgotten": list(record["forgotten"]),
        "log": {"steps": len(record["steps"]), "sha256": log_hash(record["steps"])},
        "model": {"name": str(engine.lm.name), "weights_sha256": weights_hash(engine.lm)},
        "environment": environment(engine),
        "tau": report.tau, "boundary": report.boundary, "invocations": report.invocations,
        "length": report.length, "digest": digest,
        # what equal digests mean on this engine (Determinism.digest: "kv" or "tokens")
        "digest_means": engine.determinism.digest,
        # the guard bound the replay's drafts ran under, and where it came from (engines/bounds.py)
        "draft_bound": {"bound": report.drafts.bound, "source": report.drafts.bound_source,
                        "cpu_isa": report.drafts.cpu_isa},
        "generated": {"blocks": len(generated_of(record)), "sha256": generated_hash(generated_of(record))},
    }
    return _canonical(body | {"receipt_sha256": _sha256(body)})


def parse_receipt(text: str | bytes) -> dict:
    """A receipt's fields, after checking that it is canonical JSON of the
    current format whose ``receipt_sha256`` matches; :class:`ReceiptError`
    names the failed check otherwise."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ReceiptError(f"receipt is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ReceiptError(f"receipt is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise ReceiptError("receipt is not a JSON object")
    if body.get("format") != RECEIPT_FORMAT or body.get("version") != RECEIPT_VERSION:
        raise ReceiptError(f"not an {RECEIPT_FORMAT} version {RECEIPT_VERSION} document "
                           f"(format {body.get('format')!r}, version {body.get('version')!r})")
    claimed = body.pop("receipt_sha256", None)
    if claimed != _sha256(body):
        raise ReceiptError(f"receipt hash check failed: receipt_sha256 is {claimed!r}, its content hashes to "
                           f"{_sha256(body)!r} (the receipt was changed)")
    body["receipt_sha256"] = claimed
    if text != _canonical(body):  # e.g. a changed byte of insignificant whitespace, or a reordered key
        raise ReceiptError("receipt is not in canonical form (a byte outside its values was changed)")
    _check_shape(body)
    return body


_SHAPE = {"session_id": str, "generation": int, "committed_at": str, "method": str, "forgotten": list,
          "all_forgotten": list, "log": dict, "model": dict, "environment": dict, "tau": int, "boundary": int,
          "invocations": int, "length": int, "digest": str, "generated": dict}


def _check_shape(body: dict) -> None:
    for key, kind in _SHAPE.items():
        if not isinstance(body.get(key), kind) or isinstance(body.get(key), bool):
            raise ReceiptError(f"receipt field {key!r} is missing or not a {kind.__name__}")
    if not all(isinstance(s, str) for s in body["forgotten"] + body["all_forgotten"]):
        raise ReceiptError("receipt source ids must be strings")


def receipt_summary(body: Mapping[str, Any]) -> str:
    return (f"generation {body['generation']}: {body['method']} of {', '.join(map(repr, body['forgotten']))} "
            f"at tau {body['tau']}, digest {body['digest'][:16]}...")


__all__ = ["DIGEST_FACTS", "RECEIPT_FORMAT", "RECEIPT_VERSION", "ReceiptError", "build_receipt", "cpu_features",
           "environment", "environment_differences", "generated_hash", "generated_of", "llamacpp_environment",
           "log_hash", "parse_receipt", "receipt_summary", "vllm_environment", "weights_hash"]
