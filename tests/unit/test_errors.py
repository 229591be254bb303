"""The error hierarchy: drawn in the module's docstring, rooted in ToolboothError, mapped to ErrorInfo in one place."""

from __future__ import annotations

import inspect

import pytest

from sidecar import errors
from sidecar.contract import ErrorCode, Recovery
from sidecar.errors import (
    ArgumentError,
    CallRefused,
    DependencyError,
    MalformedDecisionError,
    PolicyEvaluationError,
    StoreUnavailableError,
    ToolboothError,
    refusal,
)

CLASSES = [value for _, value in inspect.getmembers(errors, inspect.isclass) if value.__module__ == errors.__name__]


@pytest.mark.parametrize("kind", CLASSES, ids=lambda kind: kind.__name__)
def test_every_exception_is_drawn_in_the_docstring_and_rooted(kind: type[Exception]) -> None:
    assert issubclass(kind, ToolboothError)
    assert kind.__name__ in (errors.__doc__ or ""), f"{kind.__name__} is missing from the drawn hierarchy"


@pytest.mark.parametrize(("exc", "code", "message"), [
    (StoreUnavailableError("disk I/O error"), ErrorCode.SERVICE_UNAVAILABLE, "state store unavailable; x"),
    (PolicyEvaluationError("division by zero"), ErrorCode.SERVICE_UNAVAILABLE, "policy evaluation failed; x"),
    (MalformedDecisionError("allow is a string"), ErrorCode.INTERNAL_ERROR,
     "the policy returned a malformed decision; x"),
])
def test_refusal_maps_a_dependency_failure_without_its_details(exc: DependencyError, code: ErrorCode,
                                                                message: str) -> None:
    info = refusal(exc, consequence="x")
    assert (info.code, info.message) == (code, message)
    assert str(exc) not in info.message
    assert info.retryable is (code is ErrorCode.SERVICE_UNAVAILABLE)


def test_refusal_names_the_failing_part_and_defaults_to_a_denied_call() -> None:
    info = refusal(StoreUnavailableError("locked"), consequence="nothing was executed", part="the audit log")
    assert info.message == "the audit log is unavailable; nothing was executed"
    assert info.recovery is Recovery.RETRY_WITH_BACKOFF
    assert refusal(PolicyEvaluationError("down")).message == "policy evaluation failed; the call was denied"


def test_a_refusal_carries_its_errors_in_order() -> None:
    first, second = (refusal(StoreUnavailableError("a")), refusal(PolicyEvaluationError("b")))
    assert CallRefused(first, second).errors == (first, second)
    assert ArgumentError([second, first]).errors == (second, first)
