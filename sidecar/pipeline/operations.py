"""``GetOperation``: where a keyed call of the caller stands, read from its idempotency record."""

from __future__ import annotations

from sidecar.contract import Operation, OperationState, Principal, ToolResult
from sidecar.state import KeyScope, OperationRecord, Store

__all__ = ["find_operation", "operation_of"]


async def find_operation(store: Store, principal: Principal, *, tool: str | None = None, key: str | None = None,
                         request_id: str | None = None) -> Operation:
    """The caller's operation by ``request_id``, else by ``tool`` and ``key``; other principals' are not found."""
    if request_id is not None:
        record = await store.operation_of_request(principal.tenant, principal.id, request_id)
    else:
        assert tool is not None and key is not None
        record = await store.operation(KeyScope(principal.tenant, principal.id, tool, key))
    return operation_of(record)


def operation_of(record: OperationRecord | None) -> Operation:
    """The public view of ``record``: its state and, once finished, its stored result."""
    if record is None:
        return Operation(state=OperationState.NOT_FOUND)
    if record.result_json is None:  # in progress or unknown
        return Operation(state=record.state)
    return Operation(state=record.state, result=ToolResult.model_validate_json(record.result_json))
