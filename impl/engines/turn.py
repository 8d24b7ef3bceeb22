"""One decoding turn with drafts, a probe and context lookup: the procedure
every engine's ``generate`` runs (impl/agent/drafts.py explains the guard),
over a lineage reached through two forward functions.

Every engine that computes its own KV reaches it through
:class:`unsee.impl.engines.book.TurnLineage` over its backend; this module
imports no transformers.
``Turn.max_forward`` caps every verification forward (llama.cpp's decode
equals its prefill only below a batch size; None elsewhere). What a turn
needs of its engine is :class:`TurnLineage`: the lineage's tokens and last
logits, a crop, and two forwards on the lineage's KV (the logits after the
last token fed, or after every token fed). Logits are float32 CPU torch
tensors.

The procedures, which ``generate`` picks from (each calls the lineage's
forwards itself, so a forward is at most two calls below ``generate``):

* :func:`decode_guarded`, where a draft or lookup helps and multi-token
  forwards differ from decoding in the last bits: check the draft's first
  token on the header's own logits, probe (one decode step) when asked,
  verify the draft in one forward (:func:`get_accepted`), then decode on
  from the first disagreement;
* :func:`decode`: one token at a time, each decided token fed alone or with a
  guess from the lineage's own tokens (:func:`accept_guess` reads the
  guess's forward);
* :func:`speculate`, instead of the above where forwards of up to
  ``max_forward`` tokens equal decoding (llama.cpp): the turn as a run of
  forwards, each feeding the token just decided and as many proposals (the
  draft while it agrees, else a context guess) as the draft policy's credit
  allows (impl/engines/speculation.py);
* :func:`decode_reference`: the turn without help, and the fallback of the
  others on an unstable decision.

A decision on logits a verification built (not the reference's own) must
clear the guard's threshold; one that does not makes the step return None
(unstable), and the turn is decoded again the reference way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from unsee.impl.engines.counts import Counters
from unsee.impl.engines.decoding import PLAIN, Rule, get_lookup, get_scores, get_threshold, pick
from unsee.impl.engines.protocol import Assist
from unsee.impl.engines.speculation import DraftPolicy, compute_credit, compute_proposals


class TurnLineage(Protocol):
    """The lineage a turn decodes on, as the turn sees it."""

    tokens: list[int]
    last_logits: torch.Tensor | None

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens and their KV."""

    def forward_last(self, ids: list[int]) -> torch.Tensor:
        """Feed ``ids`` in one forward (appending them to ``tokens``); the logits after the last."""

    def forward_all(self, ids: list[int]) -> torch.Tensor:
        """Feed ``ids`` in one forward (appending them to ``tokens``); the logits after each, (n, vocab)."""


@dataclass
class Turn:
    """What one turn decodes with: the lineage, where the turn starts and the
    logits it starts from (the header's), the decoding rule's settings, the
    turn's limits, and the counters its work adds to."""

    lin: TurnLineage
    counters: Counters
    start: int
    header_logits: torch.Tensor
    max_new_tokens: int
    stops: set[int]
    temperature: float
    seed: int | None
    draft_bound: float | None
    #: the longest forward whose logits and KV equal decoding's bit for bit (None: the
    #: engine has no such size, and verifies a draft in one forward, guarded)
    max_forward: int | None = None
    #: how many proposals each forward feeds (:func:`speculate`; None: all it can)
    policy: DraftPolicy | None = None
    #: penalties, nucleus and constraints over the turn's tokens (decoding.Rule)
    rule: Rule = PLAIN

    def decide(self, logits: torch.Tensor, out: list[int]) -> tuple[int, float]:
        """The decoding rule's token after the turn's tokens ``out`` (at position ``len(out)``),
        and its margin."""
        scores = get_scores(logits, self.temperature, self.seed, len(out), self.rule, out)
        tok, margin = pick(scores)
        if self.rule.on_decision is not None:
            self.rule.on_decision(len(out), tok, scores if self.temperature == 0 else
                                  get_scores(logits, 0.0, None, len(out), self.rule, out))
        return tok, margin

    def is_done(self, out: list[int]) -> bool:
        """Whether ``out`` ends the turn (a stop id, max_new_tokens, or the rule's constraints)."""
        return bool(out) and (out[-1] in self.stops or len(out) == self.max_new_tokens or self.rule.is_done(out))

    def get_threshold(self) -> float:
        return get_threshold(self.draft_bound, self.temperature)


