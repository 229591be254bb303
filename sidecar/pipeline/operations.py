"""``GetOperation``: where a keyed call of the caller stands, read from its idempotency record."""

from __future__ import annotations

from sidecar.contract import Operation, OperationState, Principal, Status, ToolResult
from sidecar.state import KeyScope, Store
from sidecar.state.idempotency import OperationRecord, RecordState

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
    if record.state is RecordState.IN_PROGRESS:
        return Operation(state=OperationState.IN_PROGRESS)
    if record.state is RecordState.UNKNOWN:
        return Operation(state=OperationState.UNKNOWN)
    assert record.result_json is not None
    result = ToolResult.model_validate_json(record.result_json)
    state = OperationState.COMPLETED if result.status is Status.SUCCESS else OperationState.FAILED
    return Operation(state=state, result=result)
