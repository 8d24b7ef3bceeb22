"""Grammar constraints over a turn's tokens (issue 49): the mask behind a tool call that always
parses and a structured output that always matches its schema.

Each is a :class:`~unsee.impl.engines.decoding.Constraint`: the tokens it allows next are a
function of the turn's own tokens so far, whatever path the turn took to them (a draft's
verification, a fallback to the reference, a forget's replay), so a replayed turn is decided
as its twin's is. The grammars are llguidance's (a Rust Earley parser over the model's own
vocabulary, pinned in the serve and test extras): it was chosen over xgrammar because it
takes any tokenizer as a list of token bytes (our byte-tokenizer tiny models, llama.cpp's
vocabularies, transformers' fast tokenizers alike), names special tokens in a grammar by id,
embeds JSON schemas in a Lark grammar, and rolls its state back by tokens, which a
verification that rejects proposals needs. What a mask costs per token is measured in
bench/grammar_cost.py (docs/serve.md, "Tools").

- :class:`GrammarConstraint`: a grammar from the turn's first token (a structured output; the
  rest of a call whose opening the turn was given);
- :class:`LazyConstraint`: free text until the turn writes one of its triggers (a call's
  opening), then the grammar that trigger starts, fed the text from where the trigger began;
- :class:`BannedTokens`: some tokens never (a call's marker, under ``tool_choice: none``).

Nothing here knows a call format: impl/agent/tools/grammars.py writes the grammars.
"""

from __future__ import annotations

import bisect
import re
import threading
import weakref
from collections.abc import Sequence

import attrs
import numpy as np
import torch

#: llguidance marks a special token by this first byte (its tokenizer convention)
SPECIAL_BYTE = b"\xff"


@attrs.frozen
class Vocabulary:
    """A model's tokens as bytes (special tokens as their text, marked in ``special``) and
    the ids that end a turn."""

    tokens: tuple[bytes, ...]
    special: frozenset[int]
    eos_ids: tuple[int, ...]


def get_vocabulary(lm) -> Vocabulary | None:
    """The vocabulary of an engine's model as bytes, or None where it cannot be read (a
    transformers tokenizer that is not a fast one: :func:`get_tokenizer` reads those itself)."""
    from unsee.impl.engines.files import ByteTokenizer

    byte_tok = getattr(lm, "_tokenizer", None) or getattr(lm, "tokenizer", None)
    if isinstance(byte_tok, ByteTokenizer):
        tokens = [bytes([i]) for i in range(256)] + [s.encode() for s in byte_tok.SPECIALS]
        tokens += [b""] * (lm.vocab_size - len(tokens))
        return Vocabulary(tuple(tokens), frozenset(byte_tok.id_to_special), tuple(lm.eos_ids))
    vocab = getattr(lm, "_vocab", None)
    if vocab is not None:
        return get_llama_vocabulary(lm, vocab)
    return None


def get_llama_vocabulary(lm, vocab) -> Vocabulary:
    """llama.cpp's vocabulary: each token's piece as raw bytes, special where llama.cpp marks
    it a control token, or a user-defined one written as a tag (``<tool_call>``): the model
    writes those as one token, and a grammar must name them by id."""
    import ctypes

    from unsee.impl.engines.llamacpp.model import llama_module

    lc = llama_module()
    buf = ctypes.create_string_buffer(4096)
    tokens, special = [], set()
    for token in range(lc.llama_vocab_n_tokens(vocab)):
        n = lc.llama_token_to_piece(vocab, token, buf, 4096, 0, True)
        piece = bytes(buf[:max(n, 0)])
        attr = lc.llama_vocab_get_attr(vocab, token)
        tag = piece.startswith(b"<") and piece.endswith(b">")
        if attr & lc.LLAMA_TOKEN_ATTR_CONTROL or (attr & lc.LLAMA_TOKEN_ATTR_USER_DEFINED and tag):
            special.add(token)
        tokens.append(piece)
    tokens += [b""] * (lm.vocab_size - len(tokens))
    return Vocabulary(tuple(tokens), frozenset(special), tuple(lm.eos_ids))


class _Tokenizer:
    """What llguidance's ``TokenizerWrapper`` reads: token bytes, special ids, eos, and a
    tokenizer (the model's own encode)."""

    def __init__(self, lm, vocabulary: Vocabulary):
        self.tokens = [SPECIAL_BYTE + t if i in vocabulary.special else t for i, t in enumerate(vocabulary.tokens)]
        self.special_token_ids = sorted(vocabulary.special)
        self.eos_token_id = vocabulary.eos_ids[0]
        self.bos_token_id = None
        self._encode = lm.encode

    def __call__(self, text: str) -> list[int]:
        return self._encode(text)


