"""Verified draft replay: the turn a model wrote before a forget is a free
draft of the turn it writes in the counterfactual.

During a forget's replay each model turn after the restore boundary has a
*draft*: the tokens the same step produced before the forget. The engine
prefills header + draft in one chunk, reads the logits at every position and
accepts the longest prefix of the draft that the decoding rule itself would
have produced (``KVEngine.generate(..., draft=...)``). A fully accepted turn
costs one prefill and no decode step; ordinary decoding resumes at the first
disagreement.

The exactness guard
-------------------
The reference (a full reset, B5) decides token ``k`` of a turn from the
logits of a one-token decode step; verification reads them from a
multi-token forward. The two differ in the last bits (different matmul
shapes and summation orders). A decision taken on verification logits is
therefore accepted only when it is *stable*: its score beats the runner-up's
by more than ``2 * bound``, where ``bound`` is a ceiling on the element-wise
difference ``|logit_prefill - logit_decode|``. If every logit moves by at most
``bound``, a gap above ``2 * bound`` cannot close, so the reference takes
the same decision. Under seeded sampling the compared quantity is the
exponential race's score ``logit / T - log E`` (see ``get_scores``); its
noise term is identical on both paths, so the logit bound scales by ``1/T``.

The same guard covers the tokens decoded after the first disagreement, since
they are decoded on KV that the verification prefill built (not token by
token, as in the reference). At any unstable decision the engine falls back
to the reference procedure for that turn: it crops back to the header and
re-decodes the whole turn one token at a time, which is bitwise what B5 does.
A draft whose first token is already wrong needs no guard at all: the header
logits are the reference's own, and decoding from them is the reference.

Probing before verifying
------------------------
A verification forward over a draft that turns out wrong at its second token
is spent for one token's worth of information. Most of the drafts a forget
rejects are rejected there: a turn that depends on the target usually keeps
its opening word and changes right after it. So the engine can *probe*
first: feed the draft's first token as one decode step, exactly the
reference's own first step, and check the second token on those logits. A
draft wrong there is decoded on from the reference's own state (no guard, no
verification forward); a draft right there is verified as before, and the
probe step is spent. ``Drafts.should_probe`` decides per turn from what the
earlier turns of the same replay did, counting drafts that quote a forgotten
item (``QUOTE_WORDS``) apart from those that do not (see ``PROBE_ABOVE``).

Guessing from the context after a draft fails
---------------------------------------------
A turn that changed keeps changing after its first new token, but what it
writes next is often already in the lineage: SmolLM2 copies names and
phrases from the conversation, and answers to similar questions repeat one
another. So after a draft has failed (or when it was wrong from the start),
each decided token ``t`` is not fed alone: the engine looks for the last
earlier occurrence of the turn's last few tokens, ``t`` included, in the
lineage (``get_lookup``: prompt lookup, ``LOOKUP_NGRAMS``), and feeds ``t``
plus up to ``LOOKUP_TOKENS`` tokens that followed that occurrence in one
forward. The guess's longest agreeing prefix is accepted, decision by
decision, under the same guard; the first disagreement is itself decided on
that forward's logits. A guess costs no extra forward, only a wider one (the
forward feeding ``t`` had to run anyway), and from the first such forward on
every decision of the turn is guarded, since the KV is no longer the
reference's. An unstable decision falls back as above.

What is guaranteed: forget-with-drafts equals the full reset bit for bit
whenever the prefill-versus-decode discrepancy of the configuration stays
within its bound. The bounds below are measurements with a safety factor, not
proofs: ``DRAFT_BOUNDS`` names each measured configuration, and every other
configuration (another model, a GPU, bf16, ...) runs with drafts off, which is
exact by construction. ``python -m unsee.bench.discrepancy`` re-measures.
"""

from __future__ import annotations

import contextlib
import re
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence

import attrs

from unsee.impl.engines.counts import Counters
from unsee.impl.engines.protocol import Assist
from unsee.impl.engines.speculation import DraftPolicy
from unsee.impl.util.ids import get_step_id


@attrs.frozen
class Draft:
    """One turn's draft: the old tokens, and whether to trust them unverified
    (B7-oracle's attribution-oracle label) or verify them (B7)."""

    tokens: tuple[int, ...]
    trusted: bool = False
    quotes: bool = False  # repeats words of a forgotten item (``is_quoting``)


