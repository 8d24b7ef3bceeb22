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

But only up to a batch size, and only with the right kernels. SmolLM2's
Q4_1 file and the tiny Q4_1 files give decode == prefill bitwise for
forwards of up to 63 tokens; from 64 on, flash attention takes its tiled
kernel, whose logits differ by up to about 1 (32 tokens without flash
attention). Other weight types meet other kernels first: llama.cpp repacks
Q4_K weights for the CPU and multiplies 4 rows at a time (Qwen2.5-Coder-1.5B
Q4_K_M: equal up to 3 tokens), and ggml's tiled K-quant matmul takes batches
of 8 rows or more (equal up to 7). The loader keeps the file's layout and
turns the tiled matmul off (``exact_kernels``, model.py), which gives that
file 63 too. So the engine measures it per file, kernel setting, thread
count, flash-attention setting and llama-cpp-python version
(:func:`get_decode_facts`): greedy-decode :data:`PROBE_DECODE` tokens one
step at a time after a fixed pseudo-random prompt, then feed the first L of
them again as one forward (the KV cut back to the prompt's end each time,
never re-prefilled), comparing every logit, for the sizes of
:data:`PROBE_SIZES`: every size up to 16 (where the repacked and tiled
kernels take over: 4 and 8), then each multiple of 8 and the size below it,
until one differs; between the last equal size and that one, a bisection
(the kernels change with the batch size at thresholds). Each size costs a
forward of that size: checking every size up to 64 took about 2,100 tokens
of forwards, these sizes about 660. After a second, longer prompt (past 256
tokens, so that a decode step attends over 512 cells or more, where flash
attention splits the keys for decoding) the sizes up to that limit are
checked again at powers of two and the limit itself
(:data:`LONG_PROMPT_SIZES`). The longest equal size is
the engine's ``max_forward``, and the KV such a forward writes is checked
too. With a ``max_forward`` of 2 or more the bound is 0.0 and every
verification forward (a draft, a context guess) is at most ``max_forward``
tokens long (a longer draft is verified in its first ``max_forward`` tokens,
the rest decoded); a decision needs a margin above 0, so an exact tie still
falls back (the guard stays as a safety net). Otherwise None: drafts off. A
measurement on two prompts, not a proof: the properties run forget == reset
with drafts on.
The result is cached in ``llamacpp-facts.json`` under the cache dir, keyed
by the file's path, size and mtime and the settings.
"""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from unsee.impl.engines.decoding import get_scores, pick
from unsee.impl.engines.files import default_cache_dir
from unsee.impl.engines.llamacpp.kernels import is_lone_row_exact

#: the probe: prompt lengths (the comparison runs after each), tokens decoded after them.
#: The second passes 256 tokens: its decode steps attend over 512 cells or more
PROBE_PROMPTS = (24, 300)
PROBE_DECODE = 96
#: the forward sizes checked after the first prompt, ascending: every size up to 16,
#: then each multiple of 8 and the size below it (a bisection finds the limit between)
PROBE_SIZES = tuple(range(2, 17)) + tuple(s for k in range(3, PROBE_DECODE // 8 + 1) for s in (8 * k - 1, 8 * k))
#: the forward sizes checked after the second prompt (those under the first's limit,
#: and the limit itself): each size costs a forward of that size, and what the
#: second prompt adds is the attention's length, not another batch size
LONG_PROMPT_SIZES = (2, 4, 8, 16, 32, 64)
#: bump when the measurement changes (old cache entries are then ignored)
FACTS_VERSION = "v6"


@dataclass(frozen=True)
class DecodeFacts:
    """What one measurement found: the longest forward (in tokens) whose
    logits at every position, and the KV it writes, equal decoding the same
    tokens one by one (0: not even two tokens, or under 2: drafts off); the
    logit difference at the first size that differed (0.0: none did); how
    many positions were compared."""

    max_forward: int
    max_abs_diff: float
    positions: int

    def get_bound(self) -> float | None:
        """The drafts' guard bound these facts allow: 0.0, or None (drafts off)."""
        return 0.0 if self.max_forward >= 2 else None

    def describe(self, lm) -> str:
        """Where the bound came from, in words (the forget report's draft reason)."""
        batch = (f" ({lm.batch_threads} for forwards of several tokens)"
                 if getattr(lm, "batch_threads", None) not in (None, lm.threads) else "")
        where = (f"llama.cpp {os.path.basename(lm.source)}, {lm.threads} thread(s){batch}, flash attention "
                 f"{'on' if lm.flash_attn else 'off'}, "
                 f"{get_kernels_text(lm)}")
        if not lm.flash_attn:
            return (f"not measured ({where}): without flash attention the forward size from which llama.cpp's "
                    "logits stop equalling decoding varied with the context (33 to over 96 tokens on the tiny "
                    "file), so no size is known safe: drafts off")
        if self.max_forward >= 2:
            beyond = (f"; {self.max_forward + 1} differ by up to {self.max_abs_diff:.3g}" if self.max_abs_diff
                      else "")
            return (f"measured at load: decode == prefill bitwise for forwards of up to {self.max_forward} tokens "
                    f"({where}; logits at {self.positions} positions and the KV{beyond}): bound 0, drafts and "
                    f"guesses verified in forwards of at most {self.max_forward} tokens, an exact tie still "
                    "falls back")
        return (f"measured at load: decode != prefill ({where}; max |logit difference| {self.max_abs_diff:.3g} "
                f"over {self.positions} positions): drafts off")


