"""One classification of failures outside a call, whatever transport carries it: kind, public message, retryable."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

import grpc
import pytest
from starlette.requests import Request

from sidecar import errors
from sidecar.contract import ErrorCode, ErrorInfo
from sidecar.errors import (
    ArgumentError,
    AuthenticationError,
    BundleError,
    BundleFetchError,
    BundleFormatError,
    BundleSignatureError,
    CallRefused,
    ConfigError,
    DependencyError,
    InvalidRequestError,
    MalformedDecisionError,
    PluginLoadError,
    PolicyEvaluationError,
    PolicyLoadError,
    StoreRefusedError,
    StoreUnavailableError,
    ToolboothError,
)
from sidecar.faults import Fault, FaultKind, classify
from sidecar.mcp.server import _MCP_ERRORS, protocol_error
from sidecar.server.http_faults import HTTP_STATUSES
from sidecar.server.http_json import _refused
from sidecar.server.interceptors.status import _GRPC_CODES, status_of

_SECRET = "db at 10.0.0.5 refused: password=hunter2"
_REFUSED = ErrorInfo.of(ErrorCode.PERMISSION_DENIED, _SECRET)

UNAVAILABLE = Fault(FaultKind.UNAVAILABLE, "service unavailable", retryable=True)
NOT_WORTH_RETRYING = Fault(FaultKind.UNAVAILABLE, "service unavailable", retryable=False)
INTERNAL = Fault(FaultKind.INTERNAL, "internal error", retryable=False)

# Every exception of sidecar.errors, and what a caller is told when one ends a request outside a call.
CASES: list[tuple[BaseException, Fault]] = [
    (AuthenticationError("token expired"), Fault(FaultKind.UNAUTHENTICATED, "token expired", retryable=False)),
    (InvalidRequestError("tool is required"), Fault(FaultKind.INVALID_REQUEST, "tool is required", retryable=False)),
    (DependencyError(_SECRET), UNAVAILABLE),
    (StoreUnavailableError(_SECRET), UNAVAILABLE),
    (PolicyEvaluationError(_SECRET), UNAVAILABLE),
    (StoreRefusedError(_SECRET), NOT_WORTH_RETRYING),
    (MalformedDecisionError(_SECRET), NOT_WORTH_RETRYING),
    (ToolboothError(_SECRET), INTERNAL),
    (ConfigError(_SECRET), INTERNAL),
    (PluginLoadError(_SECRET), INTERNAL),
    (PolicyLoadError(_SECRET), INTERNAL),
    (BundleError(_SECRET), INTERNAL),
    (BundleFetchError(_SECRET), INTERNAL),
    (BundleFormatError(_SECRET), INTERNAL),
    (BundleSignatureError(_SECRET), INTERNAL),
    (CallRefused(_REFUSED), INTERNAL),  # a stage's refusal is a result; raised this far, it is a bug
    (ArgumentError([_REFUSED]), INTERNAL),
    (ValueError(_SECRET), INTERNAL),
    (KeyboardInterrupt(), INTERNAL),
]


@pytest.mark.parametrize(("exc", "fault"), CASES, ids=lambda case: type(case).__name__)
def test_each_exception_has_one_fault_with_a_constant_message(exc: BaseException, fault: Fault) -> None:
    assert classify(exc) == fault
    assert "hunter2" not in classify(exc).message


def test_every_exception_of_sidecar_errors_is_pinned() -> None:
    declared = {value for name in errors.__all__ if isinstance(value := getattr(errors, name), type)}
    assert declared == {type(exc) for exc, _ in CASES if type(exc).__module__ == errors.__name__}


def test_a_fault_is_a_frozen_value() -> None:
    fault = classify(AuthenticationError("token expired"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        fault.kind = FaultKind.INTERNAL  # type: ignore[misc]
    assert not hasattr(fault, "__dict__")


@pytest.mark.parametrize("table", [_GRPC_CODES, _MCP_ERRORS, HTTP_STATUSES], ids=["grpc", "mcp", "http"])
def test_every_transport_has_a_code_for_every_kind(table: Mapping[FaultKind, object]) -> None:
    assert set(table) == set(FaultKind)


GRPC = {FaultKind.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED, FaultKind.INVALID_REQUEST:
        grpc.StatusCode.INVALID_ARGUMENT, FaultKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
        FaultKind.INTERNAL: grpc.StatusCode.INTERNAL}
RAISED = [(exc, fault) for exc, fault in CASES if isinstance(exc, Exception)]  # what a transport catches


@pytest.mark.parametrize(("exc", "fault"), RAISED, ids=lambda case: type(case).__name__)
def test_grpc_sends_the_status_of_the_kind_and_the_public_message(exc: Exception, fault: Fault) -> None:
    assert status_of(exc) == (GRPC[fault.kind], fault.message)


MCP = {FaultKind.UNAUTHENTICATED: (-32600, "unauthenticated: {}"), FaultKind.INVALID_REQUEST: (-32602, "{}"),
       FaultKind.UNAVAILABLE: (-32603, "{}"), FaultKind.INTERNAL: (-32603, "{}")}


@pytest.mark.parametrize(("exc", "fault"), RAISED, ids=lambda case: type(case).__name__)
def test_mcp_sends_the_json_rpc_error_of_the_kind_and_the_public_message(exc: Exception, fault: Fault) -> None:
    code, wording = MCP[fault.kind]
    assert (protocol_error(exc).error.code, protocol_error(exc).error.message) == (code, wording.format(fault.message))


def test_a_bug_reaches_an_mcp_client_as_internal_error_and_the_log_with_its_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    try:
        raise ValueError(_SECRET)
    except ValueError as exc:
        error = protocol_error(exc)
    assert (error.error.code, error.error.message) == (-32603, "internal error")
    assert caplog.records[-1].exc_info is not None and _SECRET in caplog.text


HTTP = {FaultKind.UNAUTHENTICATED: 401, FaultKind.INVALID_REQUEST: 400, FaultKind.UNAVAILABLE: 503,
        FaultKind.INTERNAL: 500}


@pytest.mark.parametrize(("exc", "fault"), RAISED, ids=lambda case: type(case).__name__)
def test_http_json_answers_the_status_of_the_kind_its_name_and_the_public_message(exc: Exception,
                                                                                  fault: Fault) -> None:
    response = _refused(exc, Request({"type": "http", "method": "POST", "path": "/v1/call", "headers": []})).response()
    assert response.status_code == HTTP[fault.kind]
    assert json.loads(bytes(response.body)) == {"error": {"code": fault.kind.value, "message": fault.message,
                                                          "retryable": fault.retryable}}
