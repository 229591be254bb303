"""The string-field rules every RPC shares (``sidecar.pipeline.fields``), at their boundaries, and a lone
surrogate, which protobuf cannot carry over gRPC but another transport could hand the pipeline."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.contract import ErrorCode, Principal
from sidecar.errors import InvalidRequestError
from sidecar.pipeline.approvals import Approvals
from sidecar.pipeline.fields import FIELDS, check_fields, field_problem, malformed_field
from tests.conftest import PipelineFactory

DEVELOPER = Principal(id="dev", tenant="dev", roles=("developer",))


@pytest.mark.parametrize(("name", "value", "problem"), [
    ("idempotency_key", "k" * 256, None), ("idempotency_key", "k" * 257, "is 257 bytes"),
    ("tool", "t" * 128, None), ("tool", "t" * 129, "is 129 bytes"),
    ("preview_id", "é" * 128, None), ("preview_id", "é" * 128 + "x", "is 257 bytes"),
    ("request_id", "", None), ("request_id", "\U0001F600" * 64, None),
    ("call_id", "a\x00", "contains a control character"), ("call_id", "a\nb", "contains a control character"),
    ("call_id", "\x85", "contains a control character"), ("call_id", "\u2028 \u00a0 \ufeff", None),
    ("comment", "a\nb\r\n\tc", None), ("comment", "a\x00", "contains a control character"),
    ("reason", "\x0b", "contains a control character"), ("reason", "\x7f", "contains a control character"),
    ("comment", "c" * 4096, None), ("reason", "c" * 4097, "is 4097 bytes"),
    ("conversation_id", "\ud800", "is not valid Unicode (a lone surrogate)"),
    ("comment", "ok\udfff", "is not valid Unicode (a lone surrogate)"),
])
def test_field_rules(name: str, value: str, problem: str | None) -> None:
    assert field_problem(name, value) == problem


def test_the_first_malformed_field_is_named_and_absent_ones_are_skipped() -> None:
    assert malformed_field(tool=None, idempotency_key="ok", request_id=None) is None
    error = malformed_field(tool="ok", idempotency_key="a\x00", request_id="\x01")
    assert error is not None and (error.code, error.field) == (ErrorCode.INVALID_ARGUMENT, "idempotency_key")
    with pytest.raises(InvalidRequestError, match=r"^request_id contains a control character: it must be 1-256 "):
        check_fields(request_id="\x01")
    assert set(FIELDS) >= {"tool", "idempotency_key", "call_id", "conversation_id", "approval_id", "request_id",
                           "preview_id", "preview_hash", "comment", "reason"}


class NoStore:
    """A store that must not be asked anything but to close: the request is refused before."""

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the store was asked: {name}")


async def test_a_lone_surrogate_reaches_no_store_or_policy(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline(wrap_store=NoStore)
    with pytest.raises(InvalidRequestError, match=r"^idempotency_key is not valid Unicode"):
        await pipeline.get_operation(DEVELOPER, tool="create_note", key="k\ud800")
    with pytest.raises(InvalidRequestError, match=r"^conversation_id is not valid Unicode"):
        await pipeline.list_tools(DEVELOPER, conversation_id="\udc00")
    approvals = Approvals(NoStore(), None, max_pending=1)  # type: ignore[arg-type]
    approved = await approvals.approve(DEVELOPER, "p-1", "sha256:x", "\ud800")
    denied = await approvals.deny(DEVELOPER, "p\udfff", "why")
    assert approved.error is not None and (approved.error.code, approved.error.field) == (
        ErrorCode.INVALID_ARGUMENT, "comment")
    assert denied.error is not None and denied.error.field == "preview_id" and not denied.ok
