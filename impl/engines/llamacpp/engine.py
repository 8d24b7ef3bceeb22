"""LlamaCppEngine: the :class:`~unsee.impl.engines.protocol.Engine` verbs over llama.cpp.

Through llama-cpp-python's own ctypes API (``llama_cpp``; no subprocess, no
server), the optional extra ``pip install 'unsee[llamacpp]'``. It reads GGUF
files directly: the embedded SmolLM2 Q4_1 file by default (no dequantising),
or the tiny random GGUF of :mod:`unsee.impl.engines.llamacpp.tiny_gguf` for fast properties.

How lineages map onto llama.cpp (the clone mechanism, chosen once):

* Each engine owns **one context with one sequence** (``n_seq_max = 1``, sequence 0),
  the *resident* lineage; or, with ``slots`` > 1 (a server's), one context of that
  many sequences, each in a stream of its own cells, so that many lineages are
  resident and their decode steps can share a forward
  (:class:`~unsee.impl.engines.llamacpp.rows.LlamaRows`; every verb equals the
  one-sequence layout's bits, tests/test_llamacpp_slots.py). Every other lineage is held on the host as its
  sequence state (``llama_state_seq_get_data``) parsed into K and V rows by
  position (:class:`~unsee.impl.engines.llamacpp.state.SeqKV`). These arrays
  are never written to, so forking (``fork``: a shared prefix or a clone) is
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
KVEngine does, and canonicalises a turn as one prefilled chunk. Drafts,
probes and context guesses (impl/engines/turn.py) run where this file's
decode equals its prefill bitwise, measured at load for forwards up to a
size (:mod:`~unsee.impl.engines.llamacpp.facts`): bound 0, every
verification forward capped at that size. The prefix cache serves whole
matching chunks from parked rows (B5'). A model with sliding-window layers
has two KV caches, kept full-size and parked whole
(:meth:`~unsee.impl.engines.llamacpp.rows.LlamaRows.read_swa_rows`). A KV
budget evicts parked lineages by the bytes of their rows (the rule is
:class:`~unsee.impl.engines.lineage.Budget`'s, shared by every engine).

The verbs are the lineage book's (:class:`~unsee.impl.engines.book.LineageBook`),
written once for every engine, over :class:`~unsee.impl.engines.llamacpp.rows.LlamaRows`
(the context, parking and loading, the digest).
"""

from __future__ import annotations

from typing import ClassVar

from unsee.impl.engines.book import LineageBook
from unsee.impl.engines.llamacpp.model import (
    INSTALL_HINT,
    LlamaCppMissingError,
    LlamaCppModel,
    available,
    load_llamacpp,
)
from unsee.impl.engines.llamacpp.rows import LlamaRows
from unsee.impl.engines.protocol import Determinism


class LlamaCppEngine(LineageBook):
    """The llama.cpp implementation of :class:`unsee.impl.engines.protocol.Engine`:
    lineages over one :class:`LlamaCppModel`, one resident in the engine's
    context and the others parked on the host as rows (the module docstring
    has the mapping), with the verbs prefill, generate (canonicalised; drafts,
    probe and lookup where decode == prefill was measured), fork, drop,
    digest and logits, all :class:`~unsee.impl.engines.book.LineageBook`'s over
    :class:`~unsee.impl.engines.llamacpp.rows.LlamaRows` (``kv``); the KV budget
    and pins (``budget``); and a prefix cache that serves whole matching
    chunks. Needs no transformers."""

    #: what equal digests mean (protocol.Determinism.digest), and the support matrix's words (engines/support.py)
    DIGEST = "kv"
    SUPPORT: ClassVar[dict[str, str]] = {"drafts": "yes where decode == prefill is measured at load (bound 0, forwards capped)",
               "kv_budget": "yes: parked lineages' rows, LRU", "store": "yes (records threads, flash attention, n_ctx, kernels)",
               "receipts": "yes"}

    def __init__(self, lm: LlamaCppModel, kv_budget: int | None = None):
        self.lm = lm
        rows = LlamaRows(lm)
        super().__init__(rows, batch=rows.forward_steps if rows.can_batch else None, batch_limit=rows.batch_limit)
        #: 0.0 where this file's decode == prefill bitwise for forwards of up to
        #: lm.max_forward tokens (measured: facts.py), else None (drafts off);
        #: decode_is_prefill stays False: longer forwards take other kernels
        self.draft_bound = lm.draft_bound
        self.draft_bound_source = lm.draft_bound_source  # the file's measured facts (facts.py)
        #: how a turn sizes its forwards (impl/engines/speculation.py; None: each feeds all it can)
        self.draft_policy = lm.draft_policy
        self.determinism = Determinism(same_chunking_repeats=True, crop_continue_is_fresh=True,
                                       chunk_invariant=False, decode_is_prefill=False,
                                       thread_invariant=lm.thread_invariant, statement=lm.determinism_statement,
                                       digest=self.DIGEST)
        self.budget.set(kv_budget)

    @property
    def max_forward(self) -> int | None:
        """The longest forward whose rows equal decoding's (facts.py): a turn's
        forwards are capped at it, and a decoded turn that fits is committed
        without a re-prefill; None where none was measured."""
        return self.lm.max_forward or None

__all__ = ["INSTALL_HINT", "LlamaCppEngine", "LlamaCppMissingError", "LlamaCppModel", "available",
           "load_llamacpp"]
