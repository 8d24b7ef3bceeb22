"""The distributional audit (paper, Section 4.3 "Exactness", Figure 3).

Under stochastic decoding an exact forget is a claim about distributions: the
behaviour of the post-forget state should be drawn from the same distribution
as that of the counterfactual reference (B5). The audit samples each audited
state ``k`` times (``EvalConfig.samples``, 5) at ``EvalConfig.temperature``
(0.7) with *independent* seeds (every method and every sample set has its
own), and measures four distances between two sample sets:

- **tool consistency** (:func:`tool_disagreement`): the share of cross pairs
  (one sample of each set) whose chosen tools differ;
- **tool TV** (:func:`tool_tv`): the total variation distance between the two
  sets' empirical distributions of chosen tools;
- **n-gram** (:func:`ngram_distance`): 1 - Jaccard similarity of the word
  bigrams the two sets use, pooled per set;
- **embedding** (:func:`embedding_distance`): the mean cosine distance over
  cross pairs of the samples' embeddings, which are the *mean-pooled
  last-layer hidden states of the model under test* over each sample read
  alone (impl/engines/embedding.py: offline, no other model).

A sample is the agent's next move: asked the episode's task query and which
of the case's tools it uses next, the state decodes after an assistant turn
opened with ``Tool: ``. The sample's tool is the first of the case's tools it
names (case-insensitive), else ``other``. (A turn opened with ``CALL `` as a
plan turn is was tried first: SmolLM2-135M then named no tool in any of
several samples, which leaves the tool distances nothing to measure.)

The reference floor is B5 against itself: two sample sets of B5 under
independent seeds. Per episode a method's distance is ``D(method, B5)`` and
the floor's is ``D(B5', B5)`` (B5' here is B5's second, independent sample
set), and one Wilcoxon signed-rank test per distance pairs them over the
episodes (impl/eval/stats.py). B7 should not differ from the floor; B6
(Sanitized-Rebuild) is the positive control that shows the test has power.
Non-significance is not equivalence.
"""

from __future__ import annotations

import hashlib
import math
import re
import weakref
from collections import Counter
from collections.abc import Sequence

from unsee.impl.eval.asking import Asker, get_prompt
from unsee.impl.eval.cases import EvalCase
from unsee.impl.eval.stats import PairedTest, compute_n_for_power, mean, wilcoxon_signed_rank
from unsee.impl.util.text import normalize

#: The reference (B5) and the methods the audit samples: B7 under test, B6 the positive control.
REFERENCE = "reset"
AUDITED = ("replay", "sanitized-rebuild")
#: B5's two independent sample sets: ``a`` is every method's reference, ``b`` the floor's other side.
FLOOR_SETS = ("a", "b")
DISTANCES = ("tool_consistency", "tool_tv", "ngram", "embedding")
DISTANCE_NAMES = {"tool_consistency": "tool consistency", "tool_tv": "tool TV", "ngram": "n-gram",
                  "embedding": "embedding"}
#: word n-gram length of the n-gram distance
NGRAM = 2
#: what opens a sampled turn
ACTION_OPENING = "Tool: "
#: the tool name of a sample that names no tool of the case
OTHER_TOOL = "other"
#: decimal places of a stored embedding component (the rows stay small; cosines move < 1e-4)
EMBEDDING_DIGITS = 5


# --- distances: pure functions of two sample sets ----------------------------------


def tool_disagreement(a: Sequence[str], b: Sequence[str]) -> float | None:
    """The share of cross pairs ``(a[i], b[j])`` naming different tools (the
    tool-consistency distance); None when a set is empty."""
    if not a or not b:
        return None
    return sum(x != y for x in a for y in b) / (len(a) * len(b))