def forward(lc, ctx, batch, ids: list[int], start: int, all_logits: bool, vocab: int, seq: int = 0) -> np.ndarray:
    """One ``llama_decode`` of ``ids`` at positions start.. on sequence ``seq``: the
    logits after the last token (vocab,), or after every token (n, vocab), float32 copies.
    A one-token forward on a context of several decode threads is fed as two rows
    (:func:`forward_padded`), so that its bits are those of one thread, unless the library's
    key split is off (kernels.py: then the row is whole on one thread as it is)."""
    n = len(ids)
    if n == 1 and lc.llama_n_threads(ctx) > 1 and not is_lone_row_exact():
        logits = forward_padded(lc, ctx, batch, ids[0], start, vocab, seq)
        return logits[None] if all_logits else logits
    for i, tok in enumerate(ids):
        batch.token[i] = tok
        batch.pos[i] = start + i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = int(all_logits)
    batch.logits[n - 1] = 1
    batch.n_tokens = n
    rc = lc.llama_decode(ctx, batch)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc} for {n} tokens at position {start}")
    if not all_logits:  # one copy out of the context's buffer (a decode step's, on the loop's critical path)
        return np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, n - 1), shape=(vocab,)).copy()
    return np.stack([np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), shape=(vocab,)) for i in range(n)])


def forward_padded(lc, ctx, batch, token: int, start: int, vocab: int, seq: int = 0) -> np.ndarray:
    """A decode step on every decode thread with one thread's bits: the logits after ``token``
    at ``start``. Flash attention splits a lone query row's keys among the threads once it
    attends over 512 cells or more, and each thread count then sums in its own order; a
    forward of two rows never takes that split and computes each row whole on one thread,
    as a one-thread step does (docs/bench.md, "Decode on every core"). So the step is fed
    with a second row, the same token at ``start + 1`` (row 0 never attends to it: it is
    masked), whose cell is freed again at once. Where the sequence has no cell left for
    it, the step runs on one thread instead."""
    threads, batch_threads = lc.llama_n_threads(ctx), lc.llama_n_threads_batch(ctx)
    if start + 2 > lc.llama_n_ctx_seq(ctx):
        lc.llama_set_n_threads(ctx, 1, batch_threads)
        try:
            return forward(lc, ctx, batch, [token], start, False, vocab, seq)
        finally:
            lc.llama_set_n_threads(ctx, threads, batch_threads)
    for i in range(2):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + i, 1
        batch.seq_id[i][0], batch.logits[i] = seq, int(i == 0)
    batch.n_tokens = 2
    rc = lc.llama_decode(ctx, batch)
    lc.llama_memory_seq_rm(lc.llama_get_memory(ctx), seq, start + 1, -1)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc} for a decode step at position {start}")
    return np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, 0), shape=(vocab,)).copy()


