"""Reading an implementation's answer under the contract
(docs/conformance.schema.json): strict, field by field, each message naming
the field. An answer of another version or with a field the contract does not
define is refused (:class:`AnswerContractError`, exit 2); a malformed value is
the implementation's failure (:class:`ImplementationError`), reported and
shrunk like a wrong answer. Pure Python: no torch, no runtime import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from unsee.impl.conform.checks import read_aftermath
from unsee.impl.conform.contract import (
    CONTRACT,
    CONTRACT_VERSION,
    RETIRED_VERSIONS,
    describe_undefined_field,
    find_undefined_fields,
)


class ConformanceInputError(ValueError):
    """Bad input to the harness itself (not a failure of the implementation)."""


class AnswerContractError(ConformanceInputError):
    """An answer the harness cannot read under the contract: another version,
    or a field the contract does not define. Refused (exit 2), never ignored in
    part and never shrunk: the adapter that writes the answer is wrong, and a
    typo must not turn a check off."""


class ImplementationError(RuntimeError):
    """The implementation did not answer a request (crash, timeout, no or
    malformed JSON): a conformance failure like any other."""


def _problem(where: str, message: str) -> ImplementationError:
    return ImplementationError(f"result {where}: {message}")


def _int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _problem(where, f"must be an integer, got {value!r}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise _problem(where, f"must be a non-empty string, got {value!r}")
    return value


def _turns(value: Any, where: str, expected: Sequence[str]) -> dict[str, list[int]]:
    if not isinstance(value, dict):
        raise _problem(where, "must be an object: step id -> list of token ids")
    if sorted(value) != sorted(expected):
        raise _problem(where, f"must name exactly the steps with a model turn {list(expected)}, "
                              f"got {sorted(value)}")
    for step, ids in value.items():
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise _problem(f"{where}.{step}", "must be a list of integer token ids")
    return value


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise _problem(where, f"must be an object, got {type(value).__name__}")
    return value


def check_contract(raw: dict) -> None:
    """The answer is one this contract version reads, with no field it does
    not define (:class:`AnswerContractError` names the first such field)."""
    contract, version = raw.get("contract"), raw.get("version")
    if contract != CONTRACT or version != CONTRACT_VERSION:
        message = (f"must be {CONTRACT!r} version {CONTRACT_VERSION}, got {contract!r} version {version!r}"
                   + (f" ({RETIRED_VERSIONS[version]})" if version in RETIRED_VERSIONS else ""))
        if contract == CONTRACT:  # our contract, another version: the answer cannot be read under this one
            raise AnswerContractError(f"result contract/version: {message}")
        raise _problem("contract/version", message)  # not a contract answer at all: a malformed one
    undefined = find_undefined_fields(raw)
    if undefined:
        more = f" (and {len(undefined) - 1} more)" if len(undefined) > 1 else ""
        raise AnswerContractError(f"result has a field the contract (version {CONTRACT_VERSION}) does not define: "
                                  f"{describe_undefined_field(*undefined[0])}{more}")


def read_result(raw: Any, turn_steps: Sequence[str], forget: str | None) -> dict:
    """Validate an answer against docs/conformance.schema.json (by hand: the
    messages name the field) and return it. A malformed answer raises
    :class:`ImplementationError`."""
    raw = _object(raw, "")
    check_contract(raw)
    impl = _object(raw.get("implementation"), "implementation")
    for key in ("name", "engine", "model"):
        _str(impl.get(key), f"implementation.{key}")
    run = _object(raw.get("run"), "run")
    _int(run.get("T"), "run.T")
    _str(run.get("digest"), "run.digest")
    _turns(run.get("turns"), "run.turns", turn_steps)
    if forget is None:
        for key in ("forget", "reset"):
            if raw.get(key) is not None:
                raise _problem(key, "must be absent when no forget was requested")
        read_aftermath(raw, _problem)
        return raw
    answer = _object(raw.get("forget"), "forget")
    if answer.get("source") != forget:
        raise _problem("forget.source", f"must be the requested source {forget!r}, got {answer.get('source')!r}")
    for key in ("tau", "boundary", "invocations"):
        _int(answer.get(key), f"forget.{key}")
    reset = _object(raw.get("reset"), "reset")
    _int(reset.get("invocations"), "reset.invocations")
    for name, part in (("forget", answer), ("reset", reset)):
        _str(part.get("digest_before"), f"{name}.digest_before")
        _str(part.get("digest_after"), f"{name}.digest_after")
        _turns(part.get("turns"), f"{name}.turns", turn_steps)
    read_aftermath(raw, _problem)
    for key in ("reopened", "again"):
        if answer.get(key) is not None:
            _turns(answer[key]["turns"], f"forget.{key}.turns", turn_steps)
    return raw


__all__ = ["AnswerContractError", "ConformanceInputError", "ImplementationError", "check_contract", "read_result"]