@attrs.frozen
class TurnCost:
    """What one replayed model turn cost (the forget report lists them): the
    engine's counts over the turn (``spent``, the one record of counts) and
    what the replay knew of its draft. The report shows them by the names of
    :data:`TURN_KEYS`."""

    block: str
    draft: int  # draft tokens offered (0: no draft)
    spent: Counters  # the engine's work over the turn (verification, decode steps, its commit)
    trusted: bool = False
    generated: int = 0  # tokens the turn committed (its canonical chunk)
    quotes: bool = False  # the draft quoted a forgotten item (probes are estimated apart)
    #: the turn's forwards as they ran, (tokens, seconds, commit): recorded under a draft
    #: policy, which reads them to settle what the drafts saved (:func:`compute_balance`)
    timings: tuple[tuple[int, float, bool], ...] = attrs.field(default=(), converter=tuple)

    accepted = property(lambda self: self.spent.draft_accepted_tokens)
    rejected = property(lambda self: self.spent.draft_rejected_tokens)
    decoded = property(lambda self: self.spent.decoded_tokens)
    prefilled = property(lambda self: self.spent.prefilled_tokens)
    fallback = property(lambda self: bool(self.spent.draft_fallbacks),
                        doc="Re-decoded from the header at an unstable decision.")
    probed = property(lambda self: bool(self.spent.draft_probes),
                      doc="A one-token probe came before the verification.")
    lookups = property(lambda self: self.spent.lookup_forwards,
                       doc="Forwards that also verified a guess from the context (``get_lookup``).")
    looked_up = property(lambda self: self.spent.lookup_accepted_tokens + self.spent.lookup_rejected_tokens,
                         doc="Guessed tokens those forwards verified (counted in ``prefilled``).")
    lookup_accepted = property(lambda self: self.spent.lookup_accepted_tokens,
                               doc="Of them, accepted instead of decoded.")
    forwards = property(lambda self: self.spent.forward_calls)

    @classmethod
    def from_spent(cls, block: str, draft: Draft | None, spent: Counters, generated: int,
                   timings: Iterable[tuple[int, float, bool]] = ()) -> TurnCost:
        """A decoded turn's cost from the engine's counters over it (``spent``: a
        :class:`~unsee.impl.engines.counts.Counters` difference) and its forwards' ``timings``."""
        return cls(block, len(draft.tokens) if draft else 0, spent, generated=generated,
                   quotes=draft is not None and draft.quotes, timings=timings)

    @classmethod
    def from_trusted(cls, block: str, draft: Draft) -> TurnCost:
        """A trusted draft's turn (B7-oracle): its tokens re-prefilled as they were
        (counted as prefilled, not as a measured forward)."""
        n = len(draft.tokens)
        return cls(block, n, Counters(prefilled_tokens=n), trusted=True, generated=n)

    def to_json(self) -> dict:
        """The turn as the report lists it (:data:`TURN_KEYS`)."""
        return {key: getattr(self, key) for key in TURN_KEYS}

    @property
    def is_early_miss(self) -> bool:
        """Right at its first token and wrong at its second: the case a probe saves."""
        return self.accepted == 1 and self.rejected > 0 and not self.fallback

    @property
    def excess_prefilled(self) -> int:
        """Tokens prefilled beyond the turn's canonical chunk and its context
        guesses: a verification forward whose chunk was not kept (the draft
        went wrong in it, or an unstable decision sent the turn back to its
        header)."""
        return self.prefilled - self.generated - self.looked_up


#: The keys of a replayed turn in the forget report (:meth:`TurnCost.to_json`), in order.
TURN_KEYS = ("block", "draft", "accepted", "rejected", "decoded", "prefilled", "fallback", "trusted", "probed",
             "generated", "quotes", "lookups", "looked_up", "lookup_accepted", "forwards")


#: Probe when the estimated chance that a draft which passed its first token
#: is wrong at its second exceeds this. A probe that finds the draft right
#: wastes one decode step (cost d); skipping it when the draft is wrong there
#: wastes one verification forward (cost v). Probing pays when p * v > (1 - p) * d,
#: i.e. p > d / (d + v). On CPU a 20-token forward with logits at every
#: position costs about two one-token forwards (both stream every weight once;
#: the longer one adds its LM head over 20 positions; SmolLM2, one thread, 600
#: tokens of context: 94 ms against 200-230 ms), so v ~ 2d and the threshold
#: is 1/3.
PROBE_ABOVE = 1 / 3

