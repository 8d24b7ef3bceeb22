"""The llama.cpp model: a GGUF loaded through llama-cpp-python's ctypes API
(:class:`LlamaCppModel`, :func:`load_llamacpp`), the context each engine
computes in, and the install hint when the optional extra is missing.

The engine over it is :mod:`unsee.impl.engines.llamacpp.engine`. Needs no transformers.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from unsee.impl.engines.llamacpp.kernels import (
    is_lone_row_exact,
    set_lone_row_split,
    set_repack_row_order,
)
from unsee.impl.engines.llamacpp.repack import ROW_ORDER_SETTER
from unsee.impl.engines.speculation import DraftPolicy

INSTALL_HINT = ("the llama.cpp engine needs llama-cpp-python, an optional extra: "
                "CMAKE_ARGS=-DGGML_NATIVE=OFF pip install 'unsee[llamacpp]' "
                "(`make test` installs it); the transformers engines ('tiny', 'smollm2') need nothing more")


class LlamaCppMissingError(ImportError):
    """The llama.cpp engine was asked for without llama-cpp-python installed."""


def llama_module():
    """The ``llama_cpp`` module, or a clear error saying how to install it."""
    try:
        import llama_cpp
    except ImportError as e:
        raise LlamaCppMissingError(f"{INSTALL_HINT} ({e})") from None
    return llama_cpp


def available() -> bool:
    """Whether llama-cpp-python is installed (the llama.cpp engine can run)."""
    try:
        llama_module()
    except LlamaCppMissingError:
        return False
    return True


_BACKEND: dict = {}

#: ggml's CPU switch for its tiled K-quant matmul (batches of 8 rows or more):
#: its sums are its own, so a forward of 8+ tokens stops equalling decode steps
#: (measured on Qwen2.5-Coder-1.5B Q4_K_M: logits 0.54 apart). Off by default
#: here (:func:`_init_backend`); the decode facts record the value they ran under.
TILED_MM_ENV = "GGML_CPU_TILED_MM"
#: the loader's default kernels, where ``exact_kernels`` is not given: ``exact`` (unset) or ``repacked``
KERNELS_ENV = "UNSEE_LLAMA_KERNELS"
KERNELS = {"exact": True, "repacked": False}
#: the loader's default slot count (:attr:`LlamaCppModel.slots`), where ``slots`` is not given
SLOTS_ENV = "UNSEE_LLAMA_SLOTS"
#: the context of a load that names none and gives no memory to size it by (impl/cli/serve.py does)
DEFAULT_CONTEXT = 4096
#: a context sized by memory is a multiple of this many tokens
CONTEXT_STEP = 256


def get_exact_kernels(exact_kernels: bool | None = None) -> bool:
    """``exact_kernels`` if given, else what $UNSEE_LLAMA_KERNELS names
    (``exact``, the default, or ``repacked``); a ValueError naming any other value."""
    if exact_kernels is not None:
        return bool(exact_kernels)
    value = os.environ.get(KERNELS_ENV, "").strip().lower() or "exact"
    if value not in KERNELS:
        raise ValueError(f"${KERNELS_ENV}={value!r}: expected one of {', '.join(KERNELS)}")
    return KERNELS[value]


def _init_backend(lc, exact_kernels: bool = True) -> None:
    """Once per process: turn ggml's tiled K-quant matmul off for exact kernels
    unless the user set it (before anything computes: ggml reads it
    process-wide, so the first load decides; the decode facts record the value
    they ran under), initialise ggml and silence llama.cpp's logging (it writes
    every load's details to stderr)."""
    if _BACKEND:
        return
    if exact_kernels:
        os.environ.setdefault(TILED_MM_ENV, "0")
    lc.llama_backend_init()
    # a lone decode step whole on one thread whatever the threads, where the library has the
    # switch (kernels.py); the bits of one thread are unchanged by it
    set_lone_row_split(lc, False)

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
    determinism_statement: str  # what repeatability is and is not promised, in words
    device: str = "cpu"
    dtype: str = "gguf"  # the file's own weight types; the KV is f16
    info: dict = field(default_factory=dict)
    #: threads of forwards of more than one token (llama.cpp's n_threads_batch; None: ``threads``,
    #: as a model made by hand has).
    #: A one-token forward (a decode step) runs on ``threads``: at two threads its long-context
    #: attention sums in another order, while a forward of several tokens gives the same bits at
    #: any thread count (docs/bench.md, "Many sequences in one forward, and threads"), so prefill
    #: and a batch of several conversations' decode steps (rows.py) take every core, and a lone
    #: decode step stays at ``threads``
    batch_threads: int | None = None
    #: sequences the engine's context holds at once (``n_seq_max``), each in a stream of its own
    #: (``kv_unified`` off) of ``n_ctx`` cells: a server keeps that many conversations resident
    #: and decodes their next tokens in one forward (impl/engines/llamacpp/rows.py). 1: one
    #: sequence, the layout everything was measured on; a model with sliding-window layers keeps 1
    slots: int = 1
    chat_template: str | None = None  # the GGUF's tokenizer.chat_template (None: ChatML)
    special_tokens: dict = field(default_factory=dict)  # bos_token/eos_token texts, for the template
    #: drafts' guard bound from this file's measured decode facts (facts.py): 0.0 where
    #: decode == prefill bitwise for forwards of up to `max_forward` tokens, None (drafts
    #: off) elsewhere; and where it came from
    draft_bound: float | None = None
    draft_bound_source: str = "not measured"
    max_forward: int = 0
    #: how a turn sizes its forwards where drafts are on (impl/engines/speculation.py;
    #: its per-token cost measured on this machine: cost.py), else None
    draft_policy: DraftPolicy | None = None
    #: kernels that sum a row the same way whatever the forward's size (:func:`load_llamacpp`):
    #: the file's own layout and per-row kernels, or (``row_order``) repacked Q4_K whose
    #: batched kernel keeps the one-row kernel's order; False: llama.cpp's repacking as it is
    exact_kernels: bool = True
    #: Q4_K repacked and summed in the one-row kernel's order (repack.py); the bits differ from
    #: the file's layout's, so a store records it
    row_order: bool = False
    #: the sliding window of the model's windowed layers, in tokens (0: none; two KV caches otherwise)
    n_swa: int = 0
    #: the context length the model was trained on (llama.cpp's ``n_ctx_train``; 0: not said)
    n_ctx_train: int = 0
    #: whether the KV and logits are those of one thread whatever ``threads`` and ``batch_threads``:
    #: decode on one thread, or on several with each step whole on one thread (kernels.py's switch),
    #: or, where the library lacks it, fed as two rows (facts.forward_padded) on a file whose
    #: two-token forward equals its decode steps (``max_forward`` >= 2). Then a store need not
    #: record the thread counts (impl/store/backend.py)
    thread_invariant: bool = False
    _tokenizer: object = None  # a ByteTokenizer (tiny GGUF), or None: llama.cpp's own vocabulary
    _model: object = None
    _vocab: object = None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without BOS; chat markers map to single ids."""
        if self._tokenizer is not None:
            return self._tokenizer.encode(text)
        lc = llama_module()
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
        lc = llama_module()
        ids = [int(i) for i in ids]
        arr = (lc.llama_token * max(1, len(ids)))(*ids)
        cap = 16 * len(ids) + 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = lc.llama_detokenize(self._vocab, arr, len(ids), buf, cap, False, True)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", "replace")
            cap = -n + 16

    def new_context(self, n_ctx: int | None = None, embeddings: bool = False, n_seq: int = 1, unified: bool = True,
                    flash_attn: bool | None = None):
        """A llama.cpp context over this model (each engine owns one): one
        sequence, n_ctx cells, a chunk of any length is one llama_decode.
        Sliding-window layers keep every position (``swa_full``), so that a
        crop anywhere leaves what a fresh prefill would. ``embeddings``: a
        context that returns the mean-pooled last hidden states of a sequence
        instead of logits (impl/engines/llamacpp/embed.py). ``n_seq`` > 1: a
        context of that many sequences sharing the cells (a bench's parallel
        decoding, bench/llamacpp_batch.py); the engine's own is one sequence.
        ``unified`` False: each of the ``n_seq`` sequences in a stream of
        its own, ``n_ctx / n_seq`` cells, its first cell its position 0
        (bench/llamacpp_exact_batch.py compares the two layouts). ``flash_attn``: the
        model's setting unless given (a bench's comparison)."""
        lc = llama_module()
        n_ctx = n_ctx or self.n_ctx
        cparams = lc.llama_context_default_params()
        if embeddings:
            cparams.embeddings = True
            cparams.pooling_type = lc.LLAMA_POOLING_TYPE_MEAN
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_ctx
        cparams.n_ubatch = min(512, n_ctx)
        cparams.swa_full = True
        cparams.n_seq_max = 1
        if n_seq > 1:
            cparams.n_seq_max = n_seq
            cparams.kv_unified = unified
        elif self.n_swa:
            # a second sequence, sharing the cells (one stream), through which
            # the engine reads the sliding-window rows the state writer leaves out
            cparams.n_seq_max = 2
            cparams.kv_unified = True
        cparams.n_threads = self.threads
        cparams.n_threads_batch = self.batch_threads or self.threads
        flash = self.flash_attn if flash_attn is None else flash_attn
        cparams.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.no_perf = True
        ctx = lc.llama_init_from_model(self._model, cparams)
        if not ctx:
            raise ValueError(f"llama.cpp could not create a context of {n_ctx} tokens for {self.source}")
        return ctx

    @property
    def n_embd(self) -> int:
        """The model's hidden size."""
        return llama_module().llama_model_n_embd(self._model)

    def close(self) -> None:
        lc = llama_module()
        if self._model is not None:
            lc.llama_model_free(self._model)
            self._model = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 (interpreter shutdown: the library may be gone)
            pass