def decode_reference(turn: Turn) -> list[int]:
    """The reference procedure: the turn decoded one token at a time from the
    header's logits, on the lineage as the header left it."""
    turn.lin.truncate(turn.start)
    turn.lin.last_logits = turn.header_logits
    return decode(turn, [], turn.header_logits, None)


def decode_guarded(turn: Turn, assist: Assist) -> tuple[list[int] | None, bool]:
    """A turn on an engine whose multi-token forwards differ from decoding in
    the last bits (no ``max_forward``): the draft verified in one forward, so
    that a draft accepted whole is the turn's canonical chunk, every decision
    on its rows guarded; its longest stable agreeing prefix is accepted and
    the turn decoded on from the first disagreement (with lookup, if asked).
    Returns (tokens, committed): tokens None means an unstable decision (the
    caller falls back to the reference); committed means the verification
    chunk is the turn's canonical chunk."""
    lin, draft, lookup = turn.lin, list(assist.draft or ()), assist.lookup
    if draft and turn.decide(turn.header_logits, [])[0] != draft[0]:
        # decided on the header's own logits, the reference's: decoding from here *is* the reference
        count_draft(turn.counters, len(draft), 0, fallback=False)
        draft = []
    if not draft:
        if not lookup:
            return None, False
        out = decode(turn, [], turn.header_logits, None, lookup=True)
        turn.counters.draft_fallbacks += int(out is None)
        return out, False
    probed = None  # the reference's own logits at position 1, when probed
    if assist.probe and len(draft) >= 2 and draft[0] not in turn.stops and turn.max_new_tokens >= 2:
        probed = lin.forward_last([draft[0]])  # the reference's own first decode step
        turn.counters.forward_calls += 1
        turn.counters.draft_probes += 1
        if turn.decide(probed, draft[:1])[0] != draft[1]:
            # wrong at position 1, on the reference's own logits and KV: decode on, unguarded
            out = decode(turn, [draft[0]], probed, None, lookup)
            count_draft(turn.counters, len(draft), 1 if out is not None else 0, fallback=out is None)
            return out, False
        lin.truncate(turn.start)  # the verification recomputes position 0 in the turn's one chunk
    verify = lin.forward_all(draft)
    turn.counters.forward_calls += 1
    turn.counters.prefilled_tokens += len(draft)
    out, stable = get_accepted(turn, draft, probed, verify)
    accepted = len(out)
    if stable and turn.is_done(out) and accepted == len(draft):
        lin.last_logits = None  # not the canonical chunk's logits: a prefill comes before the next turn
        count_draft(turn.counters, len(draft), accepted, fallback=False)
        return out, True
    result: list[int] | None = out
    if stable and not turn.is_done(out):
        # resume at the first disagreement on the accepted prefix's KV; with
        # nothing accepted that KV is the header's alone, the reference's
        lin.truncate(turn.start + accepted)
        logits = turn.header_logits if accepted == 0 else verify[accepted - 1]
        result = decode(turn, out, logits, None if accepted == 0 else turn.get_threshold(), lookup)
    count_draft(turn.counters, len(draft), accepted if stable and result is not None else 0,
                fallback=not stable or result is None)
    return (result if stable else None), False


def decode(turn: Turn, out: list[int], logits: torch.Tensor, threshold: float | None,
           lookup: bool = False) -> list[int] | None:
    """Decode one token at a time from ``logits``, at position ``len(out)``
    of the turn, appending to ``out``. With a threshold (decoding on KV a
    verification built), a decision whose margin does not clear it returns
    None: unstable. With ``lookup``, a decided token is fed together with a
    guess (:func:`get_guess`), and every later decision is guarded."""
    lin, counters = turn.lin, turn.counters
    while len(out) < turn.max_new_tokens:
        tok, margin = turn.decide(logits, out)
        if threshold is not None and margin <= threshold:
            return None
        out.append(tok)
        counters.decoded_tokens += 1
        if turn.is_done(out):
            break  # the last token is not fed: the canonical prefill does it
        guess = get_guess(turn, out, tok) if lookup else []
        if not guess:
            logits = lin.forward_last([tok])
            counters.forward_calls += 1
            continue
        threshold = turn.get_threshold()
        fed = len(lin.tokens) + 1  # the lineage's length with `tok` fed
        verified = accept_guess(turn, guess, lin.forward_all([tok] + guess), out, threshold, fed)
        if verified is None:
            return None
        if turn.is_done(out):
            break  # the canonical prefill replaces what the verification fed
        logits = verified
    return out