#: A draft that repeats this many consecutive words of a forgotten item (or
#: the whole item, when it is shorter) *quotes* it. The counterfactual never
#: saw those words, so such a draft is wrong somewhere, and turns that quote
#: what a forget removes mostly keep their opening word and change right after
#: it: on SmolLM2 (Table 1 of docs/bench.md and a 4-turn variant of it), 8 of
#: the 11 quoting drafts that passed their first token were wrong at their
#: second, against 0 of 5 drafts that quote nothing. The signal decides cost
#: only: a probe is exact either way.
QUOTE_WORDS = 3

#: The estimate of ``PROBE_ABOVE``'s chance is (misses + a) / (turns + a + b)
#: over this replay's earlier turns of the same kind (quoting or not) whose
#: draft passed its first token: a Beta(a, b) prior updated by what the replay
#: saw. Plain drafts start at 1/2 (a replay starts by probing; one plain draft
#: that holds past its second token stops it until a miss), quoting drafts at
#: 2/3 (probed until three of them hold with no miss among them).
PROBE_PRIORS = {False: (1, 1), True: (2, 1)}


def get_words(text: str) -> list[str]:
    """Lower-cased word tokens: the unit in which drafts and items are compared
    (token ids would not do: the same words tokenise differently mid-sentence)."""
    return re.findall(r"\w+", text.lower())


def get_quote_ngrams(texts: Iterable[str], n: int = QUOTE_WORDS) -> frozenset[tuple[str, ...]]:
    """Every run of ``n`` consecutive words of the forgotten items ``texts``
    (an item shorter than ``n`` words is one run of its own length)."""
    runs = set()
    for text in texts:
        words = get_words(text)
        if words:
            size = min(n, len(words))
            runs.update(tuple(words[i:i + size]) for i in range(len(words) - size + 1))
    return frozenset(runs)


def is_quoting(text: str, ngrams: frozenset[tuple[str, ...]]) -> bool:
    """Whether ``text`` contains one of the word runs ``ngrams`` (``get_quote_ngrams``)."""
    words = get_words(text)
    for size in {len(g) for g in ngrams}:
        if any(tuple(words[i:i + size]) in ngrams for i in range(len(words) - size + 1)):
            return True
    return False


