"""Each scored framework judged against its own documented promise about
deletion (docs/conformance.md, "What each framework promises"), as Jepsen
tests a system against its own claims rather than ours.

A :class:`Claim` paraphrases what the framework's docs say its operation does
(with the page), names the suite checks that promise covers (``promised``)
and those it does not speak to (``silent``), and how the promise is probed
directly where no suite check covers it (tests/test_conform_claims.py). The
verdict reads the framework's committed result file (docs/results/): the
promise is **kept** when every promised check passes and **broken** when one
fails; a probe (tests/test_conform_claims.py) checks what no suite check covers.

Pure Python: no torch, no framework import.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from unsee.impl.conform.checks import (
    BOUNDARY,
    FAIL,
    FORGET_TWIN_DIGEST,
    FORGET_TWIN_TURNS,
    PASS,
    REOPEN,
    RESIDUE,
)


@attrs.frozen
class Claim:
    framework: str
    result: str  # its result file's name under docs/results/
    operation: str
    url: str
    promise: str  # the docs' promise, paraphrased
    promised: tuple[str, ...]  # the suite checks the promise covers
    silent: tuple[str, ...]  # suite checks it does not speak to (failing them breaks no promise)
    probe: str = ""  # what tests/test_conform_claims.py checks of the promise directly


CLAIMS = (
    Claim("LangGraph", "lang_graph-remove-1.1.0.json", "RemoveMessage",
          "https://langchain-ai.github.io/langgraph/how-tos/memory/delete-messages/",
          "the messages key's reducer deletes the message a RemoveMessage names from the graph state's message "
          "list", (REOPEN,), (BOUNDARY, FORGET_TWIN_TURNS, FORGET_TWIN_DIGEST, RESIDUE),
          "after the update the thread's current messages hold no message of the target, and a new "
          "checkpointer on the same file reads the same"),
    Claim("LangGraph", "lang_graph-travel-1.1.0.json", "time travel (fork)",
          "https://docs.langchain.com/oss/python/langgraph/use-time-travel",
          "a fork from a prior checkpoint re-executes the nodes after it on a new branch; the original "
          "execution history stays intact", (FORGET_TWIN_TURNS, FORGET_TWIN_DIGEST), (RESIDUE,),
          "the old checkpoints still hold the target (the history the docs keep) while the fork's head does not"),
    Claim("OpenAI Agents SDK", "agents_sdk-pop_item-1.1.0.json", "SQLiteSession.pop_item",
          "https://openai.github.io/openai-agents-python/sessions/",
          "pop_item removes the most recent item from the session and returns it", (REOPEN,),
          (FORGET_TWIN_TURNS, FORGET_TWIN_DIGEST, RESIDUE),
          "the item returned is the last one get_items listed, and get_items no longer lists it"),
    Claim("OpenAI Agents SDK", "agents_sdk-branch-1.1.0.json", "AdvancedSQLiteSession.create_branch_from_turn",
          "https://openai.github.io/openai-agents-python/sessions/advanced_sqlite_session",
          "conversation branching: an alternative conversation path from any user message, with branches "
          "switched and managed independently", (FORGET_TWIN_TURNS, FORGET_TWIN_DIGEST), (REOPEN, RESIDUE),
          "the new branch holds the messages before the turn branched from and nothing of the target, and the "
          "original branch still holds it"),
    Claim("Google ADK", "google_adk-rewind-1.1.0.json", "Runner.rewind_async",
          "https://google.github.io/adk-docs/sessions/rewind",
          "rewinding before an invocation reverts the session to its state before that request, undoing it and "
          "every request after it", (FORGET_TWIN_TURNS, FORGET_TWIN_DIGEST), (RESIDUE,)),
    Claim("mem0", "mem0_store-delete-1.1.0.json", "Memory.delete",
          "https://docs.mem0.ai/core-concepts/memory-operations/delete",
          "delete removes a memory by its id; the page lists privacy and complying with data deletion requests "
          "(GDPR) among its uses", (RESIDUE,), (BOUNDARY, FORGET_TWIN_TURNS, FORGET_TWIN_DIGEST)),
    Claim("Pydantic AI", "pydantic_ai-filter_history-1.1.0.json", "message history filtered (a history processor)",
          "https://pydantic.dev/docs/ai/core-concepts/message-history/",
          "the message history is a list the user owns and passes to each run; a history processor modifies it "
          "before each request, privacy (filtering out sensitive information) among the reasons the page gives",
          (RESIDUE, REOPEN), (BOUNDARY, FORGET_TWIN_TURNS, FORGET_TWIN_DIGEST),
          "the next request the model is sent carries no part of the target"),
    Claim("LlamaIndex", "llama_index-memory_set-1.1.0.json", "Memory.set",
          "https://developers.llamaindex.ai/python/framework/module_guides/deploying/agents/memory",
          "the agent stores what it sees with put() and is given get(); short-term memory is a queue of chat "
          "messages in an SQL database, which set() replaces and reset() clears", (REOPEN, RESIDUE),
          (BOUNDARY, FORGET_TWIN_TURNS, FORGET_TWIN_DIGEST),
          "after set(), get_all() is the list set, and get() (what the model is given) holds no part of the target"),
)

KEPT, BROKEN, UNTESTED = "kept", "broken", "untested"


def compute_verdict(claim: Claim, statuses: Mapping[str, str]) -> str:
    """The promise against a run's check statuses: :data:`BROKEN` when a promised check
    failed, :data:`KEPT` when every one passed, else :data:`UNTESTED` (none applied)."""
    got = [statuses.get(n) for n in claim.promised]
    return BROKEN if FAIL in got else KEPT if got and all(g == PASS for g in got) else UNTESTED


def render_claims(results: Mapping[str, Mapping]) -> str:
    """The table: framework, operation, the promise (linked), the checks it covers, the
    suite checks it is silent on that fail, and the verdict (result files by name)."""
    lines = ["| framework | operation | what its docs promise | checks the promise covers | verdict | "
             "fails where the docs are silent |", "|---|---|---|---|---|---|"]
    for claim in CLAIMS:
        statuses = results[claim.result]["checks"]
        covered = ", ".join(f"`{n}` {statuses.get(n, 'n/a')}" for n in claim.promised)
        verdict = compute_verdict(claim, statuses)
        if claim.probe:
            verdict += f"; probed: {claim.probe}"
        silent = ", ".join(f"`{n}`" for n in claim.silent if statuses.get(n) == FAIL) or "-"
        lines.append(f"| {claim.framework} | {claim.operation} | [{claim.promise}]({claim.url}) | {covered} | "
                     f"{verdict} | {silent} |")
    return "\n".join(lines) + "\n"


__all__ = ["BROKEN", "CLAIMS", "KEPT", "UNTESTED", "Claim", "compute_verdict", "render_claims"]