def _determinism_text(threads: int, flash_attn: bool, exact_kernels: bool, batch_threads: int | None = None,
                      row_order: bool = False) -> str:
    kernels = ("repacked Q4_K summed in decode's order" if row_order else
               "per-row kernels (no repacking)" if exact_kernels else "repacked weights")
    batch = f" ({batch_threads} for forwards of several tokens)" if batch_threads not in (None, threads) else ""
    padded = "" if threads == 1 else (", each decode step's rows whole on one thread (one thread's bits)"
                                      if is_lone_row_exact() else ", each decode step fed as two rows (one thread's bits)")
    return (f"llama.cpp cpu, {threads} thread(s){batch}{padded}, flash attention {'on' if flash_attn else 'off'}, "
            f"{kernels}, f16 KV: the same chunking repeats bitwise; crop + continue equals a fresh prefill; other "
            "chunkings and decode steps may differ in the last bits, thread counts only where the file's "
            "two-token forward differs from its decode (docs/engines.md)")


def resolve_gguf(key: str, cache_dir: str | os.PathLike | None = None) -> tuple[Path, str, object]:
    """``(path, name, tokenizer)`` of a model name: ``'smollm2'``, ``'tiny'``
    or ``'tiny-<family>'`` (a tiny random GGUF of
    :data:`~unsee.impl.engines.llamacpp.tiny_gguf.FAMILIES`, written on first
    use; byte tokenizer), or a ``*.gguf`` path (tokenizer None: llama.cpp's own)."""
    from unsee.impl.engines.files import ByteTokenizer, smollm2_path

    if key == "smollm2":
        return smollm2_path(), "smollm2", None
    if key == "tiny" or key.startswith("tiny-"):
        from unsee.impl.engines.llamacpp.tiny_gguf import FAMILIES, tiny_gguf_path

        family = "llama" if key == "tiny" else key[len("tiny-"):]
        if family not in FAMILIES:
            raise ValueError(f"name_or_path={key!r}: no tiny GGUF family {family!r}; "
                             f"known: {', '.join('tiny-' + f for f in FAMILIES)}")
        name = "tiny-gguf" if family == "llama" else f"tiny-gguf-{family}"
        return tiny_gguf_path(cache_dir, family), name, ByteTokenizer()
    path = Path(key).expanduser()
    if not (path.is_file() and path.suffix.lower() == ".gguf"):
        raise ValueError(f"name_or_path={key!r} is neither 'smollm2', 'tiny', 'tiny-<family>' nor an existing "
                         ".gguf file")
    return path, key, None