@attrs.frozen
class Grammatical:
    """What the grammars need of one model, built once (reading a vocabulary of 150k tokens
    takes about a second): llguidance's tokenizer, which tokens are only blanks, and each
    token's first byte that is not a blank."""

    tokenizer: object
    blank: np.ndarray  # bool over the vocabulary: tokens of spaces, tabs and newlines only
    first: np.ndarray  # uint8 over the vocabulary: the first byte that is not a blank (0: none)


_MODELS: dict[int, Grammatical] = {}
_LOCK = threading.Lock()
BLANKS = frozenset(b" \t\r\n")


def get_grammatical(lm) -> Grammatical:
    """:class:`Grammatical` of ``lm``, built on first use and dropped with the model."""
    key = id(lm)
    with _LOCK:
        if key in _MODELS:
            return _MODELS[key]
    import llguidance

    vocabulary = get_vocabulary(lm)
    eos = list(lm.eos_ids)
    if vocabulary is not None:
        tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Tokenizer(lm, vocabulary)),
                                           n_vocab=lm.vocab_size, eos_token=eos)
        pieces = vocabulary.tokens
    else:
        from llguidance.hf import from_tokenizer
        tokenizer = from_tokenizer(lm.tokenizer, n_vocab=lm.vocab_size, eos_token=eos)
        pieces = [lm.decode([i]).encode("utf-8", "surrogatepass") for i in range(lm.vocab_size)]
    blank = np.array([bool(p) and set(p) <= BLANKS for p in pieces], dtype=bool)
    first = np.array([(p.lstrip(b" \t\r\n") or b"\0")[0] for p in pieces], dtype=np.uint8)
    with _LOCK:
        _MODELS[key] = Grammatical(tokenizer, blank, first)
    weakref.finalize(lm, _MODELS.pop, key, None)
    return _MODELS[key]


def get_tokenizer(lm):
    """llguidance's tokenizer of ``lm`` (:func:`get_grammatical`)."""
    return get_grammatical(lm).tokenizer


def get_special_id(lm, text: str) -> int | None:
    """The id of a special token written ``text`` (``<tool_call>``), or None where the model
    writes that text as ordinary tokens."""
    ids = lm.encode(text)
    if len(ids) != 1:
        return None
    return ids[0] if get_tokenizer(lm).is_special_token(ids[0]) else None


def check_grammar(lm, grammar: str) -> str:
    """The error of a grammar that llguidance cannot build over ``lm``'s vocabulary ('' if none)."""
    import llguidance

    return llguidance.LLMatcher.validate_grammar(grammar, get_tokenizer(lm))


def to_mask(bitmask: bytes, vocab_size: int) -> np.ndarray:
    """llguidance's bitmask (little-endian 32-bit words, bit i of the mask = token i) as a bool
    array. The mask's work stays in numpy: on a machine whose cores the forwards keep busy,
    a torch op over the vocabulary waits for its thread pool (measured: ``any`` over 151,936
    bools 0.4 ms on one thread, 19.6 ms on two, with the other core loaded)."""
    return np.unpackbits(np.frombuffer(bitmask, dtype=np.uint8), bitorder="little")[:vocab_size].view(bool)


#: The most blank tokens (spaces, tabs, newlines) a grammar lets the turn write in a row. A
#: JSON grammar takes any whitespace between its tokens, and a small model held to a schema it
#: would not have written can fill its whole output cap with newlines (llama.cpp's JSON
#: grammars bound it too: one newline and up to 20 spaces or tabs between two tokens). A real
#: model's indentation is one token (a newline and its spaces merge), so 4 never binds it.
MAX_BLANK_RUN = 4