def get_guess(turn: Turn, out: list[int], tok: int) -> list[int]:
    """A guess at the tokens after ``out`` (``decoding.get_lookup`` over the
    lineage's tokens and the decided ``tok``), cut after its first stop id."""
    limit = turn.max_new_tokens - len(out)
    if turn.max_forward is not None:
        limit = min(limit, turn.max_forward - 1)  # fed after `tok`, in one forward
    guess = get_lookup(turn.lin.tokens + [tok], limit)
    ends = [i for i, g in enumerate(guess) if g in turn.stops]
    if ends:
        del guess[ends[0] + 1:]
    return guess


def accept_guess(turn: Turn, guess: list[int], verify: torch.Tensor, out: list[int], threshold: float,
                 fed: int) -> torch.Tensor | None:
    """After one forward fed the decided token and ``guess`` (``verify``: the
    logits after each; ``fed``: the lineage's length with the token), append
    the guess's longest stable agreeing prefix to ``out``. Returns the logits
    the next token is decided on, or None: unstable. Where the turn is done,
    the lineage keeps what was fed (the canonical prefill replaces it);
    otherwise it keeps what was accepted."""
    counters = turn.counters
    counters.forward_calls += 1
    counters.lookup_forwards += 1
    counters.prefilled_tokens += len(guess)
    accepted = 0
    for proposed, row in zip(guess, verify):
        guessed, margin = turn.decide(row, out)
        if margin <= threshold:
            count_lookup(counters, len(guess), 0)
            return None
        if guessed != proposed:
            break  # decided on these logits by the caller
        out.append(guessed)
        accepted += 1
        if turn.is_done(out):
            break
    count_lookup(counters, len(guess), accepted)
    if not turn.is_done(out):
        turn.lin.truncate(fed + accepted)
    return verify[accepted]


def get_accepted(turn: Turn, draft: list[int], probed: torch.Tensor | None,
                 verify: torch.Tensor) -> tuple[list[int], bool]:
    """The draft's longest prefix the decoding rule agrees with, and whether
    every decision on the way was stable. Position 0 is decided on the
    header's own logits (and position 1 on the probe's, when probed), later
    ones on the verification's logits, guarded."""
    threshold = turn.get_threshold()
    out: list[int] = []
    for k, proposed in enumerate(draft):
        exact = k == 0 or (k == 1 and probed is not None)
        logits = turn.header_logits if k == 0 else probed if exact else verify[k - 1]
        tok, margin = turn.decide(logits, out)
        if not exact and margin <= threshold:
            return out, False
        if tok != proposed:
            break
        out.append(tok)
        if turn.is_done(out):
            break
    return out, True


def speculate(turn: Turn, assist: Assist) -> tuple[list[int] | None, bool]:
    """The turn as a run of forwards of at most ``max_forward`` tokens (whose
    logits and KV equal decoding's: impl/engines/llamacpp/facts.py), each
    feeding the token just decided and the proposals the policy's credit
    allows (:func:`get_proposals`, impl/engines/speculation.py): the draft's
    next tokens while the turn agrees with it, else a context guess. Returns
    the tokens (None: an unstable decision, the caller falls back) and
    whether the lineage holds the whole turn as its canonical chunk would.

    With ``probe``, the first forward feeds no proposal (the draft's second
    token is checked on a plain decode step). Decisions after the first
    multi-token forward are guarded, as everywhere a forward of several
    tokens built the KV (the guard is a safety net here: the rows are
    decoding's own, so only an exact tie fails it)."""
    draft, probe, lookup = list(assist.draft or ()), assist.probe, assist.lookup
    run = Run(turn.policy.opening if turn.policy else 0.0)
    logits, threshold = turn.header_logits, None  # the header's logits are the reference's own
    while True:
        tok, margin = run.pending or turn.decide(logits, run.out)
        if threshold is not None and margin <= threshold:
            return run.end(turn, draft, None)
        run.decided(turn.counters, tok, draft)
        if turn.is_done(run.out):
            return run.end(turn, draft, run.out)  # its last token is fed by the engine's commit
        proposals, guessed = get_proposals(turn, run, draft, lookup)
        probing = probe and run.forwards == 0 and bool(proposals) and not guessed
        fed = 0 if probing else compute_proposals(turn.policy, run.credit, len(proposals))
        turn.counters.draft_probes += int(probing)
        if not fed:
            run.count_forward(turn.counters, 1)
            logits = turn.lin.forward_last([tok])
            continue
        threshold = turn.get_threshold()
        run.count_forward(turn.counters, 1 + fed)
        rows = turn.lin.forward_all([tok] + proposals[:fed])
        accepted = check_proposals(turn, run, proposals[:fed], rows, threshold, guessed)
        if accepted is None:
            return run.end(turn, draft, None)
        run.credit = compute_credit(turn.policy, run.credit, fed, accepted)
        if turn.is_done(run.out):  # the turn's last token was fed, as a proposal
            committed = len(run.out) <= turn.max_forward  # every row as the turn's one-chunk prefill writes it
            turn.lin.last_logits = None  # as after any verification: a prefill comes before the next turn
            return run.end(turn, draft, run.out, committed)
        turn.lin.truncate(turn.start + len(run.out))  # the rejected proposals' rows
        logits = rows[accepted]


