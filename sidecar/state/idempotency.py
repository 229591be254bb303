"""Idempotency records seen as operations: look one up, settle an unknown one, list them, expire old ones.

Finished records are kept ``store.idempotency_retention_hours``; ``Expiry`` deletes older ones.

``OperationMethods`` is mixed into both stores; each backend gives its SQL dialect (``operation_sql``)
and two hooks that run a statement.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sidecar.errors import StoreUnavailableError
from sidecar.state import KeyScope, Store
from sidecar.state.common import Row, is_abandoned, log

EXPIRY_INTERVAL_SECONDS = 60.0
_COLUMNS = "tenant, principal_id, tool, key, request_id, result_json, deadline_at"


class RecordState(StrEnum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"  # a stored result (its status says whether the call succeeded)
    UNKNOWN = "unknown"  # still in progress well past its deadline: the sidecar running it died


@dataclass(frozen=True, slots=True)
class OperationRecord:
    """An idempotency record: the call holding a key and, once finished, its stored result."""

    scope: KeyScope
    request_id: str
    result_json: str | None
    deadline_at: float | None
    created_at: float

    @property
    def state(self) -> RecordState:
        if self.result_json is not None:
            return RecordState.COMPLETED
        return RecordState.UNKNOWN if is_abandoned(self.deadline_at) else RecordState.IN_PROGRESS


def operation_sql(p: str, *, epoch: str, from_epoch: str) -> dict[str, str]:
    """The statements with parameter placeholder ``p``; ``epoch``/``from_epoch`` format a timestamp
    column as epoch seconds and epoch seconds as a timestamp (``{}`` is the operand)."""
    select = f"SELECT {_COLUMNS}, {epoch.format('created_at')} FROM idempotency"
    key = f"tenant = {p} AND principal_id = {p} AND tool = {p} AND key = {p}"
    return {
        "by_key": f"{select} WHERE {key}",
        "by_request": f"{select} WHERE tenant = {p} AND principal_id = {p} AND request_id = {p}",
        "pending": f"{select} WHERE result_json IS NULL ORDER BY created_at LIMIT {p}",
        "resolve": f"UPDATE idempotency SET result_json = {p}, completed_at = {from_epoch.format(p)} "
                   f"WHERE {key} AND result_json IS NULL",
        "expire": f"DELETE FROM idempotency WHERE result_json IS NOT NULL AND completed_at < {from_epoch.format(p)}",
    }


def _operation(row: Row) -> OperationRecord:
    tenant, principal_id, tool, key, request_id, result_json, deadline_at, created_at = row
    return OperationRecord(KeyScope(str(tenant), str(principal_id), str(tool), str(key)), str(request_id),
                     result_json,  # type: ignore[arg-type]
                     None if deadline_at is None else float(deadline_at),  # type: ignore[arg-type]
                     float(created_at))  # type: ignore[arg-type]


class OperationMethods:
    """The operation methods of a store, over its SQL (``_OPERATION_SQL``) and statement hooks."""

    _OPERATION_SQL: dict[str, str]

    async def _fetch(self, sql: Any, params: tuple[Any, ...]) -> list[Row]:
        raise NotImplementedError

    async def _execute(self, sql: Any, params: tuple[Any, ...]) -> int:
        raise NotImplementedError

    async def operation(self, scope: KeyScope) -> OperationRecord | None:
        """The record holding ``scope``, if any."""
        rows = await self._fetch(self._OPERATION_SQL["by_key"], (scope.tenant, scope.principal_id, scope.tool,
                                                                 scope.key))
        return _operation(rows[0]) if rows else None

    async def operation_of_request(self, tenant: str, principal_id: str, request_id: str) -> OperationRecord | None:
        """The record the call ``request_id`` of this principal claimed, if any."""
        rows = await self._fetch(self._OPERATION_SQL["by_request"], (tenant, principal_id, request_id))
        return _operation(rows[0]) if rows else None

    async def pending_operations(self, *, limit: int = 1000) -> list[OperationRecord]:
        """Records without a result (in progress or unknown), oldest first."""
        return [_operation(row) for row in await self._fetch(self._OPERATION_SQL["pending"], (limit,))]

    async def resolve_operation(self, scope: KeyScope, result_json: str, *, now: float) -> bool:
        """Store ``result_json`` for a record still without a result; ``False`` if there is none such."""
        params = (result_json, now, scope.tenant, scope.principal_id, scope.tool, scope.key)
        return await self._execute(self._OPERATION_SQL["resolve"], params) == 1

    async def expire_operations(self, completed_before: float) -> int:
        """Delete the records completed before ``completed_before`` (never one without a result); how many."""
        return await self._execute(self._OPERATION_SQL["expire"], (completed_before,))


class Expiry:
    """Deletes records completed more than ``retention_seconds`` ago, in the background, at most once
    per ``EXPIRY_INTERVAL_SECONDS``; a failure is logged and tried again at the next interval."""

    def __init__(self, store: Store, retention_seconds: float) -> None:
        self._store, self._retention = store, retention_seconds
        self._next = 0.0  # ``time.monotonic()`` of the next allowed run
        self._running: set[asyncio.Task[None]] = set()

    def poke(self) -> None:
        """Start a cleanup unless one ran within the interval."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + EXPIRY_INTERVAL_SECONDS
        task = asyncio.get_running_loop().create_task(self._expire())
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def aclose(self) -> None:
        """Wait for a running cleanup."""
        await asyncio.gather(*self._running, return_exceptions=True)

    async def _expire(self) -> None:
        try:
            count = await self._store.expire_operations(time.time() - self._retention)
        except StoreUnavailableError as exc:
            log.error("expired idempotency records could not be deleted: %s", exc)
            return
        if count:
            log.info("deleted %d idempotency record(s) completed over %g hours ago", count, self._retention / 3600)
