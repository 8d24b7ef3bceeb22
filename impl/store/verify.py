"""``unsee verify``: check a stored session's erasure receipt independently
(docs/persistence.md, "Receipts and verify").

The store is opened read-only and read in one short snapshot (a writer in
another process waits at most that long); everything after that works on the
snapshot. The counterfactual is rebuilt as a *full reset* (B5,
:meth:`AgentRuntime.full_reset`) from ``R_0`` over the stored, sanitised
observation log on the named model: no checkpoint, draft or cached state the
forget itself used is reused. Outcomes:

- ``verified``: every check passed;
- ``failed``: a check failed; the message names it (a changed receipt or
  store, a source put back, another model, a residue of the given value);
- ``cannot verify here``: the rebuilt digest differs, and so does the
  environment it depends on (versions, CPU features, device...), which the
  message names: a different machine, not evidence of a false receipt.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from unsee.impl.agent.loading import load_runtime
from unsee.impl.engines.llamacpp.engine import LlamaCppMissingError
from unsee.impl.engines.registry import load_model_for, make_engine
from unsee.impl.store.backend import read_stored_engine
from unsee.impl.store.receipt import (
    ReceiptError,
    environment,
    environment_differences,
    generated_hash,
    generated_of,
    log_hash,
    parse_receipt,
    receipt_summary,
    weights_hash,
)
from unsee.impl.store.records import find_residue, record_hash, session_files
from unsee.impl.store.schema import StoreError
from unsee.impl.store.sqlite import SessionStore

VERIFIED, FAILED, CANNOT = "verified", "failed", "cannot verify here"


@attrs.frozen
class Check:
    name: str
    status: str  # "ok" | "failed" | "cannot" | "skipped"
    detail: str = ""


@attrs.define
class Verdict:
    """What :func:`verify_store` found: the outcome and every check."""

    path: str
    checks: list[Check] = attrs.field(factory=list)
    receipt: dict | None = None

    @property
    def outcome(self) -> str:
        statuses = {c.status for c in self.checks}
        return FAILED if "failed" in statuses else CANNOT if "cannot" in statuses else VERIFIED

    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status in ("failed", "cannot")]

    def add(self, name: str, ok: bool, detail: str = "", cannot: bool = False) -> bool:
        self.checks.append(Check(name, "ok" if ok else "cannot" if cannot else "failed", detail))
        return ok

    def to_json(self) -> dict:
        return {"store": self.path, "outcome": self.outcome, "checks": [attrs.asdict(c) for c in self.checks],
                "receipt": self.receipt}


#: Where a forgotten source id may remain (the design records the forget
#: itself there): the forgotten list, the forget log and its receipts, the
#: tool layer's withheld-result list and a withheld call-result block's id.
#: An id can also equal a name: a user or plan step's source id is its step id
#: by default, and a tool result block is named by its source id. Names are
#: not content: what carries a source is an item's ``source`` (the
#: observation) and a block's ``source_ids`` (what it was computed from).
ALLOWED_PLACES = ("forgotten", "forget_log", "extra.tools.tool_config.withheld", "step and block names")


def forgotten_mentions(record: dict, forgotten: Sequence[str]) -> list[str]:
    """Every observation item and block of a session record that carries a
    forgotten source id; empty when none does (see :data:`ALLOWED_PLACES`)."""
    gone = set(forgotten)
    found = [f"steps.{i}.items.{j}.source = {item['source']!r}" for i, step in enumerate(record["steps"])
             for j, item in enumerate(step["items"]) if item["source"] in gone]
    found += [f"blocks.{i}.source_ids.{j} = {source!r}" for i, block in enumerate(record["blocks"])
              for j, source in enumerate(block["source_ids"]) if source in gone]
    return found


def verify_store(path: str | Path, receipt_text: str | bytes | None = None, value: str | None = None,
                 device: str = "cpu", load_model=None) -> Verdict:
    """Check the store at ``path`` (and, given, the receipt a third party
    holds) as the module docstring describes. ``value``: a forgotten value to
    look for in the raw bytes of every file the session owns (never stored).
    ``load_model``: how to load the named model, ``(model, **loader options)
    -> lm`` (default: the registry's loader of the backend the store records,
    impl/store/backend.py)."""
    path = Path(path)
    verdict = Verdict(str(path))
    try:
        store = SessionStore.open(path, readonly=True)
        try:
            snap = store.read_snapshot()
        finally:
            store.close()  # the snapshot is all verify reads: no lock is held from here on
    except StoreError as exc:
        verdict.add("open read-only", False, str(exc))
        return _scan(verdict, path, value, None)
    verdict.add("open read-only", True, f"schema {snap['meta'].get('schema_version')}, generation "
                                        f"{snap['generation']}")
    verdict.add("sqlite integrity", snap["quick_check"] == "ok", snap["quick_check"])
    try:
        return _check_snapshot(verdict, path, snap, receipt_text, value, device, load_model)
    except (TypeError, KeyError, ValueError, AttributeError, IndexError, RecursionError) as exc:
        # a hostile or damaged record of the wrong shape: a failure to name, never a crash
        verdict.add("the stored record is well-formed", False, f"{type(exc).__name__}: {exc}")
        return _scan(verdict, path, value, None)


def _check_snapshot(verdict: Verdict, path: Path, snap: dict, receipt_text, value, device, load_model) -> Verdict:
    target = _check_receipts_and_log(verdict, snap, receipt_text)
    if target is None:
        return _scan(verdict, path, value, None)
    lm, model_ok = _load_receipt_model(verdict, snap["meta"], target, device, load_model)
    if model_ok:
        with _threads(target["environment"].get("threads")):
            _check_rebuild(verdict, snap, target, lm)
    return _scan(verdict, path, value, lm)


def _check_receipts_and_log(verdict: Verdict, snap: dict, receipt_text) -> dict | None:
    """The stored receipts (and the held one) against the store, the
    forgotten sources against the record and the sanitised log against the
    receipt; the latest receipt, or None when the receipts fail."""
    meta, record = snap["meta"], snap["record"]
    receipts = _stored_receipts(verdict, snap)
    if receipts is None:
        return None
    target = receipts[-1]
    if receipt_text is not None and not _held_receipt(verdict, receipt_text, receipts, meta):
        return None
    verdict.receipt = target

    mentions = forgotten_mentions(record, record["forgotten"])
    verdict.add("no forgotten source in items, blocks or observations", not mentions,
                "; ".join(mentions[:5]) + (f" (and {len(mentions) - 5} more)" if len(mentions) > 5 else ""))
    T = target["log"]["steps"]
    steps = record["steps"]
    log_ok = (len(steps) >= T == target["length"]
              and log_hash(steps[:T]) == target["log"]["sha256"])
    verdict.add("sanitised log matches the receipt", log_ok,
                f"the receipt's {T} steps hash to {target['log']['sha256'][:16]}...; the stored log's first {T} of "
                f"{len(steps)} hash to {log_hash(steps[:T])[:16]}...")
    if record["t"] == T:
        verdict.add("stored digest is the receipt's", snap["digest"] == target["digest"],
                    f"store {snap['digest'][:16]}..., receipt {target['digest'][:16]}...")
    return target


def _load_receipt_model(verdict: Verdict, meta: dict, target: dict, device: str, load_model) -> tuple[Any, bool]:
    """The receipt's model, loaded here on the engine the store records
    (impl/store/backend.py): ``(lm or None, whether its weights are the receipt's)``."""
    if meta.get("model") != target["model"]["name"] or meta.get("dtype") != target["environment"].get("dtype"):
        verdict.add("model", False, f"the store names model {meta.get('model')!r} ({meta.get('dtype')}), the "
                                    f"receipt {target['model']['name']!r} ({target['environment'].get('dtype')})")
        return None, False
    stored = read_stored_engine(meta)
    try:
        options = stored.get_loader_options(meta, device)
        lm = (load_model or functools.partial(load_model_for, stored.backend))(stored.model, **options)
    except (ValueError, OSError, LlamaCppMissingError) as exc:
        verdict.add("model", False, f"model {stored.model!r} cannot be loaded here on the {stored.backend} engine "
                                    f"({exc})", cannot=True)
        return None, False
    weights = weights_hash(lm)
    return lm, verdict.add("model weights are the receipt's", weights == target["model"]["weights_sha256"],
                           f"receipt {target['model']['weights_sha256'][:16]}..., {meta['model']!r} here "
                           f"{weights[:16]}...")


def _check_rebuild(verdict: Verdict, snap: dict, target: dict, lm) -> None:
    """Rebuild the stored state on ``lm``, then the counterfactual as a full
    reset from ``R_0`` over the receipt's prefix of the stored log (no
    checkpoint, cache or draft of the forget is used), and compare."""
    record, T = snap["record"], target["log"]["steps"]
    engine = make_engine(lm)
    differences = environment_differences(target["environment"], environment(engine))
    why = f"; the environment differs: {', '.join(differences)}" if differences else ""
    try:
        runtime = load_runtime(engine, record)
    except (StoreError, KeyError, TypeError, ValueError, LookupError) as exc:
        verdict.add("stored state rebuilds", False, f"{type(exc).__name__}: {exc}")
        return
    # the record round-trips: nothing in it that the runtime does not read back (a planted key, a
    # value a loader would coerce)
    verdict.add("the stored record round-trips through the runtime",
                record_hash(runtime.get_session_record()) == record_hash(record),
                "the record the rebuilt runtime writes differs from the stored one")
    stored_ok = runtime.digest() == snap["digest"]
    verdict.add("stored state rebuilds to its digest", stored_ok,
                f"rebuilt {runtime.digest()[:16]}..., stored {snap['digest'][:16]}...{why}",
                cannot=bool(differences))
    runtime.full_reset(list(record["forgotten"]), upto=T)
    rebuilt = runtime.digest()
    verdict.add("full reset from R_0 reproduces the receipt's digest", rebuilt == target["digest"],
                f"rebuilt {rebuilt[:16]}..., receipt {target['digest'][:16]}...{why}", cannot=bool(differences))
    _check_generated(verdict, runtime.generated_tokens(), record, target, why, bool(differences))
    mismatches = _record_mismatches(runtime.get_session_record(), record, T)
    verdict.add("every stored block, checkpoint and resident list is the rebuilt one", not mismatches,
                "; ".join(mismatches[:5]) + why, cannot=bool(differences and mismatches))


def _check_generated(verdict: Verdict, generated: list, record: dict, target: dict, why: str, cannot: bool) -> None:
    """Every rebuilt model-written block's tokens against the store's and the receipt's."""
    stored_generated = dict(generated_of(record, target["log"]["steps"]))
    differing = [b for b, toks in generated if stored_generated.get(b) != list(toks)]
    differing += [b for b in stored_generated if b not in dict(generated)]
    tokens_ok = (not differing and generated_hash(generated) == target["generated"]["sha256"]
                 and len(generated) == target["generated"]["blocks"])
    verdict.add("every generated token matches the receipt and the store", tokens_ok,
                (f"{len(generated)} model-written blocks" if tokens_ok else
                 f"differing blocks: {differing[:5]}; {len(generated)} rebuilt vs receipt "
                 f"{target['generated']['blocks']}") + why, cannot=cannot)


def _record_mismatches(rebuilt: dict, stored: dict, T: int) -> list[str]:
    """Where the stored record differs from the one the full reset rebuilt:
    every block of the first ``T`` steps (all fields), the checkpoints before
    boundary ``T`` (without their process-local lineage labels and environment
    snapshot ids) and, when no step was
    appended since, the resident context, memory and plans."""
    rebuilt, stored = _plain(rebuilt), _plain(stored)
    out = []
    mine = {b["id"]: b for b in rebuilt["blocks"]}
    theirs = {b["id"]: b for b in stored["blocks"] if b["turn"] <= T or b["id"] in mine}
    for block_id in sorted(set(mine) | set(theirs)):
        if mine.get(block_id) != theirs.get(block_id):
            fields = sorted(k for k in set(mine.get(block_id, {})) | set(theirs.get(block_id, {}))
                            if mine.get(block_id, {}).get(k) != theirs.get(block_id, {}).get(k))
            out.append(f"block {block_id!r} differs in {fields}")
    # lineage labels are process-local; a checkpoint taken live records the real world's snapshot, which
    # after an irrevocable divergence (A3) is not the counterfactual's: neither enters the digest
    strip = lambda cs: [{k: v for k, v in c.items() if k not in ("lineage", "env_snapshot")}
                        for c in cs if c["boundary"] < T]
    if strip(rebuilt["checkpoints"]) != strip(stored["checkpoints"]):
        out.append("checkpoints differ")
    if stored["t"] == T:
        out += [f"{role} differs" for role in ("context", "memory", "plans", "system", "settings")
                if rebuilt[role] != stored[role]]
    return out


def _plain(value: Any) -> Any:
    import json

    return json.loads(json.dumps(value))


def _stored_receipts(verdict: Verdict, snap: dict) -> list[dict] | None:
    """Parse every stored receipt and check it against its forget-log row,
    the session id and the forgotten list; None when there is none to check."""
    log, meta, record = snap["forget_log"], snap["meta"], snap["record"]
    if not log:
        verdict.add("receipt", False, "the session has no committed forget, so no receipt to verify")
        return None
    receipts, problems = [], []
    for row in log:
        try:
            r = parse_receipt(row["receipt"])
        except ReceiptError as exc:
            verdict.add("stored receipts are intact", False, f"generation {row['generation']}: {exc}")
            return None
        fields = {"generation": r["generation"], "method": r["method"], "sources": r["forgotten"], "tau": r["tau"],
                  "boundary": r["boundary"], "length": r["length"], "invocations": r["invocations"],
                  "digest_after": r["digest"]}
        problems += [f"generation {row['generation']}: forget log {k} {row[k]!r}, receipt {v!r}"
                     for k, v in fields.items() if row[k] != v]
        if r["session_id"] != meta.get("session_id"):
            problems.append(f"generation {row['generation']}: receipt of session {r['session_id']!r}, the store is "
                            f"session {meta.get('session_id')!r}")
        receipts.append(r)
    union = [s for r in receipts for s in r["forgotten"]]
    if union != record["forgotten"] or receipts[-1]["all_forgotten"] != record["forgotten"]:
        problems.append(f"forgotten sources {record['forgotten']} are not those the receipts name {union}")
    verdict.add("stored receipts are intact and match the forget log", not problems, "; ".join(problems))
    return receipts if not problems else None


def _held_receipt(verdict: Verdict, text: str | bytes, receipts: list[dict], meta: dict) -> bool:
    """The receipt a third party holds: intact, and this store's own copy."""
    try:
        held = parse_receipt(text)
    except ReceiptError as exc:
        return verdict.add("the given receipt is intact", False, str(exc))
    same = [r for r in receipts if r["generation"] == held["generation"]]
    if held["session_id"] != meta.get("session_id") or not same:
        return verdict.add("the given receipt belongs to this store", False,
                           f"receipt of session {held['session_id']!r} generation {held['generation']}; the store is "
                           f"session {meta.get('session_id')!r} with receipts of generations "
                           f"{[r['generation'] for r in receipts]}")
    if same[0] != held:
        return verdict.add("the given receipt is the store's copy", False,
                           f"the receipt of generation {held['generation']} differs from the store's")
    later = "" if same[0] is receipts[-1] else (
        f"; the session has forgotten more since ({receipt_summary(receipts[-1])}), which is what is rebuilt")
    return verdict.add("the given receipt is the store's copy", True, receipt_summary(held) + later)


def _scan(verdict: Verdict, path: Path, value: str | None, lm) -> Verdict:
    """The residue byte scan of every file the session owns, when a value is given."""
    if value is not None:
        files = session_files(path)
        found = find_residue(files, value, lm.encode if lm is not None else None)
        verdict.add("no residue of the value in the session's files", not found,
                    "; ".join(found[:5]) or f"scanned {', '.join(p.name for p in files)}"
                    + ("" if lm is not None else " (bytes and text only: the model was not loaded)"))
    return verdict


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    """Run with the receipt's torch thread count (the CPU digest depends on it)."""
    import torch

    previous = torch.get_num_threads()
    if isinstance(n, int) and n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


__all__ = [
    "ALLOWED_PLACES",
    "CANNOT",
    "FAILED",
    "VERIFIED",
    "Check",
    "Verdict",
    "forgotten_mentions",
    "verify_store",
]