def tool_tv(a: Sequence[str], b: Sequence[str]) -> float | None:
    """Total variation distance between the empirical tool distributions of
    ``a`` and ``b``: half the L1 distance; None when a set is empty."""
    if not a or not b:
        return None
    pa, pb = Counter(a), Counter(b)
    return sum(abs(pa[t] / len(a) - pb[t] / len(b)) for t in set(pa) | set(pb)) / 2


def get_ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    """The word n-grams of ``text`` after normalisation (casefolded,
    punctuation dropped); a text shorter than ``n`` words gives its words as one gram."""
    words = normalize(text).split()
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def ngram_distance(a: Sequence[str], b: Sequence[str], n: int = NGRAM) -> float | None:
    """1 - Jaccard similarity of the word n-grams pooled over each set's
    texts; 0 when neither set has any words, None when a set is empty."""
    if not a or not b:
        return None
    ga = set().union(*(get_ngrams(t, n) for t in a))
    gb = set().union(*(get_ngrams(t, n) for t in b))
    union = ga | gb
    return 1 - len(ga & gb) / len(union) if union else 0.0


def cosine_distance(u: Sequence[float], v: Sequence[float]) -> float:
    """1 - cos(u, v); 1 when either vector is zero."""
    if len(u) != len(v):
        raise ValueError(f"vectors differ in length: {len(u)} and {len(v)}")
    nu, nv = math.sqrt(sum(x * x for x in u)), math.sqrt(sum(x * x for x in v))
    if nu == 0 or nv == 0:
        return 1.0
    return 1 - sum(x * y for x, y in zip(u, v)) / (nu * nv)


def embedding_distance(a: Sequence[Sequence[float] | None],
                       b: Sequence[Sequence[float] | None]) -> float | None:
    """The mean cosine distance over cross pairs of embeddings; a sample with
    no embedding (an empty text: None) is left out; None without pairs."""
    va, vb = [v for v in a if v is not None], [v for v in b if v is not None]
    if not va or not vb:
        return None
    return sum(cosine_distance(u, v) for u in va for v in vb) / (len(va) * len(vb))


def compute_distances(a: dict, b: dict) -> dict[str, float | None]:
    """The four distances between two sample sets (``{"tools", "texts",
    "embeddings"}``, as :func:`sample_set` writes them). A set an archive
    packed (impl/eval/archive.py) carries its embedding distance to B5's set
    ``a``, the only ``b`` it is ever compared with, instead of its embeddings."""
    embeddings_a, embeddings_b = a.get("embeddings"), b.get("embeddings")
    if embeddings_a is not None and embeddings_b is not None:
        embedding = embedding_distance(embeddings_a, embeddings_b)
    else:
        embedding = a.get("embedding_to_reference")
    return {"tool_consistency": tool_disagreement(a["tools"], b["tools"]),
            "tool_tv": tool_tv(a["tools"], b["tools"]),
            "ngram": ngram_distance(a["texts"], b["texts"]),
            "embedding": embedding}


# --- sampling a state ----------------------------------------------------------------


def dist_seed(case: EvalCase, label: str, draw: int) -> int:
    """The seed of sample ``draw`` of sample set ``label`` (a method, or
    ``reset/a``, ``reset/b``): independent across labels, draws and episodes
    (unlike Leak@5's matched seeds)."""
    key = f"dist/{case.suite}/{case.id}/{case.episode.settings.seed}/{label}/{draw}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % (2**62)


def parse_tool(text: str, tools: Sequence[str]) -> str:
    """The tool a sample picks: the one of ``tools`` it names first, as a
    whole word, case-insensitive; :data:`OTHER_TOOL` when it names none."""
    hits = [(m.start(), tool) for tool in tools
            for m in [re.search(rf"(?<![\w]){re.escape(tool)}(?![\w])", text, re.IGNORECASE)] if m]
    return min(hits)[1] if hits else OTHER_TOOL


def get_action_question(task: str, tools: Sequence[str]) -> str:
    """The question a sample answers: the task query, and the tools on offer."""
    return f"{task}\nWhich tool do you use next? Answer with its name: {', '.join(tools)}."