@attrs.frozen
class Drafts:
    """The drafts of one replay, by model-turn block id, and the costs of the
    turns replayed so far (``turns``): a value that a replay runtime replaces
    at each turn (:meth:`with_turn`) and the forget reads back. ``policy``: the
    engine's draft policy (impl/engines/speculation.py), where it sizes its
    forwards by a credit; None where a draft is verified in one forward."""

    drafts: Mapping[str, Draft] = attrs.field(converter=dict)
    bound: float | None
    #: guess from the context once a turn's draft has failed (``get_lookup``)
    lookup: bool = True
    policy: DraftPolicy | None = None
    turns: tuple[TurnCost, ...] = attrs.field(default=(), converter=tuple)
    #: why drafting stopped for the rest of this replay (None: it has not; :meth:`with_turn`)
    stopped: str | None = None

    def get(self, block_id: str) -> Draft | None:
        return self.drafts.get(block_id)

    def with_turn(self, cost: TurnCost) -> Drafts:
        """These drafts after one more replayed turn, which cost ``cost``. Under a policy, drafting
        stops for the rest of the replay once its drafts have lost, over its turns so far and at
        the costs its own forwards measured (:func:`compute_balance`), more than a turn's opening
        may: the cost table said they could pay, and this replay says otherwise."""
        turns = (*self.turns, cost)
        stopped = self.stopped
        if stopped is None and self.policy is not None and cost.timings:
            balance = compute_balance(self.policy, turns)
            if balance < -self.policy.opening - 1e-9:
                stopped = (f"stopped after turn {cost.block}: drafts had lost {-balance:.2f} decode steps over "
                           f"{len(turns)} turn(s), more than a turn's opening ({self.policy.opening:.2f}), at the "
                           "costs this forget's own forwards measured; the rest decoded without them")
        return attrs.evolve(self, turns=turns, stopped=stopped)

    def get_assist(self, draft: Draft | None) -> Assist:
        """What the next model turn's ``generate`` may verify: its draft, and
        whether to probe it first and to guess from the context (nothing once stopped)."""
        if self.stopped is not None:
            return Assist()
        return Assist(draft=draft.tokens if draft is not None else None,
                      probe=draft is not None and self.should_probe(draft), lookup=self.should_lookup())

    def should_probe(self, draft: Draft) -> bool:
        """Whether the turn with ``draft`` should probe before verifying: when
        the estimated chance that it is wrong at its second token exceeds
        ``PROBE_ABOVE``, estimated over the earlier turns that quote a forgotten
        item as it does, or that quote none as it does (``PROBE_PRIORS``).
        Never under a policy: its first forward risks only the opening's few
        proposals, which is what a probe was for, and a probe would add a
        forward to every draft that holds."""
        return self.policy is None and self.get_miss_estimate(draft.quotes) > PROBE_ABOVE

    def should_lookup(self) -> bool:
        """Whether the next turn guesses from the context. Under a policy, while
        a guessed token pays: it saves a decode step when kept and costs
        ``per_token`` when fed, so the replay guesses while the share of its
        guessed tokens kept, ``(kept + 1) / (fed + 2)`` over its earlier turns,
        exceeds ``per_token`` (each turn's guesses still ride its credit)."""
        if not self.lookup or self.policy is None:
            return self.lookup
        fed, kept = sum(t.looked_up for t in self.turns), sum(t.lookup_accepted for t in self.turns)
        return (kept + 1) / (fed + 2) > self.policy.per_token

    def get_miss_estimate(self, quotes: bool) -> float:
        """The estimated chance that a draft (quoting or not) which passed its
        first token is wrong at its second (``PROBE_PRIORS``)."""
        seen = [t for t in self.turns
                if t.draft > 0 and t.accepted >= 1 and not t.trusted and not t.fallback and t.quotes == quotes]
        misses = sum(t.is_early_miss for t in seen)
        a, b = PROBE_PRIORS[quotes]
        return (misses + a) / (len(seen) + a + b)

    def __len__(self) -> int:
        return len(self.drafts)

    @classmethod
    def from_blocks(cls, blocks: Iterable, bound: float | None, trusted: Iterable[str] = (),
                    forgotten: Iterable[str] = (), lookup: bool = True, policy: DraftPolicy | None = None) -> Drafts:
        """Drafts from the pre-forget model turns: each block's tokens after
        its header chunk (``chunks == (header, turn)``); ``forgotten`` are the
        texts of the items the forget removes, which mark quoting drafts."""
        trusted = set(trusted)
        ngrams = get_quote_ngrams(forgotten)
        drafts = {}
        for block in blocks:
            if len(block.chunks) == 2:
                header = block.chunks[0]
                drafts[block.id] = Draft(tuple(block.tokens[header:]), block.id in trusted,
                                         bool(ngrams) and is_quoting(block.text, ngrams))
        return cls(drafts, bound, lookup, policy)

    def get_totals(self) -> dict:
        """The replayed turns' costs summed (:func:`get_totals`)."""
        return get_totals(self.turns)


def get_totals(turns: Sequence[TurnCost]) -> dict:
    """What the replayed ``turns`` cost together, as the report's drafts totals show it."""
    keys = ("draft", "accepted", "rejected", "decoded", "prefilled", "lookups", "looked_up", "lookup_accepted",
            "forwards")
    totals = {k: sum(getattr(t, k) for t in turns) for k in keys}
    totals["turns"] = len(turns)
    totals["fallbacks"] = sum(t.fallback for t in turns)
    totals["fully_accepted_turns"] = sum(t.draft > 0 and t.accepted == t.draft and not t.fallback for t in turns)
    totals["probes"] = sum(t.probed for t in turns)
    totals["quoting"] = sum(t.quotes for t in turns)
    return totals


