"""Whether llama.cpp's decode equals its prefill, bit for bit, for one model
file and configuration: measured once, cached, and turned into the drafts'
guard bound.

Drafts, probes and context guesses (impl/agent/drafts.py) decide tokens on
logits of a multi-token forward, where the reference decides on one-token
decode steps. On transformers the two differ in the last bits, so a
decision must beat its runner-up by twice a measured bound. llama.cpp's CPU
kernels compute each row of a quantised matmul the same way whatever the
batch, and for SmolLM2's Q4_1 file prefill and decode logits were bitwise
equal on every comparison measured (bench/llamacpp_bitwise.py); for f32
weights they are not (another matmul path serves batches).

So the engine measures it per file, thread count, flash-attention setting
and llama-cpp-python version (:func:`get_decode_facts`): greedy-decode
:data:`PROBE_DECODE` tokens one step at a time after a fixed pseudo-random
prompt, then feed the same tokens again as one forward and as forwards of
:data:`PROBE_SPLIT`, and compare every logit and the KV bytes. Equal
everywhere: the bound is 0.0 (a decision needs a margin above 0, so an exact
tie still falls back: the guard stays as a safety net). Any difference:
None, drafts off. The result is cached in ``llamacpp-facts.json`` under the
cache dir, keyed by the file's path, size and mtime and the settings.
"""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from unsee.impl.engines.decoding import get_scores, pick
from unsee.impl.engines.files import default_cache_dir

#: the probe: prompt length, tokens decoded, and the chunk size of the split feed
PROBE_PROMPT = 24
PROBE_DECODE = 32
PROBE_SPLIT = 8
#: bump when the measurement changes (old cache entries are then ignored)
FACTS_VERSION = "v1"


@dataclass(frozen=True)
class DecodeFacts:
    """What one measurement found: whether decode == prefill bitwise (logits
    at every position and the KV), the largest logit difference, and how many
    positions were compared."""

    decode_is_prefill: bool
    max_abs_diff: float
    positions: int

    def get_bound(self) -> float | None:
        """The drafts' guard bound these facts allow: 0.0, or None (drafts off)."""
        return 0.0 if self.decode_is_prefill else None

    def describe(self, lm) -> str:
        """Where the bound came from, in words (the forget report's draft reason)."""
        where = (f"llama.cpp {os.path.basename(lm.source)}, {lm.threads} thread(s), flash attention "
                 f"{'on' if lm.flash_attn else 'off'}")
        if self.decode_is_prefill:
            return (f"measured at load: decode == prefill bitwise ({where}; logits at {self.positions} positions "
                    "and the KV): bound 0, an exact tie still falls back")
        return (f"measured at load: decode != prefill ({where}; max |logit difference| {self.max_abs_diff:.3g} "
                f"over {self.positions} positions): drafts off")


def forward(lc, ctx, batch, ids: list[int], start: int, all_logits: bool, vocab: int) -> np.ndarray:
    """One ``llama_decode`` of ``ids`` at positions start.. on sequence 0: the
    logits after the last token (vocab,), or after every token (n, vocab), float32 copies."""
    n = len(ids)
    for i, tok in enumerate(ids):
        batch.token[i] = tok
        batch.pos[i] = start + i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = int(all_logits)
    batch.logits[n - 1] = 1
    batch.n_tokens = n
    rc = lc.llama_decode(ctx, batch)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc} for {n} tokens at position {start}")
    rows = range(n) if all_logits else (n - 1,)
    out = np.stack([np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), shape=(vocab,)) for i in rows])
    return out.copy() if all_logits else out[0].copy()


def read_state(lc, ctx) -> bytes:
    """Sequence 0's state blob (its KV, cell by cell)."""
    size = lc.llama_state_seq_get_size(ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    got = lc.llama_state_seq_get_data(ctx, buf, size, 0)
    if got != size:
        raise RuntimeError(f"llama_state_seq_get_data wrote {got} of {size} bytes")
    return bytes(buf)


def measure_decode_facts(lm, lc) -> DecodeFacts:
    """Decode after a fixed prompt, then feed the decoded tokens whole and in
    pieces; compare logits and KV bit for bit (the module docstring). ``lc``:
    the ``llama_cpp`` module."""
    n_ctx = 2 * (PROBE_PROMPT + PROBE_DECODE)
    ctx = lm.new_context(n_ctx)
    batch = lc.llama_batch_init(n_ctx, 0, 1)
    try:
        mem = lc.llama_get_memory(ctx)
        prompt = [int(t) for t in np.random.default_rng(0).integers(0, lm.vocab_size, PROBE_PROMPT)]
        logits = forward(lc, ctx, batch, prompt, 0, False, lm.vocab_size)
        decoded, steps = [], []
        for i in range(PROBE_DECODE):
            decoded.append(pick(get_scores(torch.from_numpy(logits), 0.0, None, i))[0])
            logits = forward(lc, ctx, batch, [decoded[-1]], PROBE_PROMPT + i, False, lm.vocab_size)
            steps.append(logits)
        reference, state = np.stack(steps), read_state(lc, ctx)
        feeds = [[decoded], [decoded[i:i + PROBE_SPLIT] for i in range(0, PROBE_DECODE, PROBE_SPLIT)]]
        same, worst = True, 0.0
        for chunks in feeds:
            lc.llama_memory_seq_rm(mem, 0, PROBE_PROMPT, -1)
            start, rows = PROBE_PROMPT, []
            for chunk in chunks:
                rows.append(forward(lc, ctx, batch, chunk, start, True, lm.vocab_size))
                start += len(chunk)
            got = np.concatenate(rows)
            worst = max(worst, float(np.abs(got - reference).max()))
            same = same and np.array_equal(got, reference) and read_state(lc, ctx) == state
        return DecodeFacts(same, worst, 2 * PROBE_DECODE)
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)


def get_cache_key(lm) -> str:
    """What the facts depend on: the file (path, size, mtime), threads, flash attention, the library."""
    stat = Path(lm.source).stat()
    return (f"{FACTS_VERSION}|{Path(lm.source).resolve()}|{stat.st_size}|{stat.st_mtime_ns}|threads={lm.threads}"
            f"|fa={int(lm.flash_attn)}|llama_cpp={lm.info.get('llama_cpp_python', '?')}")


def get_decode_facts(lm, lc, cache_dir: str | os.PathLike | None = None) -> DecodeFacts:
    """The decode facts of ``lm``'s file and settings: from the cache, or measured and cached."""
    path = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = path / "llamacpp-facts.json"
    key = get_cache_key(lm)
    cached = read_cache(path)
    if key in cached:
        return DecodeFacts(**cached[key])
    facts = measure_decode_facts(lm, lc)
    cached = read_cache(path)  # another process may have written meanwhile
    cached[key] = asdict(facts)
    write_cache(path, cached)
    return facts


def read_cache(path: Path) -> dict:
    """The cached facts by key; {} when absent or unreadable (then measured again)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_cache(path: Path, data: dict) -> None:
    """Write the cache whole (a temporary sibling, then renamed: a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".tmp-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


__all__ = ["DecodeFacts", "forward", "get_decode_facts", "measure_decode_facts", "read_state"]
