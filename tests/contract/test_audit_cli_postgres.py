"""``toolbooth audit verify | export`` on a PostgreSQL store written by two sidecars, then tampered with."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.state import AuditEvent
from sidecar.state.postgres import PostgresStore
from tests.support.postgres import PostgresServer


def event(n: int) -> AuditEvent:
    return AuditEvent(
        request_id=f"req-{n}", time=f"2026-01-01T00:00:{n:02d}.000+00:00", principal_id="dev-1", tenant="acme",
        tool="create_note", tool_version="1.0.0", input_hash=f"sha256:{n:064x}", decisions_json="{}",
        policy_revision="sha256:rev", idempotency_key=None, call_id=None, conversation_id=None, status="success",
        error_code=None, duration_ms=n)


def write_from_two_stores(dsn: str) -> None:
    async def write() -> None:
        stores = [await PostgresStore.open(dsn) for _ in range(2)]
        for n in range(20):
            stores[n % 2].queue_audit(event(n))
        for store in stores:
            await store.aclose()

    asyncio.run(write())


def test_verify_and_export_on_postgres(postgres: PostgresServer, postgres_dsn: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "toolbooth.yaml"
    config.write_text(json.dumps({"store": {"postgres_dsn": postgres_dsn}}))
    write_from_two_stores(postgres_dsn)
    assert main(["audit", "verify", "--config", str(config)]) == 0
    assert capsys.readouterr().out.startswith("audit chain intact: 20 event(s), last hash sha256:")
    assert main(["audit", "export", "--config", str(config)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 20
    [(third,)] = postgres.execute("SELECT id FROM audit ORDER BY id OFFSET 2 LIMIT 1", dsn=postgres_dsn)
    postgres.execute("UPDATE audit SET principal_id = 'someone-else' WHERE id = %s", (third,), dsn=postgres_dsn)
    assert main(["audit", "verify", "--config", str(config)]) == 1
    assert capsys.readouterr().out.startswith(f"audit chain BROKEN at event id {third}: the event's fields")