def forward_steps(lc, ctx, batch, steps: list[tuple[int, int, Sequence[int]]], vocab: int) -> list[np.ndarray]:
    """One ``llama_decode`` of tokens on each of several sequences (``steps``: (sequence,
    position, tokens), a sequence at most once): the logits after each one's last token,
    (vocab,) float32 copies, in the order of ``steps``. The batch holds them by ascending
    sequence: over a stream per sequence llama.cpp computes a batch in micro-batches of
    consecutive sequence ids, in the batch's order, each an equal share of every stream in it
    (its ``split_equal``), so the steps of sequences 3, 0, 1, 2 in that order are two graph
    computations and sorted one (:func:`count_micro_batches`). Each row's bits are the same
    either way, and a chunk of up to ``max_forward`` tokens has the same rows however a
    micro-batch cuts it (tests/test_llamacpp_slots.py)."""
    order = sorted(range(len(steps)), key=lambda i: steps[i][0])
    row, last = 0, [0] * len(steps)
    for i in order:
        seq, pos, tokens = steps[i]
        for j, tok in enumerate(tokens):
            batch.token[row], batch.pos[row], batch.n_seq_id[row] = tok, pos + j, 1
            batch.seq_id[row][0], batch.logits[row] = seq, int(j == len(tokens) - 1)
            row += 1
        last[i] = row - 1
    batch.n_tokens = row
    rc = lc.llama_decode(ctx, batch)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc} for a batch of {row} tokens on {len(steps)} sequences")
    return [np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, last[i]), shape=(vocab,)).copy()
            for i in range(len(steps))]


def count_micro_batches(seqs: Sequence[int]) -> int:
    """The graph computations llama.cpp runs for one token on each of ``seqs`` in that order, over a
    stream per sequence (``split_equal`` with ``sequential``: a micro-batch takes, in batch order,
    the next unused sequence whose id follows the last one taken): 1 for 0, 1, 2; 3 for 0, 2, 5."""
    left, count = list(seqs), 0
    while left:
        taken, rest = [left[0]], []
        for seq in left[1:]:
            (taken if seq == taken[-1] + 1 else rest).append(seq)
        left, count = rest, count + 1
    return count


def read_state(lc, ctx) -> bytes:
    """Sequence 0's state blob (its KV, cell by cell)."""
    size = lc.llama_state_seq_get_size(ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    got = lc.llama_state_seq_get_data(ctx, buf, size, 0)
    if got != size:
        raise RuntimeError(f"llama_state_seq_get_data wrote {got} of {size} bytes")
    return bytes(buf)


def measure_decode_facts(lm, lc) -> DecodeFacts:
    """After each of :data:`PROBE_PROMPTS` (fixed pseudo-random tokens),
    greedy-decode :data:`PROBE_DECODE` tokens one step at a time, then feed
    the first L of them again as one forward for L = 2, 3, ... until the
    logits differ: the longest size equal after every prompt, whose KV is
    then checked too (the module docstring). ``lc``: the ``llama_cpp`` module.
    Without flash attention nothing is measured (:meth:`DecodeFacts.describe`
    says why): drafts off."""
    if not lm.flash_attn:
        return DecodeFacts(0, 0.0, 0)
    n_ctx = max(PROBE_PROMPTS) + PROBE_DECODE + 8
    ctx = lm.new_context(n_ctx)
    batch = lc.llama_batch_init(n_ctx, 0, 1)
    try:
        limit, worst, positions = PROBE_DECODE, 0.0, 0
        rng = np.random.default_rng(0)
        for i, size in enumerate(PROBE_PROMPTS):
            prompt = [int(t) for t in rng.integers(0, lm.vocab_size, size)]
            sizes = (PROBE_SIZES if i == 0 else sorted({s for s in LONG_PROMPT_SIZES if s < limit} | {limit}))
            limit, diff, compared = get_equal_forward(lc, ctx, batch, lm.vocab_size, prompt, sizes)
            worst, positions = max(worst, diff), positions + compared
            if limit < 2:
                break  # not even two tokens: drafts off, nothing left to check
        return DecodeFacts(limit if limit >= 2 else 0, worst, positions)
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)


