"""The expiry's DELETE of finished idempotency records finds them by index, not by reading the whole table."""

from __future__ import annotations

import time
from pathlib import Path

from sidecar.state.sqlite import SqliteStore
from sidecar.state.sqlite.driver import SQLITE
from sidecar.state.statements import StoreStatements


async def test_the_expiry_reads_only_the_records_it_deletes(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "toolbooth.db")
    try:
        plan = await store.driver.fetch(f"EXPLAIN QUERY PLAN {StoreStatements.of(SQLITE).expire}", (time.time(),))
    finally:
        await store.aclose()
    details = " ".join(str(row[-1]) for row in plan)
    assert "USING INDEX idempotency_completed" in details, details
    assert "SCAN idempotency" not in details, details