#: decode threads where none is named and the library lacks the split switch (kernels.py): one. A
#: step on more threads is exact there only fed as two rows, and the padded step costs 1.84x a lone
#: row's CPU on qwen2.5-1.5b (bench/llamacpp_pad_cost.py), so on 2 cores it was no faster. With the
#: switch a lone step is exact on any threads unpadded, and the default is every core
#: (:func:`get_default_decode_threads`). A batch of conversations' steps runs on ``batch_threads``
#: whatever this is (rows.py); `--threads N` or $UNSEE_LLAMA_THREADS names a count
#: (docs/bench.md, "Decode on every core").
DEFAULT_DECODE_THREADS = 1


def get_default_decode_threads() -> int:
    """Decode threads where none is named: every core where a lone step on several threads has
    one thread's bits unpadded (kernels.is_lone_row_exact), else :data:`DEFAULT_DECODE_THREADS`."""
    return get_cores() if is_lone_row_exact() else DEFAULT_DECODE_THREADS


def get_cores() -> int:
    """The cores this process may run on (the loader's default thread count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this OS
        return os.cpu_count() or 1


def get_count(name: str, value: int | None, variable: str, default: int) -> int:
    """A count of threads or slots: ``value``, else $``variable``, else ``default``; at least 1."""
    count = int(value or os.environ.get(variable) or default)
    if count < 1:
        raise ValueError(f"{name}={count!r} must be >= 1")
    return count


def get_eos_ids(lc, vocab, n_vocab: int) -> tuple[int, ...]:
    """The ids that end a turn, as adapter.eos_ids_of reads them for transformers (the
    same set on the same file, so both engines end turns alike): the file's EOS id and
    the chat end marker. Not every id llama.cpp calls end-of-generation: for SmolLM2 it
    also guesses <|endoftext|> (0) as EOT, where transformers stops on <|im_end|> (2) alone."""
    ids = {lc.llama_vocab_eos(vocab)}
    buf = (lc.llama_token * 4)()
    if lc.llama_tokenize(vocab, b"<|im_end|>", 10, buf, 4, False, True) == 1:
        ids.add(buf[0])
    return tuple(sorted(i for i in ids if 0 <= i < n_vocab))


def get_library_info(lc) -> dict:
    """What the decode facts depend on of the library (their cache key, facts.get_cache_key): its
    version, ggml's tiled matmul setting, and whether a lone row's keys are split (kernels.py)."""
    return {"llama_cpp_python": getattr(lc, "__version__", "?"), TILED_MM_ENV: os.environ.get(TILED_MM_ENV, ""),
            "lone_row_split": "off" if is_lone_row_exact() else "on"}


def load_llamacpp(name_or_path: str | os.PathLike = "smollm2", threads: int | None = None, n_ctx: int | None = None,
                  flash_attn: bool = True, cache_dir: str | os.PathLike | None = None,
                  exact_kernels: bool | None = None, batch_threads: int | None = None,
                  slots: int | None = None, ctx_memory: int | None = None,
                  row_order: bool | None = None) -> LlamaCppModel:
    """Load a GGUF into llama.cpp: ``'smollm2'`` (the embedded SmolLM2 file),
    ``'tiny'`` or ``'tiny-<family>'`` (a tiny random GGUF, byte tokenizer), or
    a ``*.gguf`` path (:func:`resolve_gguf`).

    ``threads`` (decode steps) defaults to $UNSEE_LLAMA_THREADS, else :func:`get_default_decode_threads`;
    on several, a step is one row whole on one thread (kernels.py's switch) or, without the
    switch, fed as two rows, one thread's bits where the file's two-token forward equals two
    decode steps (``max_forward`` >= 2: docs/bench.md, "Decode on every core"; elsewhere the
    default falls back to one thread, and a count given is what the bits depend on:
    ``thread_invariant``); ``batch_threads``, the threads of forwards of several tokens
    (prefill, verification), to $UNSEE_LLAMA_BATCH_THREADS or ``threads``; ``n_ctx``
    (the longest lineage), at most the model's trained length (more is a ValueError naming
    both), to what ``ctx_memory`` bytes of KV hold for every slot
    (:func:`compute_default_context`) where given, else to 4096 (or the trained length, if
    less); ``slots``, the lineages the context holds at once (each
    its own stream of ``n_ctx`` cells), to $UNSEE_LLAMA_SLOTS or 1 (always 1 for a model
    with sliding-window layers).

    ``exact_kernels`` (default: $UNSEE_LLAMA_KERNELS, else exact): kernels that sum a row alike
    whatever the forward's size, with ggml's tiled matmul off (:data:`TILED_MM_ENV`), so a forward
    of up to 63 tokens equals decode steps and a draft is verified in one (docs/engines.md, "Exact
    kernels"): repacked Q4_K in decode's order (``row_order``, :func:`use_row_order`; where the
    library has the switch), else the file's layout. False: llama.cpp's repacking as it is."""
    exact_kernels = get_exact_kernels(exact_kernels)
    lc = llama_module()
    _init_backend(lc, exact_kernels)
    row_order = use_row_order(lc, exact_kernels, row_order)
    path, name, tokenizer = resolve_gguf(os.fspath(name_or_path), cache_dir)
    chosen = threads is not None or bool(os.environ.get("UNSEE_LLAMA_THREADS"))
    threads = get_count("threads", threads, "UNSEE_LLAMA_THREADS", get_default_decode_threads())
    batch_threads = get_count("batch_threads", batch_threads, "UNSEE_LLAMA_BATCH_THREADS", threads)
    mparams = lc.llama_model_default_params()
    mparams.n_gpu_layers = 0
    mparams.use_extra_bufts = row_order or not exact_kernels
    model = lc.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        raise ValueError(f"llama.cpp could not load {path}")
    check_exact_layout(lc, model, path)
    vocab = lc.llama_model_get_vocab(model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    eos = (tokenizer.eos_token_id,) if tokenizer is not None else get_eos_ids(lc, vocab, n_vocab)
    n_swa, slots, trained, n_ctx = get_layout(lc, model, n_ctx, slots, ctx_memory, name)
    lm = LlamaCppModel(name=name, source=str(path), eos_ids=eos, vocab_size=n_vocab,
                       n_layer=lc.llama_model_n_layer(model), n_ctx=n_ctx, threads=threads, flash_attn=flash_attn,
                       determinism_statement=_determinism_text(threads, flash_attn, exact_kernels, batch_threads,
                                                               row_order),
                       batch_threads=batch_threads,
                       info=get_library_info(lc), exact_kernels=exact_kernels, row_order=row_order)
    lm._tokenizer, lm._model, lm._vocab = tokenizer, model, vocab
    lm.n_swa, lm.slots, lm.n_ctx_train = n_swa, slots, trained
    if tokenizer is None:
        lm.chat_template, lm.special_tokens = get_chat_template(model, vocab)
    set_decode_threads(lm, chosen, cache_dir)
    return lm


def use_row_order(lc, exact_kernels: bool, row_order: bool | None) -> bool:
    """Whether a load repacks Q4_K in the one-row order (:func:`load_llamacpp`), the library's switch
    set for it. The switch is process-wide and read at every matmul, so a process takes one side:
    after llama.cpp's own repacking, an exact load keeps the file's layout (a ValueError where
    ``row_order`` asked for it), and after the row order, llama.cpp's own repacking is refused, as
    is a row order asked of a library without the switch (or an AVX-512 build's other gemm)."""
    if not exact_kernels and row_order:
        raise ValueError("row_order=True needs exact kernels: llama.cpp's own repacking sums rows its own way")
    if exact_kernels and row_order is False:
        return False  # the file's layout: nothing is repacked, the switch is not read
    side = "row-order" if exact_kernels else "llama.cpp's own"
    taken = _BACKEND.get("repacking", side)
    if taken != side and (row_order or not exact_kernels):
        raise ValueError(f"this process repacks weights with {taken} kernels for an earlier load; "
                         f"load {side} kernels in a process of their own")
    if taken == side and (set_repack_row_order(lc, exact_kernels) or not exact_kernels):
        _BACKEND["repacking"] = side
        return exact_kernels
    if row_order:
        raise ValueError(f"row_order=True: this llama.cpp lacks {ROW_ORDER_SETTER} (build it in: python -m "
                         "unsee.impl.engines.llamacpp.kernels install; an AVX-512 build's gemm is not the one it rewrites)")
    return False  # no switch here, or the process took the other side: the file's layout, exact still


def set_decode_threads(lm: LlamaCppModel, chosen: bool, cache_dir: str | os.PathLike | None = None) -> None:
    """Measure ``lm``'s decode facts (:func:`set_decode_facts`); where the thread count is the
    default (not ``chosen``) and a padded step is not one thread's step on this file (its
    two-token forward differs from decoding: ``max_forward`` < 2), decode on one thread instead
    (prefill stays on every core), measured again; then whether its bits are thread-invariant."""
    set_decode_facts(lm, cache_dir)
    if lm.threads > 1 and lm.max_forward < 2 and not chosen and not is_lone_row_exact():
        lm.threads = 1
        lm.determinism_statement = _determinism_text(1, lm.flash_attn, lm.exact_kernels, lm.batch_threads, lm.row_order)
        set_decode_facts(lm, cache_dir)
    lm.thread_invariant = lm.threads == 1 or lm.max_forward >= 2 or is_lone_row_exact()


def get_layout(lc, model, n_ctx: int | None, slots: int | None, memory: int | None,
               name: str) -> tuple[int, int, int, int]:
    """``(n_swa, slots, n_ctx_train, n_ctx)`` of a load (:func:`load_llamacpp`); a context the
    model was not trained for frees the model and raises (:func:`get_context`)."""
    n_swa = max(0, int(lc.llama_model_n_swa(model)))
    # a sliding-window model reads its window rows through a second sequence sharing the cells
    # (LlamaRows.read_swa_rows), which a stream per sequence does not allow
    slots = 1 if n_swa else get_count("slots", slots, SLOTS_ENV, 1)
    trained = max(0, int(lc.llama_model_n_ctx_train(model)))
    try:
        return n_swa, slots, trained, get_context(lc, model, trained, n_ctx, slots, memory, name)
    except ValueError:
        lc.llama_model_free(model)
        raise


def get_kv_bytes_per_token(lc, model) -> int:
    """What one token's KV takes in the context (f16 keys and values in every layer; the head
    size read as the width over the heads, as most GGUFs have it)."""
    heads = max(1, int(lc.llama_model_n_head(model)))
    head_dim = int(lc.llama_model_n_embd(model)) // heads
    return 2 * 2 * int(lc.llama_model_n_layer(model)) * int(lc.llama_model_n_head_kv(model)) * head_dim


def compute_default_context(trained: int, per_token: int, slots: int, memory: int) -> int:
    """The longest context, in steps of :data:`CONTEXT_STEP` tokens, whose KV for every slot fits
    in ``memory`` bytes, at most ``trained`` (where known) and at least one step."""
    fits = memory // max(1, per_token * slots) // CONTEXT_STEP * CONTEXT_STEP
    return max(CONTEXT_STEP, min(trained, fits) if trained else fits)


def get_context(lc, model, trained: int, n_ctx: int | None, slots: int, memory: int | None, name: str) -> int:
    """The context of a load (:func:`load_llamacpp`'s ``n_ctx`` rule), or a ValueError naming the
    model's trained length where ``n_ctx`` asks for more."""
    if n_ctx is None:
        if memory is not None:
            return compute_default_context(trained, get_kv_bytes_per_token(lc, model), slots, memory)
        return min(DEFAULT_CONTEXT, trained) if trained else DEFAULT_CONTEXT
    n_ctx = int(n_ctx)
    if n_ctx < 1 or (trained and n_ctx > trained):
        raise ValueError(f"a context of {n_ctx} tokens: model {name} holds 1 to {trained} (its trained length, "
                         "llama.cpp's n_ctx_train)")
    return n_ctx


def set_decode_facts(lm: LlamaCppModel, cache_dir: str | os.PathLike | None = None) -> None:
    """Give ``lm`` its measured decode facts (:mod:`unsee.impl.engines.llamacpp.facts`):
    the longest forward equal to decoding, the drafts' bound that allows, and where it came from."""
    from unsee.impl.engines.llamacpp.cost import COST_PREFIX, get_draft_policy
    from unsee.impl.engines.llamacpp.facts import get_decode_facts, is_cached

    started, cached = time.perf_counter(), is_cached(lm, cache_dir)
    facts = get_decode_facts(lm, llama_module(), cache_dir)
    lm.max_forward = facts.max_forward
    lm.draft_bound = facts.get_bound()
    lm.draft_bound_source = facts.describe(lm)
    if lm.draft_bound is not None:
        cached = cached and is_cached(lm, cache_dir, COST_PREFIX)
        lm.draft_policy = get_draft_policy(lm, llama_module(), cache_dir)
    if not cached:  # a first load of this file and setting: what the demo says it spent, once
        lm.info["measured_at_load_s"] = time.perf_counter() - started


def check_exact_layout(lc, model, path) -> None:
    """Refuse, before any work, a model whose state the engine cannot crop
    exactly, naming its architecture and why (the model is freed). KV caches
    by position, one or two (sliding-window layers), are what it handles."""
    buf = ctypes.create_string_buffer(128)
    n = lc.llama_model_meta_val_str(model, b"general.architecture", buf, len(buf))
    arch = buf.value.decode("utf-8", "replace") if n >= 0 else "?"
    if lc.llama_model_is_recurrent(model) or lc.llama_model_is_hybrid(model):
        reason = "its recurrent state is one value per sequence, not KV by position, so it cannot be cropped"
    elif lc.llama_model_is_diffusion(model):
        reason = "it does not decode left to right, so a turn has no canonical prefill"
    else:
        return
    lc.llama_model_free(model)
    raise ValueError(f"the llama.cpp engine refuses architecture {arch!r} ({path}): {reason}")


def get_chat_template(model, vocab) -> tuple[str | None, dict]:
    """The GGUF's chat template (:func:`pick_chat_template` of its ``tokenizer.chat_template`` and
    ``tokenizer.chat_template.tool_use`` metadata) and the BOS/EOS texts it may name."""
    lc = llama_module()
    texts = [lc.llama_model_chat_template(model, name) for name in (None, b"tool_use")]
    template = pick_chat_template(*(raw.decode("utf-8") if raw else None for raw in texts))
    tokens = {name: lc.llama_vocab_get_text(vocab, token).decode("utf-8")
              for name, token in (("bos_token", lc.llama_vocab_bos(vocab)), ("eos_token", lc.llama_vocab_eos(vocab)))
              if token >= 0}
    return template, tokens


def pick_chat_template(default: str | None, tool_use: str | None) -> str | None:
    """The template a model is served with: its ``tool_use`` template (Hermes 2 Pro / 3 keep their
    tool format there) where the default one renders no tools, else the default. One template for
    every turn, tools given or not: a conversation stays one append-only sequence, and the tool_use
    template renders a turn without tools as the default one does."""
    return tool_use if tool_use and (not default or "tools" not in default) else default


__all__ = [
    "CONTEXT_STEP",
    "DEFAULT_CONTEXT",
    "INSTALL_HINT",
    "LlamaCppMissingError",
    "LlamaCppModel",
    "available",
    "compute_default_context",
    "get_chat_template",
    "get_context",
    "get_cores",
    "get_default_decode_threads",
    "get_kv_bytes_per_token",
    "get_layout",
    "get_library_info",
    "load_llamacpp",
    "pick_chat_template",
]