def time_forwards(engine, drafts: Drafts | None, timings: list) -> contextlib.AbstractContextManager:
    """Around a replayed turn under a draft policy: append each of ``engine``'s forwards as
    (tokens, seconds, commit) to ``timings``, which the policy settles its drafts by
    (:meth:`Drafts.with_turn`); nothing where no policy drafts (or it has stopped). A forward's
    seconds are its wall time, or the process's CPU time since the last forward where that is
    less: a shared machine's other work stretches the one, never the other."""
    if drafts is None or drafts.policy is None or drafts.stopped is not None:
        return contextlib.nullcontext()
    last = [time.process_time()]

    def timed(commit: bool):
        def on_forward(n: int, started: float) -> None:
            wall, cpu, last[0] = time.perf_counter() - started, time.process_time() - last[0], time.process_time()
            timings.append((n, min(wall, cpu), commit))
        return on_forward
    return engine.hook_forwards(timed(False), timed(True))


def get_measured_costs(policy: DraftPolicy, turns: Sequence[TurnCost]) -> dict[int, float]:
    """A forward's cost in decode steps by size, as this replay's own forwards measured it: the
    median forward of each size over the median one-token forward (the commits' re-prefills
    left out); sizes it has not run are the policy's table's (:meth:`DraftPolicy.get_cost`)."""
    seconds: dict[int, list[float]] = {}
    for turn in turns:
        for n, spent, commit in turn.timings:
            if not commit:
                seconds.setdefault(n, []).append(spent)
    step = statistics.median(seconds[1]) if 1 in seconds else 0.0
    if step <= 0:
        return {}
    return {n: statistics.median(t) / step for n, t in seconds.items() if n >= 2}


def compute_turn_saving(policy: DraftPolicy, turn: TurnCost, costs: Mapping[int, float]) -> float:
    """What a turn's drafts saved, in decode steps (negative: lost): decoding its ``generated``
    tokens takes one forward a token but the last, and a forward to commit it (feeding its last
    token, or re-prefilling it whole, which both paths do alike and is left out of both); its own
    forwards cost what ``costs`` (else the policy's table) says."""
    refed = any(commit for _, _, commit in turn.timings)
    decoding = max(turn.generated - 1, 0) + (0 if refed else 1)
    spent = sum(costs.get(n) or policy.get_cost(n) for n, _, commit in turn.timings if not commit)
    return decoding - spent


def compute_balance(policy: DraftPolicy, turns: Sequence[TurnCost]) -> float:
    """What a replay's drafts have saved so far, in decode steps, over its turns that recorded
    their forwards, at the costs its own forwards measured (:func:`get_measured_costs`)."""
    costs = get_measured_costs(policy, turns)
    return sum(compute_turn_saving(policy, t, costs) for t in turns if t.timings)


@attrs.frozen
class DraftsAccount:
    """The forget report's account of how a replay used drafts (``ForgetReport.drafts``):
    :func:`choose_drafts` chooses it, ``plan_replay`` adds where the bound came from
    (:meth:`with_plan`) and ``get_replayed`` what the turns cost (:meth:`with_turns`).
    :meth:`none` is the account of a forget that replayed no model turn (a reset)."""

    mode: str  # "verify", "oracle" or "off"
    why: str
    bound: float | None = None  # the prefill-versus-decode bound the guard used (None: none measured)
    lookup: bool | None = None  # verify: whether decoded turns guessed from the context
    labelled_steps: tuple[str, ...] | None = None  # oracle: the steps its labels call independent
    #: chosen for a replay (False: no replay ran, and the report shows only ``mode`` and ``why``)
    chosen: bool = True
    bound_source: str | None = None  # "calibrated: ..." on this CPU, or shipped from another
    policy: DraftPolicy | None = None  # the engine's draft policy, where drafts sized their forwards by it
    cpu_isa: str | None = None  # the instruction set the bound was applied on (``get_cpu_isa``)
    turns: tuple[TurnCost, ...] | None = None  # the replayed model turns (None: no drafts replayed)
    stopped: str | None = None  # why the replay stopped drafting partway (``Drafts.with_turn``)

    @classmethod
    def none(cls) -> DraftsAccount:
        """The account of a forget that replayed no model turn from drafts."""
        return cls("off", "no replay of model turns from drafts", chosen=False)

    def with_plan(self, bound_source: str | None, policy: DraftPolicy | None, cpu_isa: str) -> DraftsAccount:
        """This account with the plan's facts: where the bound came from, the draft policy and the CPU."""
        return attrs.evolve(self, bound_source=bound_source, policy=policy, cpu_isa=cpu_isa)

    def with_turns(self, turns: Iterable[TurnCost], stopped: str | None = None) -> DraftsAccount:
        """This account once the replay's model turns have cost ``turns`` (``stopped``: why it
        stopped drafting partway, if it did)."""
        return attrs.evolve(self, turns=tuple(turns), stopped=stopped)

    @property
    def totals(self) -> dict | None:
        """The replayed turns' costs summed (:func:`get_totals`); None where no drafts were replayed."""
        return None if self.turns is None else get_totals(self.turns)

    def to_json(self) -> dict:
        """The account as the report writes it (:data:`DRAFTS_ACCOUNT_KEYS`, in order): the
        bound, its source and the CPU wherever drafts were chosen for a replay, and each
        other field only where it is set."""
        fields = {"mode": self.mode, "bound": self.bound, "lookup": self.lookup,
                  "labelled_steps": None if self.labelled_steps is None else list(self.labelled_steps),
                  "why": self.why, "stopped": self.stopped, "bound_source": self.bound_source,
                  "policy": None if self.policy is None else self.policy.to_json(), "cpu_isa": self.cpu_isa,
                  "totals": self.totals, "turns": None if self.turns is None else [t.to_json() for t in self.turns]}
        # a chosen account names its bound, source and CPU even where they are None (none measured)
        written = ("mode", "why", "bound", "bound_source", "cpu_isa") if self.chosen else ("mode", "why")
        return {key: fields[key] for key in DRAFTS_ACCOUNT_KEYS if key in written or fields[key] is not None}


