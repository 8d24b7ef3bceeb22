"""LlamaCppEngine: the :class:`~unsee.impl.engines.protocol.Engine` verbs over llama.cpp.

Through llama-cpp-python's own ctypes API (``llama_cpp``; no subprocess, no
server), the optional extra ``pip install 'unsee[llamacpp]'``. It reads GGUF
files directly: the embedded SmolLM2 Q4_1 file by default (no dequantising),
or the tiny random GGUF of :mod:`unsee.impl.engines.llamacpp.tiny_gguf` for fast properties.

How lineages map onto llama.cpp (the clone mechanism, chosen once):

* Each engine owns **one context with one sequence** (``n_seq_max = 1``, sequence 0),
  the *resident* lineage. Every other lineage is held on the host as its
  sequence state (``llama_state_seq_get_data``) parsed into K and V rows by
  position (:class:`~unsee.impl.engines.llamacpp.state.SeqKV`). These arrays
  are never written to, so sharing a prefix (``share_prefix``) or cloning is
  slicing, with no copy, and a clone is independent of its source both ways
  by construction.
* ``use`` of another lineage parks the resident one (one state read) and
  loads the new one into the emptied sequence (``llama_memory_clear`` +
  ``llama_state_seq_set_data``): a state copy. Loading into an empty cache
  puts position p in cell p, the layout a fresh run has, so a loaded lineage
  continues exactly as a fresh prefill of the same chunks would (measured by
  tests/test_llamacpp.py and bench/llamacpp_bitwise.py).
* Crop is ``llama_memory_seq_rm(mem, 0, n, -1)`` on the resident lineage
  (the freed cells are the tail, so the next prefill writes cells n.. as a
  fresh run does), and a slice of the rows on a parked one.
* Limits of this mechanism: switching lineages costs a copy of the KV of
  both (O(length), about 23 KB a token for SmolLM2's f16 KV); one lineage
  computes at a time (the engine is not thread-safe, like KVEngine); unified
  versus split KV does not arise with one sequence; ``n_ctx`` bounds every
  lineage's length.

The digest hashes K and V *by position* (every layer's K row and V row of
each position, in position order, plus the positions themselves), parsed
from the state blob, not the blob: the blob also carries the cell layout
(V is stored transposed over the cells when flash attention is off), so the
same KV in other cells would hash differently.

Decoding applies :mod:`unsee.impl.engines.decoding`' rule (``get_scores`` + ``pick``:
greedy or the seeded exponential race) to llama.cpp's logits, exactly as
KVEngine does, and canonicalises a turn as one prefilled chunk. Drafts are
off (no measured prefill-versus-decode bound for this engine), and the
prefix cache serves nothing (a B5' under it is B5; ``reused_tokens`` stays
0). A KV budget evicts parked lineages by the bytes of their rows (the
rule is :class:`~unsee.impl.engines.lineage.LineageBook`'s, shared by every engine).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch

from unsee.impl.engines.decoding import get_scores, pick
from unsee.impl.engines.lineage import Counters, LineageBook
from unsee.impl.engines.llamacpp.state import SeqKV
from unsee.impl.engines.protocol import Determinism

INSTALL_HINT = ("the llama.cpp engine needs llama-cpp-python, an optional extra: "
                "CMAKE_ARGS=-DGGML_NATIVE=OFF pip install 'unsee[llamacpp]' "
                "(`make test` installs it); the transformers engines ('tiny', 'smollm2') need nothing more")


class LlamaCppMissingError(ImportError):
    """The llama.cpp engine was asked for without llama-cpp-python installed."""


def _llama():
    """The ``llama_cpp`` module, or a clear error saying how to install it."""
    try:
        import llama_cpp
    except ImportError as e:
        raise LlamaCppMissingError(f"{INSTALL_HINT} ({e})") from None
    return llama_cpp


def available() -> bool:
    """Whether llama-cpp-python is installed (the llama.cpp engine can run)."""
    try:
        _llama()
    except LlamaCppMissingError:
        return False
    return True


_BACKEND: dict = {}


def _init_backend(lc) -> None:
    """Once per process: initialise ggml and silence llama.cpp's logging
    (it writes every load's details to stderr)."""
    if _BACKEND:
        return
    lc.llama_backend_init()

    @lc.llama_log_callback
    def quiet(level, text, user_data):  # errors surface as return codes we raise on
        return None

    _BACKEND["log"] = quiet  # keep the callback alive: llama.cpp holds only its address
    lc.llama_log_set(quiet, ctypes.c_void_p(0))


# --------------------------------------------------------------- the model


@dataclass(eq=False)
class LlamaCppModel:
    """A GGUF model loaded in llama.cpp, with the one context the engine
    computes in. Satisfies :class:`unsee.impl.engines.protocol.ModelInfo`."""

    name: str
    source: str
    eos_ids: tuple[int, ...]
    vocab_size: int
    n_layer: int
    n_ctx: int
    threads: int
    flash_attn: bool
    determinism: str
    device: str = "cpu"
    dtype: str = "gguf"  # the file's own weight types; the KV is f16
    info: dict = field(default_factory=dict)
    chat_template: str | None = None  # the GGUF's tokenizer.chat_template (None: ChatML)
    special_tokens: dict = field(default_factory=dict)  # bos_token/eos_token texts, for the template
    _tokenizer: object = None  # a ByteTokenizer (tiny GGUF), or None: llama.cpp's own vocabulary
    _model: object = None
    _vocab: object = None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without BOS; chat markers map to single ids."""
        if self._tokenizer is not None:
            return self._tokenizer.encode(text)
        lc = _llama()
        raw = text.encode("utf-8", "surrogatepass")
        cap = len(raw) + 8
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self._vocab, raw, len(raw), buf, cap, False, True)
        if n < 0:
            raise RuntimeError(f"llama_tokenize failed on a text of {len(raw)} bytes ({n})")
        return list(buf[:n])

    def decode(self, ids: Sequence[int]) -> str:
        if self._tokenizer is not None:
            return self._tokenizer.decode(ids)
        lc = _llama()
        ids = [int(i) for i in ids]
        arr = (lc.llama_token * max(1, len(ids)))(*ids)
        cap = 16 * len(ids) + 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = lc.llama_detokenize(self._vocab, arr, len(ids), buf, cap, False, True)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", "replace")
            cap = -n + 16

    def new_context(self, embeddings: bool = False):
        """A llama.cpp context over this model (each engine owns one): one
        sequence, n_ctx cells, a chunk of any length is one llama_decode.
        ``embeddings``: a context that returns the mean-pooled last hidden
        states of a sequence instead of logits (impl/engines/llamacpp/embed.py)."""
        lc = _llama()
        cparams = lc.llama_context_default_params()
        if embeddings:
            cparams.embeddings = True
            cparams.pooling_type = lc.LLAMA_POOLING_TYPE_MEAN
        cparams.n_ctx = self.n_ctx
        cparams.n_batch = self.n_ctx
        cparams.n_ubatch = min(512, self.n_ctx)
        cparams.n_seq_max = 1
        cparams.n_threads = self.threads
        cparams.n_threads_batch = self.threads
        cparams.flash_attn_type = (lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.flash_attn
                                   else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        cparams.no_perf = True
        ctx = lc.llama_init_from_model(self._model, cparams)
        if not ctx:
            raise ValueError(f"llama.cpp could not create a context of {self.n_ctx} tokens for {self.source}")
        return ctx

    @property
    def n_embd(self) -> int:
        """The model's hidden size."""
        return _llama().llama_model_n_embd(self._model)

    def close(self) -> None:
        lc = _llama()
        if self._model is not None:
            lc.llama_model_free(self._model)
            self._model = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


def _determinism_text(threads: int, flash_attn: bool) -> str:
    return (f"llama.cpp cpu, {threads} thread(s), flash attention {'on' if flash_attn else 'off'}, f16 KV: "
            "the same chunking repeats bitwise; crop + continue equals a fresh prefill; other chunkings, "
            "decode steps and thread counts may differ in the last bits (docs/engines.md)")


def load_llamacpp(name_or_path: str | os.PathLike = "smollm2", threads: int | None = None, n_ctx: int | None = None,
                  flash_attn: bool = True, cache_dir: str | os.PathLike | None = None) -> LlamaCppModel:
    """Load a GGUF into llama.cpp: ``'smollm2'`` (the embedded SmolLM2 file),
    ``'tiny'`` (the tiny random GGUF, byte tokenizer), or a ``*.gguf`` path.

    ``threads`` defaults to $UNSEE_LLAMA_THREADS or 1 (the KV may depend on
    it: docs/engines.md); ``n_ctx`` (the longest lineage) to 4096."""
    lc = _llama()
    _init_backend(lc)
    from unsee.impl.engines.files import ByteTokenizer, smollm2_path

    tokenizer = None
    key = os.fspath(name_or_path)
    if key == "smollm2":
        path, name = smollm2_path(), "smollm2"
    elif key == "tiny":
        from unsee.impl.engines.llamacpp.tiny_gguf import tiny_gguf_path

        path, name, tokenizer = tiny_gguf_path(cache_dir), "tiny-gguf", ByteTokenizer()
    else:
        path, name = Path(key).expanduser(), key
        if not (path.is_file() and path.suffix.lower() == ".gguf"):
            raise ValueError(f"name_or_path={key!r} is neither 'smollm2', 'tiny' nor an existing .gguf file")
    threads = int(threads or os.environ.get("UNSEE_LLAMA_THREADS") or 1)
    if threads < 1:
        raise ValueError(f"threads={threads!r} must be >= 1")
    n_ctx = int(n_ctx or 4096)
    mparams = lc.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = lc.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        raise ValueError(f"llama.cpp could not load {path}")
    vocab = lc.llama_model_get_vocab(model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    if tokenizer is not None:
        eos = (tokenizer.eos_token_id,)
    else:
        # as adapter.eos_ids_of does for transformers (the same set on the same
        # file, so both engines end turns alike): the file's EOS id and the
        # chat end marker. Not every id llama.cpp calls end-of-generation:
        # for SmolLM2 it also guesses <|endoftext|> (0) as EOT, where
        # transformers stops on <|im_end|> (2) alone.
        ids = {lc.llama_vocab_eos(vocab)}
        buf = (lc.llama_token * 4)()
        if lc.llama_tokenize(vocab, b"<|im_end|>", 10, buf, 4, False, True) == 1:
            ids.add(buf[0])
        eos = tuple(sorted(i for i in ids if 0 <= i < n_vocab))
    lm = LlamaCppModel(name=name, source=str(path), eos_ids=eos, vocab_size=n_vocab,
                       n_layer=lc.llama_model_n_layer(model), n_ctx=n_ctx, threads=threads, flash_attn=flash_attn,
                       determinism=_determinism_text(threads, flash_attn),
                       info={"llama_cpp_python": getattr(lc, "__version__", "?")})
    lm._tokenizer, lm._model, lm._vocab = tokenizer, model, vocab
    if tokenizer is None:
        lm.chat_template, lm.special_tokens = get_chat_template(model, vocab)
    return lm


def get_chat_template(model, vocab) -> tuple[str | None, dict]:
    """The GGUF's ``tokenizer.chat_template`` metadata and the BOS/EOS texts it may name."""
    lc = _llama()
    raw = lc.llama_model_chat_template(model, None)
    template = raw.decode("utf-8") if raw else None
    tokens = {name: lc.llama_vocab_get_text(vocab, token).decode("utf-8")
              for name, token in (("bos_token", lc.llama_vocab_bos(vocab)), ("eos_token", lc.llama_vocab_eos(vocab)))
              if token >= 0}
    return template, tokens


# ----------------------------------------------------------------- engine


class _Lineage:
    __slots__ = ("tokens", "kv", "last_logits", "last_used")

    def __init__(self, tokens: list[int], kv: SeqKV | None, last_logits: np.ndarray | None):
        self.tokens = tokens
        self.kv = kv  # the parked rows; None while resident and changed since parked
        self.last_logits = last_logits
        self.last_used = 0


class LlamaCppEngine(LineageBook):
    """The llama.cpp implementation of :class:`unsee.impl.engines.protocol.Engine`:
    lineages over one :class:`LlamaCppModel`, one resident in the engine's
    context and the others parked on the host as rows (the module docstring
    has the mapping), with the verbs prefill, generate (canonicalised; no
    drafts), crop, share_prefix, clone, drop, digest and logits; the KV
    budget and pins of :class:`~unsee.impl.engines.lineage.LineageBook`; and a
    prefix cache that serves nothing. Needs no transformers."""

    def __init__(self, lm: LlamaCppModel, kv_budget: int | None = None):
        lc = _llama()
        self.lm = lm
        self._lc = lc
        self._ctx = lm.new_context()  # freed with the engine
        self._mem = lc.llama_get_memory(self._ctx)
        self.counters = Counters()
        self.draft_bound = None  # no prefill-versus-decode bound measured: drafts off
        self.determinism = Determinism(same_chunking_repeats=True, crop_continue_is_fresh=True,
                                       chunk_invariant=False, decode_is_prefill=False, thread_invariant=False,
                                       statement=lm.determinism)
        self._init_book()
        self._resident: str | None = None  # the lineage sequence 0 holds
        self._batch = lc.llama_batch_init(lm.n_ctx, 0, 1)
        self._v_trans = not lm.flash_attn  # llama.cpp stores V transposed without flash attention
        lc.llama_memory_clear(self._mem, True)
        self.set_kv_budget(kv_budget)

    def __del__(self):
        try:
            self._lc.llama_batch_free(self._batch)
            self._lc.llama_free(self._ctx)
        except Exception:  # a half-built engine, or interpreter shutdown
            pass

    # ------------------------------------------------------------ lineages

    def new_lineage(self) -> str:
        handle = self._fresh_handle()
        self._lineages[handle] = _Lineage([], None, None)
        self._current = handle
        self._touch(handle)
        return handle

    def share_prefix(self, lineage: str | None = None, n_tokens: int | None = None) -> str:
        src = self._get(lineage)
        length = len(src.tokens)
        n = length if n_tokens is None else self._check_prefix_length("share_prefix", n_tokens, length)
        kv = self._parked(lineage or self._current)
        handle = self._fresh_handle()
        self._lineages[handle] = _Lineage(src.tokens[:n], kv.head(n),
                                          src.last_logits if n == length else None)
        self._touch(handle)
        self.enforce_budget()
        return handle

    def clone(self, lineage: str | None = None) -> str:
        """A lineage equal to ``lineage``. Its rows are the source's parked
        rows, which nothing ever writes to: independent both ways."""
        return self.share_prefix(lineage)

    def length(self, lineage: str | None = None) -> int:
        return len(self._get(lineage).tokens)

    # --------------------------------------------------------------- verbs

    def prefill(self, token_ids: Iterable[int]) -> None:
        """Exactly one ``llama_decode`` over ``token_ids`` on the current lineage."""
        handle = self._need_current()
        lin = self._get(handle)
        ids = self._check_ids(token_ids)
        if len(lin.tokens) + len(ids) > self.lm.n_ctx:
            raise ValueError(f"prefill: {len(lin.tokens)} + {len(ids)} tokens exceed n_ctx={self.lm.n_ctx}")
        self._make_resident(handle)
        lin.last_logits = self._forward(ids, len(lin.tokens))
        lin.tokens.extend(ids)
        lin.kv = None
        self.counters.forward_calls += 1
        self.counters.prefilled_tokens += len(ids)
        self.enforce_budget()

    def generate(self, max_new_tokens: int, stop_ids: Iterable[int] | None = None, temperature: float = 0.0,
                 seed: int | None = None, draft: Sequence[int] | None = None,
                 probe: bool = False, lookup: bool = False) -> list[int]:
        """As :meth:`KVEngine.generate` without drafts (so ``probe``, which
        only acts on a draft, does nothing here, and ``lookup``, which needs
        a bound as a draft does, is refused): decode by the rule of
        impl/engines/decoding.py on llama.cpp's logits, then replace the decode steps by
        one prefill of the turn (the canonical chunk a replay redoes)."""
        max_new_tokens = self._check_generate(max_new_tokens, temperature, seed, draft, lookup)  # drafts: off here
        handle = self._need_current()
        lin = self._get(handle)
        if lin.last_logits is None:
            raise RuntimeError(f"generate on lineage {handle!r}: no logits to continue from; "
                               "prefill first (a new lineage or a crop has none)")
        stops = set(self.lm.eos_ids if stop_ids is None else (int(s) for s in stop_ids))
        self._make_resident(handle)
        start, header_logits = len(lin.tokens), lin.last_logits
        out: list[int] = []
        try:
            logits = header_logits
            while len(out) < max_new_tokens:
                tok, _ = pick(get_scores(torch.from_numpy(logits), temperature, seed, len(out)))
                out.append(tok)
                self.counters.decoded_tokens += 1
                if tok in stops or len(out) == max_new_tokens:
                    break  # the last token is not fed: the canonical prefill does it
                if start + len(out) >= self.lm.n_ctx:
                    raise ValueError(f"generate: the turn would exceed n_ctx={self.lm.n_ctx}")
                logits = self._forward([tok], start + len(out) - 1)
                lin.tokens.append(tok)
                lin.kv = None
                self.counters.forward_calls += 1
        except BaseException:
            self._truncate(lin, start)  # interrupted: the lineage as it was
            lin.last_logits = header_logits
            raise
        if not out:
            return out
        self._truncate(lin, start)
        self.prefill(out)
        return out

    def crop(self, n_tokens: int, lineage: str | None = None) -> None:
        """Keep the first ``n_tokens``: ``llama_memory_seq_rm`` of the tail on
        the resident lineage, a slice of the rows on a parked one."""
        handle = lineage or self._need_current()
        lin = self._get(handle)
        length = len(lin.tokens)
        n = self._check_prefix_length("crop", n_tokens, length)
        self._truncate(lin, n, handle)
        lin.last_logits = None

    def logits(self, lineage: str | None = None) -> torch.Tensor | None:
        """The logits after the lineage's last prefill (float32, a copy), or None after a crop."""
        lin = self._get(lineage)
        return None if lin.last_logits is None else torch.from_numpy(lin.last_logits.copy())

    def digest(self, lineage: str | None = None) -> str:
        """sha256 over the K and V rows by position (see :meth:`SeqKV.digest_into`).
        Any empty lineage has the same digest, however it got empty."""
        handle = lineage or self._need_current()
        lin = self._get(handle)
        h = hashlib.sha256(b"unsee-llamacpp-kv-v1")
        h.update(f"len={len(lin.tokens)};".encode())
        kv = self._parked(handle)
        if kv.n:
            kv.digest_into(h)
        return h.hexdigest()

    # ------------------------------------------------------------ memory

    def _storages(self, handle: str, park: bool = False) -> dict:
        """Distinct host buffers a lineage holds: ``{key: bytes}``. The
        resident lineage, changed since it was parked, holds none outside the
        context unless ``park`` reads it out (what :meth:`memory` does; the
        budget need not: the resident lineage is current, never evicted)."""
        lin = self._lineages[handle]
        if park and lin.kv is None:
            self._parked(handle)
        out = lin.kv.storages() if lin.kv is not None else {}
        if lin.last_logits is not None:
            out[id(lin.last_logits)] = lin.last_logits.nbytes
        return out

    def _lineage_storages(self, handle: str) -> dict:
        # the resident lineage read out of the context; the context's own
        # allocation (n_ctx cells, fixed) is not counted
        return self._storages(handle, park=True)

    def _budget_storages(self, handle: str) -> dict:
        # without reading the resident lineage out: it is current, never evicted
        return self._storages(handle)

    def _free_lineage(self, handle: str) -> None:
        """Empty the context's sequence if ``handle`` is the lineage it holds."""
        if handle == self._resident:
            self._lc.llama_memory_clear(self._mem, True)
            self._resident = None

    @contextlib.contextmanager
    def prefix_cache(self, sources: Iterable[str] | None = None) -> Iterator["LlamaCppEngine"]:
        """This engine's prefix cache serves nothing: every prefill inside the
        block is computed (``reused_tokens`` stays 0), which is trivially
        equal to computing it. (Serving by chunk history, as KVEngine does,
        is not built for llama.cpp yet.)"""
        yield self

    # ------------------------------------------------------------ helpers

    def _forward(self, ids: list[int], start: int) -> np.ndarray:
        """One llama_decode of ``ids`` at positions start.. on sequence 0;
        the logits after the last token (a float32 copy)."""
        lc, b = self._lc, self._batch
        n = len(ids)
        for i, tok in enumerate(ids):
            b.token[i] = tok
            b.pos[i] = start + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 0
        b.logits[n - 1] = 1
        b.n_tokens = n
        rc = lc.llama_decode(self._ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} for {n} tokens at position {start}")
        ptr = lc.llama_get_logits_ith(self._ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.lm.vocab_size,)).copy()

    def _read_seq(self) -> SeqKV:
        """Sequence 0's KV, read out of the context and parsed."""
        lc, ctx = self._lc, self._ctx
        size = lc.llama_state_seq_get_size(ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        got = lc.llama_state_seq_get_data(ctx, buf, size, 0)
        if got != size:
            raise RuntimeError(f"llama_state_seq_get_data wrote {got} of {size} bytes")
        return SeqKV.parse(bytes(buf), self.lm.n_layer, self._v_trans)

    def _parked(self, handle: str | None) -> SeqKV:
        """The rows of ``handle``, parking (reading) them first if the
        resident copy changed since."""
        lin = self._lineages[handle]
        if lin.kv is None:
            if handle == self._resident:
                lin.kv = self._read_seq()
            elif not lin.tokens:
                lin.kv = SeqKV.empty(self.lm.n_layer, self._v_trans)
            else:
                raise RuntimeError(f"lineage {handle!r} has neither rows nor residency")  # a bug, never input
        return lin.kv

    def _make_resident(self, handle: str) -> None:
        """Load ``handle`` into sequence 0 (parking the resident lineage first)."""
        if self._resident == handle:
            return
        if self._resident is not None and self._resident in self._lineages:
            self._parked(self._resident)
        lc, ctx = self._lc, self._ctx
        lc.llama_memory_clear(self._mem, True)
        self._resident = None
        kv = self._parked(handle)
        if kv.n:
            blob = kv.to_blob()
            arr = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
            if lc.llama_state_seq_set_data(ctx, arr, len(blob), 0) != len(blob):
                raise RuntimeError(f"llama_state_seq_set_data could not load lineage {handle!r}")
        self._resident = handle

    def _truncate(self, lin: _Lineage, n: int, handle: str | None = None) -> None:
        handle = handle or self._current
        if handle == self._resident:
            if not self._lc.llama_memory_seq_rm(self._mem, 0, n, -1):
                raise RuntimeError(f"llama_memory_seq_rm refused to crop lineage {handle!r} to {n}")
            if lin.kv is not None:
                lin.kv = lin.kv.head(n)
        elif lin.kv is not None:
            lin.kv = lin.kv.head(n)
        del lin.tokens[n:]


__all__ = ["INSTALL_HINT", "LlamaCppEngine", "LlamaCppMissingError", "LlamaCppModel", "available",
           "load_llamacpp"]