@dataclass
class Run:
    """What :func:`speculate` has done so far in one turn: the tokens decided,
    the credit left, the draft tokens kept, the forwards run, and a decision
    already taken on a verification row (at the first rejected proposal)."""

    credit: float
    out: list[int] = field(default_factory=list)
    from_draft: int = 0  # the first from_draft tokens of out are the draft's
    forwards: int = 0
    pending: tuple[int, float] | None = None
    #: whether the last decided token was counted as decoded (a fed token is counted once)
    last_decoded: bool = False

    def decided(self, counters: Counters, tok: int, draft: list[int]) -> None:
        """Append a token the rule decided (not read off a proposal's row)."""
        self.pending = None
        agrees = self.from_draft == len(self.out) < len(draft) and draft[len(self.out)] == tok
        self.out.append(tok)
        self.from_draft += int(agrees)
        self.last_decoded = not agrees
        counters.decoded_tokens += int(not agrees)

    def count_forward(self, counters: Counters, n_ids: int) -> None:
        """Count one forward of ``n_ids`` ids, the decided token first (fed
        alone: the logits after it; with proposals: the logits after each)."""
        self.forwards += 1
        counters.forward_calls += 1
        counters.prefilled_tokens += n_ids - int(self.last_decoded)

    def end(self, turn: Turn, draft: list[int], out: list[int] | None,
            committed: bool = False) -> tuple[list[int] | None, bool]:
        """The turn's result, its draft's account settled."""
        if draft:
            count_draft(turn.counters, len(draft), self.from_draft if out is not None else 0, fallback=out is None)
        elif out is None:
            turn.counters.draft_fallbacks += 1
        return out, committed


def get_proposals(turn: Turn, run: Run, draft: list[int], lookup: bool) -> tuple[list[int], bool]:
    """What may follow the turn's tokens so far: the draft's next tokens while
    the turn has agreed with it, else (with ``lookup``) a guess from the
    context; cut after a stop id and to the room the turn and the forward
    cap leave. Also whether they are a guess."""
    room = min(turn.max_new_tokens - len(run.out), (turn.max_forward or 1) - 1)
    if draft and run.from_draft == len(run.out):
        proposals, guessed = list(draft[len(run.out):len(run.out) + room]), False
    elif lookup:
        proposals, guessed = get_guess(turn, run.out, run.out[-1]), True
    else:
        return [], False
    ends = [i for i, t in enumerate(proposals) if t in turn.stops]
    return proposals[:ends[0] + 1] if ends else proposals, guessed


def check_proposals(turn: Turn, run: Run, proposals: list[int], rows: torch.Tensor, threshold: float,
                    guessed: bool) -> int | None:
    """Keep the proposals the rule agrees with, reading each decision off the
    row before it; returns how many (None: an unstable decision). The first
    it does not agree with is decided there and left pending for the next step."""
    counters, accepted = turn.counters, 0
    for proposal, row in zip(proposals, rows):
        tok, margin = turn.decide(row, run.out)
        if margin <= threshold:
            return None
        if tok != proposal:
            run.pending = (tok, margin)
            break
        run.out.append(tok)
        run.from_draft += int(not guessed)
        run.last_decoded = False
        accepted += 1
        if turn.is_done(run.out):
            break
    if guessed:
        counters.lookup_forwards += 1
        count_lookup(counters, len(proposals), accepted)
    return accepted


def count_draft(counters: Counters, offered: int, accepted: int, fallback: bool) -> None:
    counters.draft_accepted_tokens += accepted
    counters.draft_rejected_tokens += offered - accepted
    counters.draft_fallbacks += int(fallback)


def count_lookup(counters: Counters, offered: int, accepted: int) -> None:
    counters.lookup_accepted_tokens += accepted
    counters.lookup_rejected_tokens += offered - accepted


__all__ = ["Run", "Turn", "TurnLineage", "decode_guarded", "decode_reference", "speculate"]