#: The keys of the report's drafts account (:meth:`DraftsAccount.to_json`), in order.
DRAFTS_ACCOUNT_KEYS = ("mode", "bound", "lookup", "labelled_steps", "why", "stopped", "bound_source", "policy", "cpu_isa",
                       "totals", "turns")


def choose_drafts(lm, bound: float | None, blocks: Sequence, steps: Sequence, boundary: int, wanted: bool | None,
                  oracle: bool, pending: Iterable[str] = (), lookup: bool = True,
                  policy: DraftPolicy | None = None) -> tuple[Drafts | None, DraftsAccount]:
    """The drafts of a replay from ``boundary``: the model turns written after
    it, before the forget (of ``blocks``, the session's; ``steps``: its
    observation log); returns the drafts (None: every turn decoded) and the
    report's account of the choice. The items of the ``pending`` sources mark the drafts that
    quote them (probed); ``lookup`` adds guesses from the context where a
    turn is decoded. ``lm`` names the configuration whose ``bound`` it is;
    ``policy`` is the engine's draft policy (None: whole drafts)."""
    blocks = [b for b in blocks if b.turn > boundary]
    if oracle:
        labelled = {s.id for s in steps[boundary:] if getattr(s, "independent", False)}
        trusted = [b.id for b in blocks if get_step_id(b.id) in labelled]
        # the oracle trusts its labels; unlabelled turns are decoded as B7 without drafts would
        chosen = [b for b in blocks if b.id in set(trusted)]
        return Drafts.from_blocks(chosen, bound, trusted, lookup=False), DraftsAccount(
            "oracle", "B7-oracle: turns labelled independent re-prefilled unverified", bound,
            labelled_steps=tuple(sorted(labelled)))
    if wanted is False:
        return None, DraftsAccount("off", "drafts turned off by the caller", bound)
    if bound is None:
        if wanted:
            raise ValueError(f"drafts were asked for, but no prefill-versus-decode bound was measured for "
                             f"{lm.name} on {lm.device} {lm.dtype} (`unsee calibrate` measures one)")
        return None, DraftsAccount("off", f"no prefill-versus-decode bound measured for {lm.name} on "
                                          f"{lm.device} {lm.dtype}: every turn re-decoded (`unsee calibrate` "
                                          "measures one)")
    if policy is not None and not policy.pays and not wanted:
        return None, DraftsAccount("off", f"drafts cannot pay on {lm.name} here ({policy.source}): "
                                          f"{policy.why}; every turn decoded (forget(..., drafts=True) drafts "
                                          "anyway)", bound)
    pending = set(pending)
    forgotten = [i.text for s in steps for i in s.items if i.source in pending]
    return Drafts.from_blocks(blocks, bound, forgotten=forgotten, lookup=lookup, policy=policy), DraftsAccount(
        "verify", f"verified drafts{' and context guesses' if lookup else ''}, decisions accepted above a "
                  f"margin of 2 x {bound:g}", bound, lookup=lookup)