def get_equal_forward(lc, ctx, batch, vocab: int, prompt: list[int], sizes: Sequence[int]) -> tuple[int, float, int]:
    """After ``prompt``: the largest forward size equal to decoding (logits,
    then the KV of a forward of that size followed by decode steps): the
    largest of ``sizes`` (ascending, at least 2, at most :data:`PROBE_DECODE`)
    before the first that differs, raised by a bisection between the two; the
    logit difference at the smallest size found to differ; the positions compared."""
    mem = lc.llama_get_memory(ctx)
    lc.llama_memory_clear(mem, True)
    logits = forward(lc, ctx, batch, prompt, 0, False, vocab)
    decoded, steps = [], []
    for i in range(PROBE_DECODE):
        decoded.append(pick(get_scores(torch.from_numpy(logits), 0.0, None, i))[0])
        logits = forward(lc, ctx, batch, [decoded[-1]], len(prompt) + i, False, vocab)
        steps.append(logits)
    reference, state = np.stack(steps), read_state(lc, ctx)
    compared = 0

    def get_diff(size: int) -> float | None:
        """None where a forward of ``size`` gives decoding's logits, else their max difference.
        The KV is cut back to the prompt's end first: the prompt is never prefilled again."""
        nonlocal compared
        lc.llama_memory_seq_rm(mem, 0, len(prompt), -1)
        got = forward(lc, ctx, batch, decoded[:size], len(prompt), True, vocab)
        compared += size
        return None if np.array_equal(got, reference[:size]) else float(np.abs(got - reference[:size]).max())

    limit, diff = compute_equal_limit(sizes, get_diff)
    lc.llama_memory_seq_rm(mem, 0, len(prompt), -1)
    if limit >= 2:  # the KV such a forward writes, continued by decode steps, is the decode's
        forward(lc, ctx, batch, decoded[:limit], len(prompt), True, vocab)
        for i in range(limit, PROBE_DECODE):
            forward(lc, ctx, batch, [decoded[i]], len(prompt) + i, False, vocab)
        if read_state(lc, ctx) != state:
            limit = 0
    return limit, diff, compared


def compute_equal_limit(sizes: Sequence[int], get_diff) -> tuple[int, float]:
    """The largest size found equal (``get_diff(size)`` None) and the
    difference at the smallest found to differ (0.0: none did): ``sizes`` in
    order up to the first that differs, then a bisection between the last
    equal one and it (0 when the first size differs)."""
    limit, bad, diff = 0, None, 0.0
    for size in sizes:
        got = get_diff(size)
        if got is not None:
            bad, diff = size, got
            break
        limit = size
    if bad is None or not limit:
        return limit, diff
    while bad - limit > 1:
        mid = (limit + bad) // 2
        got = get_diff(mid)
        if got is None:
            limit = mid
        else:
            bad, diff = mid, got
    return limit, diff


def get_kernels_text(lm) -> str:
    """The matmul kernels of ``lm``, in words."""
    if getattr(lm, "row_order", False):
        return "per-row kernels, Q4_K repacked in decode's order"
    return "per-row kernels" if lm.exact_kernels else "repacked weights"


def get_cache_key(lm) -> str:
    """What the facts depend on: the file (path, size, mtime), the kernels
    (repacking, ggml's tiled matmul), threads (and batch threads where they differ, and on several
    whether a lone row's keys are split), flash attention, the library."""
    stat = Path(lm.source).stat()
    batch = f"|batch_threads={lm.batch_threads}" if getattr(lm, "batch_threads", None) not in (None, lm.threads) else ""
    # a step on several threads is padded or not (kernels.py): its cost, not its bits, differs
    split = f"|lone_row_split={lm.info.get('lone_row_split', 'on')}" if lm.threads > 1 else ""
    return (f"{FACTS_VERSION}|{Path(lm.source).resolve()}|{stat.st_size}|{stat.st_mtime_ns}|threads={lm.threads}{batch}{split}"
            f"|fa={int(lm.flash_attn)}|exact_kernels={int(lm.exact_kernels)}|row_order={int(getattr(lm, 'row_order', False))}"
            f"|tiled_mm={lm.info.get('GGML_CPU_TILED_MM', '')}|llama_cpp={lm.info.get('llama_cpp_python', '?')}")


def get_cache_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """The file the facts (and the per-token costs, cost.py) are cached in."""
    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "llamacpp-facts.json"


def is_cached(lm, cache_dir: str | os.PathLike | None = None, prefix: str = "") -> bool:
    """Whether ``lm``'s facts (``prefix``: another measurement's entry) are cached already."""
    return prefix + get_cache_key(lm) in read_cache(get_cache_path(cache_dir))


def get_decode_facts(lm, lc, cache_dir: str | os.PathLike | None = None) -> DecodeFacts:
    """The decode facts of ``lm``'s file and settings: from the cache, or measured and cached."""
    path = get_cache_path(cache_dir)
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


__all__ = ["DecodeFacts", "compute_equal_limit", "count_micro_batches", "forward", "forward_padded", "forward_steps", "get_cache_path", "get_decode_facts", "get_kernels_text", "is_cached",
           "measure_decode_facts", "read_state"]
