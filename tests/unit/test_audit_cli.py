"""``toolbooth audit verify | tail | export`` on an intact and on a tampered SQLite store."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import main
from sidecar.state import AuditEvent
from sidecar.state.sqlite import SqliteStore


def event(n: int) -> AuditEvent:
    return AuditEvent(
        request_id=f"req-{n}", time=f"2026-01-01T00:00:{n:02d}.000+00:00", principal_id="dev-1", tenant="acme",
        tool="create_note", tool_version="1.0.0", input_hash=f"sha256:{n:064x}", decisions_json="{}",
        policy_revision="sha256:rev", idempotency_key=None, call_id=None, conversation_id=None, status="success",
        error_code=None, duration_ms=n, arguments_json='{"title":"t"}')


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "audit.db"


@pytest.fixture
def config(db: Path, store_config: Callable[[Path], Path]) -> Path:
    return store_config(db)


def write_events(db: Path, numbers: range) -> None:
    async def write() -> None:
        store = await SqliteStore.open(db)
        for n in numbers:
            store.queue_audit(event(n))
        await store.aclose()

    asyncio.run(write())


def tamper(db: Path, query: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(query)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def test_verify_intact_and_empty(config: Path, db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "audit", "verify", "--config", str(config))[:2] == (0, "audit chain intact: 0 event(s)\n")
    write_events(db, range(1, 4))
    code, out, _ = run(capsys, "audit", "verify", "--config", str(config))
    assert code == 0 and out.startswith("audit chain intact: 3 event(s), last hash sha256:")


@pytest.mark.parametrize(("query", "broken_id", "problem"), [
    ("UPDATE audit SET arguments_json = '{\"title\":\"other\"}' WHERE id = 2", 2, "was changed"),
    ("DELETE FROM audit WHERE id = 2", 3, "was removed, inserted or reordered"),
    ("UPDATE audit SET id = CASE id WHEN 2 THEN 20 WHEN 3 THEN 2 END WHERE id IN (2, 3)", 2, "reordered"),
], ids=["changed", "removed", "reordered"])
def test_verify_names_the_first_broken_link(config: Path, db: Path, capsys: pytest.CaptureFixture[str],
                                            query: str, broken_id: int, problem: str) -> None:
    write_events(db, range(1, 5))
    tamper(db, query)
    code, out, _ = run(capsys, "audit", "verify", "--config", str(config))
    assert code == 1
    assert out.startswith(f"audit chain BROKEN at event id {broken_id}: ") and problem in out
    assert "the 1 event(s) before it are intact" in out


def test_tail_prints_the_newest_in_order(config: Path, db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_events(db, range(1, 6))
    code, out, _ = run(capsys, "audit", "tail", "-n", "2", "--config", str(config))
    assert code == 0 and [line["request_id"] for line in lines(out)] == ["req-4", "req-5"]


def test_export_prints_every_record_and_filters_by_time(config: Path, db: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    write_events(db, range(1, 4))
    code, out, _ = run(capsys, "audit", "export", "--config", str(config))
    records = lines(out)
    assert code == 0 and [r["id"] for r in records] == [1, 2, 3]
    assert [r["prev_hash"] for r in records[1:]] == [r["hash"] for r in records[:-1]]
    assert records[0]["arguments_json"] == '{"title":"t"}' and records[0]["duration_ms"] == 1
    _, out, _ = run(capsys, "audit", "export", "--since", "2026-01-01T01:00:02+01:00", "--config", str(config))
    assert [r["request_id"] for r in lines(out)] == ["req-2", "req-3"]


def test_export_of_a_tampered_store_still_prints_it(config: Path, db: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    write_events(db, range(1, 4))
    tamper(db, "DELETE FROM audit WHERE id = 2")
    code, out, _ = run(capsys, "audit", "export", "--config", str(config))
    assert code == 0 and [r["id"] for r in lines(out)] == [1, 3]


def test_bad_since_is_a_usage_error(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "audit", "export", "--since", "yesterday", "--config", str(config))
    assert code == 2 and "not an ISO 8601 time" in err


def test_unreadable_store_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    config = tmp_path / "bad.yaml"
    config.write_text(f"store:\n  sqlite_path: {tmp_path}/file/audit.db\n")
    code, _, err = run(capsys, "audit", "verify", "--config", str(config))
    assert code == 1 and "cannot open SQLite store" in err


def test_tail_follow_prints_new_events_until_interrupted(config: Path, db: Path) -> None:
    write_events(db, range(1, 3))
    command = [sys.executable, "-m", "sidecar", "audit", "tail", "-n", "1", "--follow", "--config", str(config)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as follow:
        try:
            assert follow.stdout is not None
            assert json.loads(follow.stdout.readline())["request_id"] == "req-2"
            write_events(db, range(3, 5))
            assert [json.loads(follow.stdout.readline())["request_id"] for _ in range(2)] == ["req-3", "req-4"]
            follow.send_signal(signal.SIGINT)
            try:
                code = follow.wait(timeout=30)
            except subprocess.TimeoutExpired:
                state = _signals(follow.pid)
                raise AssertionError(f"audit tail --follow still runs 30 s after SIGINT: {state}") from None
            assert code == 0
        finally:
            if follow.poll() is None:
                follow.kill()


def _signals(pid: int) -> str:
    """What a process does with signals (its state, and its blocked, ignored and caught masks), from /proc."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return f"its status is unreadable ({exc})"
    return ", ".join(line for line in lines if line.startswith(("State:", "SigPnd", "ShdPnd", "SigBlk", "SigIgn",
                                                               "SigCgt", "Threads:")))


OLD_AUDIT_TABLE = """
CREATE TABLE audit (
    id INTEGER PRIMARY KEY, request_id TEXT NOT NULL, time TEXT NOT NULL,
    principal_id TEXT NOT NULL, tenant TEXT NOT NULL, tool TEXT NOT NULL, tool_version TEXT NOT NULL,
    input_hash TEXT NOT NULL, decisions_json TEXT NOT NULL,
    policy_revision TEXT NOT NULL, idempotency_key TEXT, call_id TEXT, conversation_id TEXT,
    status TEXT NOT NULL, error_code TEXT, duration_ms INTEGER NOT NULL
);
INSERT INTO audit VALUES (1, 'old', '2025-01-01T00:00:00.000+00:00', 'dev-1', 'acme', 'echo', '1.0.0', 'sha256:0',
                          '{}', 'sha256:rev', NULL, NULL, NULL, 'success', NULL, 3);
"""


def test_a_store_from_before_the_chain_is_upgraded(config: Path, db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with sqlite3.connect(db) as conn:
        conn.executescript(OLD_AUDIT_TABLE)
    write_events(db, range(1, 3))
    code, out, _ = run(capsys, "audit", "verify", "--config", str(config))
    assert code == 0 and out.startswith("audit chain intact: 2 event(s), last hash sha256:")
    assert out.rstrip().endswith("1 older event(s) from before the chain are not covered")
    tamper(db, "UPDATE audit SET hash = NULL, prev_hash = NULL WHERE id = 3")
    code, out, _ = run(capsys, "audit", "verify", "--config", str(config))
    assert code == 1 and "event id 3: the event has no hash" in out
