"""Where a configuration's draft bound comes from: a shipped measured row, a calibrated file, or nowhere.

Draft verification (impl/agent/drafts.py) accepts a decision taken on prefill logits only
when its margin clears twice a ceiling on |logit_prefill - logit_decode| for the model,
device, dtype and attention that run it. That ceiling comes from, in order:

1. a calibrated file that ``unsee calibrate`` wrote on this machine (below): measured
   here, it wins over a shipped row measured elsewhere;
2. a shipped row of the configuration's attention, measured by
   ``python -m unsee.bench.discrepancy --attn A``: :data:`~unsee.impl.engines.decoding.DRAFT_BOUNDS`
   for ``eager`` and ``unsee_eager`` (eager's bits), ``SDPA_DRAFT_BOUNDS`` for ``sdpa``
   (:data:`~unsee.impl.engines.decoding.DRAFT_BOUNDS_BY_ATTN`);
   or a catalogue model's shipped bound, where this CPU has the instruction sets it was
   measured under (:func:`~unsee.impl.engines.catalog.get_shipped_bound`).

The calibrated file lies beside the model in the cache folder
   (``$UNSEE_CACHE`` or ``~/.cache/unsee``, under ``bounds/``), named by the model's
   identity, the device kind, the dtype, the attention, the torch and transformers
   versions and the CPU's instruction set (a new kernel library, or another code path,
   re-rounds, so it needs its own calibration);
3. none: drafts and guesses stay off for that configuration.

:func:`get_bound` returns ``(bound, source)``, ``source`` saying which in words.
A calibrated file is JSON: ``bound``, ``measured_max``, ``safety_factor``, ``positions``,
the configuration and the versions, and how it was measured.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from unsee.impl.engines.catalog import get_shipped_bound
from unsee.impl.engines.decoding import DRAFT_BOUNDS_BY_ATTN, get_draft_bound_row
from unsee.impl.engines.files import default_cache_dir, get_cpu_isa

#: The attention implementations with shipped rows (each its own table: decoding.DRAFT_BOUNDS_BY_ATTN).
SHIPPED_ATTN = tuple(DRAFT_BOUNDS_BY_ATTN)
#: A calibrated bound is at least this many times the measured maximum (as the shipped rows are).
SAFETY_FACTOR = 10
BOUNDS_FOLDER = "bounds"
BOUND_FORMAT = "unsee.draft-bound"


@dataclass(frozen=True)
class BoundKey:
    """What a calibrated bound is valid for: the model (``identity``: its name, or its
    file's path, size and mtime), device kind, dtype, attention, kernel libraries and,
    on the CPU, the instruction set it was measured on (``files.get_cpu_isa``)."""

    identity: str
    device: str
    dtype: str
    attn: str
    torch: str
    transformers: str
    cpu: str = ""

    @property
    def file_name(self) -> str:
        raw = f"{self.identity}|{self.device}|{self.dtype}|{self.attn}|{self.torch}|{self.transformers}|{self.cpu}"
        stem = Path(self.identity).name.replace(os.sep, "_")[:40] or "model"
        return f"{stem}-{self.device}-{self.dtype}-{self.attn}-{hashlib.sha256(raw.encode()).hexdigest()[:12]}.json"


def get_device_kind(device: str) -> str:
    return "cuda" if device.startswith("cuda") else device


def get_model_identity(name: str, source: str) -> str:
    """A model's identity for its bound: the built-in name, or its weights' path with the
    size and mtime of the file (of ``config.json`` and the weights, for a folder)."""
    if not source:
        return name
    path = Path(source)
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.suffix in (".json", ".safetensors",
                                                                                            ".bin", ".gguf"))
    stats = ";".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    return f"{name}|{path.resolve()}|{stats}"


def get_bound_path(key: BoundKey, cache_dir: str | os.PathLike | None = None) -> Path:
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / BOUNDS_FOLDER / key.file_name


def compute_bound(measured_max: float, floor: float = 0.0) -> float:
    """The bound of a measured maximum: ``SAFETY_FACTOR`` times the larger of it and
    ``floor`` (the smallest discrepancy the dtype can show), rounded up to a 1-2-5 step."""
    need = SAFETY_FACTOR * max(measured_max, floor)
    if not need > 0 or not math.isfinite(need):
        raise ValueError(f"compute_bound: measured_max={measured_max!r}, floor={floor!r} give no positive bound")
    exponent = math.floor(math.log10(need))
    for step in (1, 2, 5, 10):
        bound = step * 10.0 ** exponent
        if bound >= need * (1 - 1e-12):
            return float(f"{bound:.3g}")
    raise AssertionError("unreachable: 10 * 10**e >= need")


def write_calibration(key: BoundKey, record: dict, cache_dir: str | os.PathLike | None = None) -> Path:
    """Write ``record`` (with ``bound``) for ``key`` atomically; its path."""
    if not (isinstance(record.get("bound"), float) and record["bound"] > 0):
        raise ValueError(f"write_calibration: bound={record.get('bound')!r} is not a positive float")
    path = get_bound_path(key, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"format": BOUND_FORMAT, "key": key.__dict__, **record}
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".tmp-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(body, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def read_calibration(key: BoundKey, cache_dir: str | os.PathLike | None = None) -> tuple[float, Path] | None:
    """The calibrated bound of ``key`` and its file, or None where there is none. A file
    that is not a calibration of this key is a ValueError naming it (never a silent bound)."""
    path = get_bound_path(key, cache_dir)
    if not path.is_file():
        return None
    try:
        body = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not a calibrated bound ({exc}); delete it or run `unsee calibrate` again") from None
    bound = body.get("bound") if isinstance(body, dict) else None
    if body.get("format") != BOUND_FORMAT or body.get("key") != key.__dict__ or not (
            isinstance(bound, float) and bound > 0):
        raise ValueError(f"{path}: not a calibrated bound of {key}; delete it or run `unsee calibrate` again")
    return bound, path


def get_bound(key: BoundKey, name: str, cache_dir: str | os.PathLike | None = None) -> tuple[float | None, str]:
    """``(bound, source)`` of a configuration (module docstring): a bound calibrated on
    this machine (its key names this CPU's instruction set and these libraries), which
    wins over a shipped row, measured on another machine (a shipped bound that does not
    hold on this CPU is replaced by running ``unsee calibrate``); or ``(None, "none ...")``."""
    found = read_calibration(key, cache_dir)
    if found is not None:
        return found[0], f"calibrated: {found[1]}"  # on this machine: the key names its CPU and libraries
    shipped = get_draft_bound_row(name, key.device, key.dtype, key.attn)
    if shipped is not None:
        return shipped[0], f"measured: {shipped[1]} (bench/discrepancy.py; shipped, measured on another machine)"
    shipped = get_shipped_bound(name, key.device, key.dtype, key.attn)  # a catalogue model's (catalog.py)
    if shipped is not None:  # with no bound where this CPU lacks the instruction sets it was measured under
        return shipped
    return None, (f"none: no measured bound for {name} on {key.device} {key.dtype} {key.attn} "
                  f"(`unsee calibrate` measures one)")


def get_key_of(lm) -> BoundKey:
    """The :class:`BoundKey` of a loaded transformers model (hf/models.py's LoadedModel)."""
    device = get_device_kind(lm.device)
    return BoundKey(get_model_identity(lm.name, lm.source), device, lm.dtype,
                    getattr(lm, "attn", "unsee_eager"), lm.info.get("torch", "?"), lm.info.get("transformers", "?"),
                    get_cpu_isa() if device == "cpu" else "")


def get_bound_of(lm) -> tuple[float | None, str]:
    """``(bound, source)`` of a loaded transformers model, from its cache folder."""
    return get_bound(get_key_of(lm), lm.name, lm.info.get("cache_dir"))


__all__ = ["BOUNDS_FOLDER", "BOUND_FORMAT", "SAFETY_FACTOR", "SHIPPED_ATTN", "BoundKey", "compute_bound",
           "get_bound", "get_bound_of", "get_bound_path", "get_key_of", "get_model_identity", "read_calibration",
           "write_calibration"]
