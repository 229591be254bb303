"""The preview methods of ``PostgresStore`` (see ``sidecar.state.previews``)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

from psycopg import AsyncConnection

from sidecar.contract import PreviewState
from sidecar.state.previews import PreviewRecord, preview_from_row, preview_row, preview_sql

_SQL = preview_sql("%s")


class PostgresPreviews:
    """Preview methods over the store's pooled connections (``_connection``), each statement in autocommit."""

    def _connection(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        raise NotImplementedError

    async def save_preview(self, preview: PreviewRecord) -> None:
        await self._execute(_SQL["insert"], preview_row(preview))

    async def get_preview(self, preview_id: str) -> PreviewRecord | None:
        rows = await self._fetch(_SQL["get"], (preview_id,))
        return preview_from_row(rows[0]) if rows else None

    async def list_previews(self, state: PreviewState, *, limit: int = 100) -> list[PreviewRecord]:
        return [preview_from_row(row) for row in await self._fetch(_SQL["list"], (state.value, limit))]

    async def decide_preview(self, preview_id: str, state: PreviewState, *, decided_by: str, comment: str | None,
                             now: float) -> bool:
        return await self._execute(_SQL["decide"], (state.value, decided_by, comment, now, preview_id)) == 1

    async def consume_approval(self, preview_id: str, *, now: float, key: str | None = None) -> bool:
        return await self._execute(_SQL["consume"], (now, key, preview_id)) == 1

    async def _execute(self, sql: Any, params: tuple[Any, ...]) -> int:
        async with self._connection() as conn:
            return (await conn.execute(sql, params)).rowcount

    async def _fetch(self, sql: Any, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        async with self._connection() as conn:
            return await (await conn.execute(sql, params)).fetchall()