class GrammarConstraint:
    """A grammar over the turn's tokens from ``start`` on (the ones before are free): the
    matcher is synced to each asked-for prefix by rolling back to the common part and feeding
    the rest, so asking in any order gives the same masks. A grammar that reaches an error
    state (a token it cannot take, fed by a path the mask did not decide) stops constraining:
    the turn's text is then read as the model wrote it. After :data:`MAX_BLANK_RUN` blank
    tokens in a row, blank tokens are masked too."""

    def __init__(self, lm, grammar: str, start: int = 0):
        import llguidance

        self.blank = get_grammatical(lm).blank
        self.vocab_size = lm.vocab_size
        self.grammar = grammar
        self.start = start
        self.new_matcher = lambda: llguidance.LLMatcher(get_tokenizer(lm), grammar, log_level=0)
        self.matcher = self.new_matcher()
        if self.matcher.is_error():
            raise ValueError(f"grammar: {self.matcher.get_error()}")
        self.fed: list[int] = []
        self.failed = False

    def sync(self, tokens: Sequence[int]) -> bool:
        """Bring the matcher to ``tokens`` (the turn's tokens from ``start``); False where the
        grammar cannot take them."""
        common = 0
        for a, b in zip(self.fed, tokens):
            if a != b:
                break
            common += 1
        if self.failed or common < len(self.fed):
            if self.failed or not self.matcher.rollback(len(self.fed) - common):
                self.matcher = self.new_matcher()  # a matcher in its error state never leaves it
                self.fed, common = [], 0
            else:
                del self.fed[common:]
            self.failed = False
        for token in tokens[common:]:
            if not self.matcher.consume_token(token):
                self.failed = True
                return False
            self.fed.append(token)
        return not self.matcher.is_error()

    def get_allowed(self, out: Sequence[int]) -> torch.Tensor | None:
        if len(out) < self.start or not self.sync(list(out[self.start:])):
            return None
        mask = to_mask(self.matcher.compute_bitmask(), self.vocab_size)
        tail = out[len(out) - MAX_BLANK_RUN:] if len(out) - self.start >= MAX_BLANK_RUN else ()
        if tail and all(self.blank[t] for t in tail):
            unblank = mask & ~self.blank
            mask = unblank if unblank.any() else mask
        return torch.from_numpy(mask) if mask.any() else None

    def is_done(self, out: Sequence[int]) -> bool:
        """Never: a grammar that has closed allows the end of turn alone, and the turn ends on it,
        as a turn without a grammar does (its KV and its finish reason are a finished turn's;
        ending it at the closing token instead left every structured output reported as cut by
        the output cap)."""
        return False


@attrs.frozen
class Trigger:
    """Where a lazy grammar starts: a token id (a special token that opens a call), or a
    regular expression over the turn's text (bytes) whose match starts a call; ``grammar``
    (Lark, llguidance's dialect) is what the turn must then match from the match's start,
    written with ``{PREFIX}`` where the bytes of the trigger's first token that come before
    the match go (a token may begin with a newline before the opening). ``opener``: a trigger
    that opens the turn with this byte (a JSON object's brace), whose first token is checked
    before it is decided: while the turn is blank, a token that starts with the opener must fit
    the grammar, since a trigger seen after the token that wrote it cannot hold that token
    (qwen2.5-1.5b opened a turn with ``{{``, and the call was lost as text)."""

    grammar: str
    token: int | None = None
    pattern: bytes | None = None
    opener: bytes | None = None


def get_lark_literal(data: bytes) -> str:
    """A Lark string literal matching ``data`` exactly ("" when empty)."""
    text = data.decode("utf-8", "surrogateescape")
    return '"' + "".join(c if c.isprintable() and c not in '"\\' else f"\\u{ord(c):04x}" if ord(c) < 0x10000
                         else c for c in text) + '"' if text else '""'


