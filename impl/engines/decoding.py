"""The decoding rule every engine applies (greedy or seeded exponential race), the drafts'
measured prefill-versus-decode bounds, and context lookup."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch

#: Ceilings on max |logit_prefill - logit_decode| per (model, device, dtype),
#: measured by ``python -m unsee.bench.discrepancy`` (docs/drafts.md has the
#: distributions). Each is the measured maximum times a safety factor of at
#: least 10; the threshold a decision must clear is twice the bound.
#:
#: smollm2 cpu float32: max 7.5e-5 over 1,440 positions (8 greedy turns of 60
#:   tokens, 1 and 2 threads, verification prefill and decode-after-prefill;
#:   p99 5.4e-5); bound 1e-3, 13x the maximum.
#: tiny cpu float32: max 2.2e-6 over 3,600 positions; bound 5e-5, 23x.
#: tiny-ties cpu float32: max 1.7e-6 over 3,600 positions; bound 5e-5, 29x
#:   (the near-tie family of ``load_model('tiny-ties')``: its margins are far
#:   below any bound, so most of its decisions fall back, by design).
DRAFT_BOUNDS: Mapping[tuple[str, str, str], float] = {
    ("smollm2", "cpu", "float32"): 1e-3,
    ("tiny", "cpu", "float32"): 5e-5,
    ("tiny-ties", "cpu", "float32"): 5e-5,
}
#: The architecture zoo (impl/engines/hf/zoo.py), cpu float32, same method and
#: factor (verify + resume paths, 30 prompts of 60-token greedy turns, 1 and 2
#: threads: 5,400 positions each); tiny-llama is tiny.
#: tiny-qwen2: max 2.3e-6; tiny-qwen3: 2.4e-6; tiny-mistral: 2.2e-6; tiny-phi3:
#:   2.4e-6; tiny-qwen2moe: 2.3e-6; bound 5e-5, 21-23x each.
#: tiny-gemma2: max 4.8e-6, tiny-gemma3: 8.8e-6 (soft-capped, twice as spread
#:   logits); bound 1e-4, 21x and 11x.
DRAFT_BOUNDS = {**DRAFT_BOUNDS, **{(name, "cpu", "float32"): bound for name, bound in (
    ("tiny-llama", 5e-5), ("tiny-qwen2", 5e-5), ("tiny-qwen3", 5e-5), ("tiny-mistral", 5e-5),
    ("tiny-gemma2", 1e-4), ("tiny-gemma3", 1e-4), ("tiny-phi3", 5e-5), ("tiny-qwen2moe", 5e-5))}}


#: The same measurement with ``attn="sdpa"`` (``python -m unsee.bench.discrepancy
#: --model M --attn sdpa``, the eager rows' prompts, tokens, threads and factor;
#: torch 2.13.0+cpu, transformers 5.23.0): sdpa rounds the attention its own way,
#: so its rows are its own.
#:
#: smollm2 cpu float32: max 9.9e-5 over 1,440 positions (8 prompts; p99 5.8e-5);
#:   bound 1e-3, 10x (eager's: 7.5e-5, 13x).
#: tiny cpu float32: max 2.2e-6 over 3,600 positions (20 prompts); bound 5e-5, 23x.
#: tiny-ties cpu float32: max 1.8e-6 over 3,600 positions; bound 5e-5, 28x.
#: The zoo (``--prompts 30``, 5,400 positions each; tiny-gemma2 has no sdpa path in
#: transformers, so it runs ours and reads its eager row): tiny-llama max 2.1e-6,
#: tiny-qwen2 2.4e-6, tiny-qwen3 2.6e-6, tiny-mistral 2.0e-6, tiny-phi3 2.4e-6,
#: tiny-qwen2moe 2.4e-6: bound 5e-5, 19-25x; tiny-gemma3 7.9e-6: bound 1e-4, 13x.
SDPA_DRAFT_BOUNDS: Mapping[tuple[str, str, str], float] = {
    ("smollm2", "cpu", "float32"): 1e-3,
    ("tiny", "cpu", "float32"): 5e-5,
    ("tiny-ties", "cpu", "float32"): 5e-5,
    **{(name, "cpu", "float32"): bound for name, bound in (
        ("tiny-llama", 5e-5), ("tiny-qwen2", 5e-5), ("tiny-qwen3", 5e-5), ("tiny-mistral", 5e-5),
        ("tiny-gemma3", 1e-4), ("tiny-phi3", 5e-5), ("tiny-qwen2moe", 5e-5))},
}

#: The shipped table of each attention implementation. ``unsee_eager`` gives
#: eager's bits (docs/engines.md, "Attention and dtypes"), so it reads eager's rows.
DRAFT_BOUNDS_BY_ATTN: Mapping[str, tuple[str, Mapping[tuple[str, str, str], float]]] = {
    "eager": ("DRAFT_BOUNDS", DRAFT_BOUNDS), "unsee_eager": ("DRAFT_BOUNDS", DRAFT_BOUNDS),
    "sdpa": ("SDPA_DRAFT_BOUNDS", SDPA_DRAFT_BOUNDS)}


def get_draft_bound_row(name: str, device: str, dtype: str, attn: str = "eager") -> tuple[float, str] | None:
    """The shipped bound of a configuration and the row it came from, in words
    (``DRAFT_BOUNDS('tiny', 'cpu', 'float32')``), or None where no row holds it."""
    kind = "cuda" if device.startswith("cuda") else device
    table_name, table = DRAFT_BOUNDS_BY_ATTN.get(attn, ("", {}))
    bound = table.get((name, kind, dtype))
    return None if bound is None else (bound, f"{table_name}{(name, kind, dtype)}")


def get_draft_bound(name: str, device: str, dtype: str, attn: str = "eager") -> float | None:
    """The measured discrepancy bound of a configuration, or None (drafts off)."""
    row = get_draft_bound_row(name, device, dtype, attn)
    return None if row is None else row[0]


@runtime_checkable
class Constraint(Protocol):
    """A rule over a turn's next token that reads what the turn decided so far (``out``): a
    grammar (a tool call's, a response format's), stop texts. It must be a function of ``out``
    alone, whatever order or path the turn took to reach it (a verification forward, a
    fallback to the reference, a forget's replay), so that a replayed turn is decided as the
    twin's is (A1)."""

    def get_allowed(self, out: Sequence[int]) -> torch.Tensor | None:
        """The tokens allowed after ``out``: a bool tensor over the vocabulary with at least one
        True, or None (any token)."""

    def is_done(self, out: Sequence[int]) -> bool:
        """Whether the turn ends after ``out`` (a stop text written, a grammar closed)."""


@dataclass(frozen=True)
class Rule:
    """What decides a turn's tokens besides the temperature and the seed, all of it a function
    of the logits and of the turn's own tokens so far, so a replay decides as the twin does.

    top_p               the nucleus: at temperature > 0 the race runs over the smallest set
                        of tokens whose probability (at that temperature) reaches top_p
    frequency_penalty   subtracted from a token's logit once per time the turn wrote it
    presence_penalty    subtracted once from the logit of a token the turn wrote at all
    constraints         :class:`Constraint` s: their allowed sets intersect, and the turn
                        ends where one says it is done
    on_decision         told ``(position, token, scores)`` at each decision, ``scores``
                        being the logits after penalties and masks (what log-probabilities
                        are read from); a position may be decided again (a fallback), and
                        the last call for a position is the turn's
    """

    top_p: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    constraints: tuple[Constraint, ...] = ()
    on_decision: Callable[[int, int, torch.Tensor], None] | None = None

    def is_plain(self) -> bool:
        """Whether the rule changes nothing of the plain decoding rule."""
        return (self.top_p >= 1.0 and self.frequency_penalty == 0 and self.presence_penalty == 0
                and not self.constraints)

    def is_done(self, out: Sequence[int]) -> bool:
        return any(c.is_done(out) for c in self.constraints)


PLAIN = Rule()


def apply_rule(scores: torch.Tensor, rule: Rule, out: Sequence[int]) -> torch.Tensor:
    """``scores`` (fp32 logits) after the rule's penalties and masks, a new tensor: the
    penalties by the turn's own tokens (OpenAI's and vLLM's sense: the generated text), then
    every constraint's allowed set (others at -inf)."""
    if rule.frequency_penalty or rule.presence_penalty:
        scores = scores.clone()
        if out:
            ids = torch.tensor(list(out), dtype=torch.long)
            counts = torch.bincount(ids, minlength=scores.shape[-1])[:scores.shape[-1]].to(torch.float32)
            scores -= rule.frequency_penalty * counts + rule.presence_penalty * (counts > 0).to(torch.float32)
    for constraint in rule.constraints:
        allowed = constraint.get_allowed(out)
        if allowed is not None:
            # in numpy: a torch op over the vocabulary waits for torch's thread pool where the
            # forwards keep the cores busy (impl/engines/constraints.py, to_mask)
            kept = np.asarray(allowed)[:scores.shape[-1]]
            scores = torch.from_numpy(np.where(kept, scores.numpy(), np.float32("-inf")).astype(np.float32, copy=False))
    return scores


def apply_top_p(scores: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """``scores`` with every token outside the nucleus at -inf: the smallest set, in order of
    probability (ties by token id, a stable sort), whose mass at ``temperature`` reaches
    ``top_p``; the most likely token is always kept."""
    probs = torch.softmax(scores / temperature, dim=-1)
    order = torch.sort(probs, descending=True, stable=True).indices
    before = torch.cumsum(probs[order], dim=-1) - probs[order]  # the mass ranked above each token
    dropped = order[before >= top_p]
    dropped = dropped[dropped != order[0]]
    return scores.index_fill(-1, dropped, float("-inf"))


def get_scores(logits: torch.Tensor, temperature: float, seed: int | None, position: int,
               rule: Rule = PLAIN, out: Sequence[int] = ()) -> torch.Tensor:
    """What the decoding rule maximises at ``position`` of a turn, in fp32 on CPU.

    Greedy: the logits. Sampling: an exponential race, ``logits / T - log E``
    with ``E ~ Exp(1)`` per vocabulary entry, drawn from a generator seeded by
    ``(seed, position)`` alone. Its argmax is a sample of ``softmax(logits/T)``,
    and the noise at a position does not depend on how the earlier positions
    were decided, so a verifier can recompute it for any draft position.
    ``rule`` (:class:`Rule`) penalises and masks the logits first, by the turn's
    tokens so far (``out``, ``position`` of them), and cuts the race to its nucleus.
    """
    scores = logits.detach().to("cpu", torch.float32)
    if rule is not PLAIN:
        scores = apply_rule(scores, rule, out)
    if temperature == 0:
        return scores
    if rule.top_p < 1.0:
        scores = apply_top_p(scores, temperature, rule.top_p)
    gen = torch.Generator(device="cpu").manual_seed((int(seed) * 1_000_003 + position) % (2**63))
    noise = torch.empty(scores.shape[-1], dtype=torch.float32).exponential_(generator=gen)
    return scores / temperature - torch.log(noise)


def pick(scores: torch.Tensor) -> tuple[int, float]:
    """The decision (first index among equal maxima) and its margin over the runner-up (the
    largest score left once the decision's own entry is taken out: 0 where the maximum is tied)."""
    if scores.shape[-1] < 2:
        return 0, float("inf")
    if scores.dim() == 1 and scores.device.type == "cpu" and scores.dtype == torch.float32:
        # numpy's reductions on the vocabulary's scores: the same decision and margin, about 0.03 ms
        # where torch's topk and argmax took 0.38 ms a token (every decode step pays it)
        values = scores.numpy(force=True)
        best = int(values.argmax())  # the first of equal maxima, as torch.argmax
        runner_up = max(values[:best].max(initial=-np.inf), values[best + 1:].max(initial=-np.inf))
        return best, float(values[best] - np.float32(runner_up))
    top = torch.topk(scores, 2)
    best = int(torch.argmax(scores))  # argmax, not topk's index: the first of equal maxima
    return best, float(top.values[0] - top.values[1])


def get_threshold(bound: float, temperature: float) -> float:
    """The margin a decision taken on verification logits must exceed."""
    return 2 * bound / temperature if temperature > 0 else 2 * bound


#: Context lookup (after a draft fails): the n-gram lengths matched against
#: the lineage, longest first, and the most tokens guessed per forward. On
#: the token streams of Table 1's counterfactual (docs/bench.md), simulated
#: offline: n-grams of 3 then 2 and guesses of 8 tokens cut the changed
#: turns' decoded tokens from 80 to 48 with 3 wasted guesses; adding 1-grams
#: cut them to 42 but wasted 19 guesses (a 1-token match is weak evidence),
#: and guesses of 16 gained nothing over 8.
LOOKUP_NGRAMS = (3, 2)

LOOKUP_TOKENS = 8


def get_lookup(history: Sequence[int], limit: int, ngrams: Sequence[int] = LOOKUP_NGRAMS,
               max_tokens: int = LOOKUP_TOKENS) -> list[int]:
    """A guess at what follows ``history`` (a lineage's tokens, the newly
    decided token last): the tokens that followed the most recent earlier
    occurrence of its last ``n`` tokens, for the first ``n`` of ``ngrams``
    that occurs; at most ``min(limit, max_tokens)`` of them; [] if none."""
    size = min(limit, max_tokens)
    end = len(history)
    if size <= 0:
        return []
    for n in ngrams:
        if end <= n:
            continue
        pattern = list(history[end - n:])
        last = pattern[-1]
        # candidate occurrences end at i (inclusive), strictly before the suffix itself
        for i in range(end - 2, n - 2, -1):
            if history[i] == last and list(history[i - n + 1:i + 1]) == pattern:
                return list(history[i + 1:i + 1 + size])
    return []