def sample_action(runtime, question: str, max_new_tokens: int, temperature: float, seed: int,
                  asker: Asker | None = None) -> str:
    """One sampled next action of ``runtime``'s state, on a branch that
    shares its lineage copy-on-write (the state is not changed): the text of
    the turn, opened with :data:`ACTION_OPENING`. ``asker``: the state's
    :class:`~unsee.impl.eval.asking.Asker`, whose samples of one question
    share its prefill and their common decode steps (the same tokens)."""
    own = asker is None
    asker = Asker(runtime.engine, runtime.lineage) if own else asker
    try:
        ids = asker.ask(get_prompt(runtime, question, ACTION_OPENING), max_new_tokens, temperature, seed)
    finally:
        if own:
            asker.close()
    return ACTION_OPENING + asker.text(ids)


def sample_set(runtime, case: EvalCase, label: str, k: int, temperature: float, max_new_tokens: int,
               task: str, tools: Sequence[str], embed, asker: Asker | None = None) -> dict:
    """``k`` independent samples of a state: seeds, texts, tools and
    embeddings (``embed(texts)``: one vector or None per text; ``embed``
    None: no embeddings, the embedding distance is then not measured)."""
    question = get_action_question(task, tools)
    seeds = [dist_seed(case, label, i) for i in range(k)]
    texts = [sample_action(runtime, question, max_new_tokens, temperature, s, asker) for s in seeds]
    vectors = embed(texts) if embed is not None else None
    return {"seeds": seeds, "texts": texts, "tools": [parse_tool(t, tools) for t in texts],
            "embeddings": None if vectors is None else [
                None if v is None else [round(x, EMBEDDING_DIGITS) for x in v] for v in vectors]}


#: the most texts :func:`get_embedder` remembers per engine
EMBEDDING_CACHE = 4096
_EMBEDDED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def get_embedder(engine):
    """``texts -> vectors`` from the model under test (impl/engines/embedding.py),
    or None where the engine has no embedder. A text's vector is a function
    of the text alone (read in a context of its own), so a text embedded
    before (samples often repeat) is not embedded again."""
    from unsee.impl.engines.embedding import embed_texts, get_embedding_backend

    try:
        get_embedding_backend(engine)
    except ValueError:
        return None
    known = _EMBEDDED.setdefault(engine, {})

    def embed(texts: Sequence[str]) -> list:
        if len(known) + len(texts) > EMBEDDING_CACHE:
            known.clear()
        new = [t for t in dict.fromkeys(texts) if t not in known]
        if new:
            known.update(zip(new, embed_texts(engine, new)))
        return [known[t] for t in texts]

    return embed


def sample_distribution(runtime, case: EvalCase, config, method: str, task: str,
                        tools: Sequence[str], asker: Asker | None = None) -> dict | None:
    """The audit's sample sets of one row: two for B5 (``a``, ``b``), one
    (``a``) for an audited method, None for any other method or when
    ``config.samples`` is 0. ``asker``: an :class:`~unsee.impl.eval.asking.Asker`
    of this state to sample through (a method whose state equals an earlier
    one's shares its prefill and the decode steps its samples agree on:
    the same tokens); else one of its own."""
    if config.samples <= 0 or (method != REFERENCE and method not in AUDITED):
        return None
    tokens = config.max_new_tokens or case.episode.settings.max_new_tokens
    embed = get_embedder(runtime.engine)
    labels = [f"{REFERENCE}/{s}" for s in FLOOR_SETS] if method == REFERENCE else [method]
    own = asker is None
    asker = Asker(runtime.engine, runtime.lineage) if own else asker  # every sample set of the state: one question
    try:
        sets = {label.rsplit("/", 1)[-1] if method == REFERENCE else "a":
                sample_set(runtime, case, label, config.samples, config.temperature, tokens, task, tools, embed,
                           asker)
                for label in labels}
    finally:
        if own:
            asker.close()
    return {"k": config.samples, "temperature": config.temperature, "ngram": NGRAM,
            "embedder": "mean-pooled last hidden states of the model under test" if embed else None,
            "sets": sets}