class LazyConstraint:
    """Free text until the turn writes a trigger (:class:`Trigger`), then that trigger's
    grammar from the token where the trigger began: the lazy grammar of a call in ``auto``
    (the model decides whether to call; once it starts, the call always parses). The first
    trigger in the text wins; the tokens before it stay free.

    The turn's text is kept for the longest prefix asked about and extended token by token
    (a step costs the new token's bytes, not the turn's): a trigger found in a prefix is the
    first one of every extension of it (a later token cannot complete a match that starts
    earlier, since no trigger is a part of another). Asked about a shorter prefix or another
    path, it looks again from the start (a verification's rejected proposals; rare)."""

    #: bytes searched again before the new text: a trigger may straddle two tokens
    OVERLAP = 32

    def __init__(self, lm, triggers: Sequence[Trigger]):
        self.lm = lm
        self.triggers = tuple(triggers)
        self.patterns = [re.compile(t.pattern) if t.pattern is not None else None for t in self.triggers]
        self.pieces: dict[int, bytes] = {}
        self.grammars: dict[tuple[int, int, bytes], GrammarConstraint] = {}
        self.seen: list[int] = []
        self.text = bytearray()
        self.starts: list[int] = []  # where each seen token's bytes start in text
        self.found: tuple[int, int, bytes] | None = None  # the first trigger in seen

    def get_piece(self, token: int) -> bytes:
        piece = self.pieces.get(token)
        if piece is None:
            piece = self.pieces[token] = self.lm.decode([token]).encode("utf-8", "surrogatepass")
        return piece

    def find(self, out: Sequence[int]) -> tuple[int, int, bytes] | None:
        """The first trigger in ``out``: (which trigger, the token it starts at, the bytes of that
        token before the match), or None."""
        common = 0
        for a, b in zip(self.seen, out):
            if a != b:
                break
            common += 1
        if common < len(self.seen):  # another path: keep the common prefix only, and look again
            del self.seen[common:]
            del self.text[self.starts[common] if common < len(self.starts) else len(self.text):]
            del self.starts[common:]
            return self.scan(out, 0, 0)  # a trigger of the longer path may not be whole in this one
        if self.found is not None:
            self.extend(out)
            return self.found
        return self.scan(out, max(0, len(self.text) - self.OVERLAP), len(self.seen))

    def extend(self, out: Sequence[int]) -> None:
        for token in out[len(self.seen):]:
            self.starts.append(len(self.text))
            self.text += self.get_piece(token)
            self.seen.append(token)

    def scan(self, out: Sequence[int], since: int, first_new: int) -> tuple[int, int, bytes] | None:
        """Extend the text to ``out`` and look for the first trigger in it from byte ``since``
        on (tokens that are triggers themselves from token ``first_new`` on)."""
        self.extend(out)
        text = self.text  # searched in place (re takes a bytearray): a step copies nothing
        best = None
        for i, trigger in enumerate(self.triggers):
            if trigger.token is not None and trigger.token in out[first_new:]:
                k = first_new + list(out[first_new:]).index(trigger.token)
                best = min(best or (k, i, b""), (k, i, b""))
            m = self.patterns[i].search(text, since) if self.patterns[i] is not None else None
            if m is not None:
                k = bisect.bisect_right(self.starts, m.start()) - 1
                candidate = (k, i, bytes(text[self.starts[k]:m.start()]))
                best = min(best or candidate, candidate)
        self.found = None if best is None else (best[1], best[0], best[2])
        return self.found

    def get_grammar(self, out: Sequence[int]) -> GrammarConstraint | None:
        found = self.find(out)
        if found is None:
            return None
        grammar = self.grammars.get(found)
        if grammar is None:
            i, k, prefix = found
            text = self.triggers[i].grammar.replace("{PREFIX}", get_lark_literal(prefix) if prefix else "")
            grammar = self.grammars[found] = GrammarConstraint(self.lm, text, start=k)
        return grammar

    def get_allowed(self, out: Sequence[int]) -> torch.Tensor | None:
        grammar = self.get_grammar(out)
        if grammar is not None:
            return grammar.get_allowed(out)
        return self.get_opening_mask(out) if not bytes(self.text).strip() else None

    def get_opening_mask(self, out: Sequence[int]) -> torch.Tensor | None:
        """While the turn is blank: tokens that start with an opener (:class:`Trigger`) only where
        they fit its grammar; every other token."""
        allowed = None
        for i, trigger in enumerate(self.triggers):
            if trigger.opener is None:
                continue
            key = (i, 0, b"")
            if key not in self.grammars:
                self.grammars[key] = GrammarConstraint(self.lm, trigger.grammar.replace("{PREFIX}", ""), start=0)
            fits = self.grammars[key].get_allowed(out)
            if fits is None:
                continue
            opens = get_grammatical(self.lm).first == trigger.opener[0]
            kept = ~opens | fits.numpy()
            allowed = kept if allowed is None else allowed & kept
        return None if allowed is None else torch.from_numpy(allowed)

    def is_done(self, out: Sequence[int]) -> bool:
        grammar = self.get_grammar(out)
        return grammar is not None and grammar.is_done(out)


class BannedTokens:
    """Some tokens never: the mask of ``tool_choice: none`` (a call's marker token)."""

    def __init__(self, vocab_size: int, banned: Sequence[int]):
        allowed = np.ones(vocab_size, dtype=bool)
        allowed[list(banned)] = False
        self.mask = torch.from_numpy(allowed)

    def get_allowed(self, out: Sequence[int]) -> torch.Tensor | None:
        return self.mask

    def is_done(self, out: Sequence[int]) -> bool:
        return False


__all__ = ["MAX_BLANK_RUN", "BannedTokens", "GrammarConstraint", "Grammatical", "LazyConstraint", "Trigger",
           "Vocabulary", "check_grammar", "get_grammatical", "get_lark_literal", "get_special_id", "get_tokenizer",
           "get_vocabulary", "to_mask"]