def get_dist_methods() -> tuple[str, ...]:
    """The methods whose rows the audit samples: B5 and the audited ones."""
    return (REFERENCE, *AUDITED)


# --- the tests over episodes -----------------------------------------------------------


def get_episode_distances(rows: Sequence[dict]) -> dict[str, list[dict]]:
    """Per method (the floor under the key ``"floor"``), one record per
    episode that has the method's and B5's sample sets: ``{suite, case,
    <distance>: value}``. The floor is ``D(B5 b, B5 a)``, a method's ``D(m a, B5 a)``;
    an episode with B5's sets but no audited method's has no record."""
    by_case: dict[tuple[str, str], dict[str, dict]] = {}
    for row in rows:
        if row.get("dist"):
            by_case.setdefault((row["suite"], row["case"]), {})[row["method"]] = row["dist"]["sets"]
    out: dict[str, list[dict]] = {}
    for (suite, case), sets in sorted(by_case.items()):
        ref = sets.get(REFERENCE)
        if not ref or not set(FLOOR_SETS) <= set(ref) or not set(AUDITED) & set(sets):
            continue  # no floor, or nothing to compare with it (an episode cut short after B5)
        out.setdefault("floor", []).append({"suite": suite, "case": case} | compute_distances(ref["b"], ref["a"]))
        for method in AUDITED:
            if method in sets:
                out.setdefault(method, []).append({"suite": suite, "case": case}
                                                  | compute_distances(sets[method]["a"], ref["a"]))
    return out


def get_pairs(distances: dict[str, list[dict]], method: str, distance: str) -> tuple[list[float], list[float]]:
    """``method``'s distances and the floor's, paired by episode (where both have one)."""
    floor = {(r["suite"], r["case"]): r[distance] for r in distances.get("floor", [])}
    pairs = [(r[distance], floor[(r["suite"], r["case"])]) for r in distances.get(method, [])
             if r[distance] is not None and floor.get((r["suite"], r["case"])) is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def compare_to_floor(distances: dict[str, list[dict]], method: str, distance: str) -> tuple[
        PairedTest, float | None, float | None]:
    """The Wilcoxon signed-rank test of ``method``'s distance against the
    floor's over the episodes where both have one; with the two means."""
    a, b = get_pairs(distances, method, distance)
    return wilcoxon_signed_rank(a, b), mean(a), mean(b)


def summarize_distribution(rows: Sequence[dict]) -> dict:
    """Per audited method and distance: n, the method's and the floor's mean
    distance, the Wilcoxon p and the signed-difference counts (machine-readable)."""
    distances = get_episode_distances(rows)
    out: dict = {}
    for method in AUDITED:
        if method not in distances:
            continue
        for distance in DISTANCES:
            test, m, f = compare_to_floor(distances, method, distance)
            effect, needed = compute_n_for_power(*get_pairs(distances, method, distance))
            out.setdefault(method, {})[distance] = {"n": test.n, "mean": m, "floor": f, "p": test.p,
                                                    "above": test.a_only, "below": test.b_only,
                                                    "effect": effect, "n_for_power": needed}
    return out


__all__ = [
    "AUDITED",
    "DISTANCES",
    "DISTANCE_NAMES",
    "compare_to_floor",
    "compute_distances",
    "cosine_distance",
    "dist_seed",
    "embedding_distance",
    "get_dist_methods",
    "get_episode_distances",
    "get_ngrams",
    "get_pairs",
    "ngram_distance",
    "parse_tool",
    "sample_distribution",
    "sample_set",
    "summarize_distribution",
    "tool_disagreement",
    "tool_tv",
]
