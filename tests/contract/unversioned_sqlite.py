"""SQLite files exactly as the releases before versioned migrations wrote them, for the upgrade tests.

``SCHEMA``, ``PREVIEW_SCHEMA`` and ``LATER_COLUMNS`` are the statements of the last such release
(``sidecar/state/sqlite.py`` then): it ran them all on every open. ``STAGES`` name what files of
earlier releases held: each release added to the one before, so a file may have any prefix.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import astuple
from pathlib import Path

from sidecar.canonical import sha256_hex
from sidecar.state import AuditEvent, PreviewRecord
from sidecar.state.chain import EVENT_COLUMNS, GENESIS_HASH

SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency (
    tenant TEXT NOT NULL, principal_id TEXT NOT NULL, tool TEXT NOT NULL, key TEXT NOT NULL,
    request_hash TEXT NOT NULL, request_id TEXT NOT NULL, result_json TEXT,
    created_at REAL NOT NULL, completed_at REAL,
    PRIMARY KEY (tenant, principal_id, tool, key)
);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY, request_id TEXT NOT NULL, time TEXT NOT NULL,
    principal_id TEXT NOT NULL, tenant TEXT NOT NULL, tool TEXT NOT NULL, tool_version TEXT NOT NULL,
    input_hash TEXT NOT NULL, decisions_json TEXT NOT NULL,
    policy_revision TEXT NOT NULL, idempotency_key TEXT, call_id TEXT, conversation_id TEXT,
    status TEXT NOT NULL, error_code TEXT, duration_ms INTEGER NOT NULL
);
"""
MASK_KEY_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_mask_key (id INTEGER PRIMARY KEY CHECK (id = 1), key TEXT NOT NULL);
"""
PREVIEW_SCHEMA = """
CREATE TABLE IF NOT EXISTS previews (
    preview_id TEXT PRIMARY KEY, preview_hash TEXT NOT NULL, tenant TEXT NOT NULL, principal_id TEXT NOT NULL,
    tool TEXT NOT NULL, tool_version TEXT NOT NULL, call_json TEXT NOT NULL, policy_revision TEXT NOT NULL,
    reason TEXT NOT NULL, approver_roles TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL NOT NULL,
    state TEXT NOT NULL, decided_by TEXT, decided_at REAL, comment TEXT, used_at REAL,
    used_key TEXT
);
"""
LATER_COLUMNS = (("audit", "arguments_json", "TEXT"), ("audit", "prev_hash", "TEXT"), ("audit", "hash", "TEXT"),
                 ("idempotency", "deadline_at", "REAL"))

# What each release's files held, oldest first: (name, schema scripts, later columns added).
STAGES = {
    "first": ((SCHEMA,), ()),
    "masked-arguments": ((SCHEMA,), LATER_COLUMNS[:1]),
    "chain": ((SCHEMA, MASK_KEY_SCHEMA), LATER_COLUMNS[:3]),
    "previews": ((SCHEMA, MASK_KEY_SCHEMA, PREVIEW_SCHEMA), LATER_COLUMNS[:3]),
    "deadline": ((SCHEMA, MASK_KEY_SCHEMA, PREVIEW_SCHEMA), LATER_COLUMNS),
}


def create(path: Path, stage: str) -> sqlite3.Connection:
    """A file at ``path`` with the tables of release ``stage``, created as that release's open did."""
    scripts, columns = STAGES[stage]
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    for script in scripts:
        db.executescript(script)
    for table, column, kind in columns:
        if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    return db


def columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def tables(db: sqlite3.Connection) -> set[str]:
    return {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def insert_operation(db: sqlite3.Connection, scope: tuple[str, str, str, str], request_hash: str, request_id: str,
                     result_json: str | None, created_at: float, deadline_at: float | None) -> None:
    """An idempotency record as that release's claim (and completion) wrote it."""
    values = {"tenant": scope[0], "principal_id": scope[1], "tool": scope[2], "key": scope[3],
              "request_hash": request_hash, "request_id": request_id, "result_json": result_json,
              "created_at": created_at, "completed_at": None if result_json is None else created_at + 1}
    if "deadline_at" in columns(db, "idempotency"):
        values["deadline_at"] = deadline_at
    db.execute(f"INSERT INTO idempotency ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})",
               tuple(values.values()))


def insert_events(db: sqlite3.Connection, events: list[AuditEvent]) -> None:
    """Audit events as that release appended them: linked into the chain if it had one."""
    have = columns(db, "audit")
    names = [c for c in EVENT_COLUMNS if c in have]
    rows = [tuple(getattr(e, c) for c in names) for e in events]
    if "hash" in have:
        last = db.execute("SELECT hash FROM audit ORDER BY id DESC LIMIT 1").fetchone()
        rows, names = _old_chain(last[0] if last else GENESIS_HASH, names, rows), [*names, "prev_hash", "hash"]
    db.executemany(f"INSERT INTO audit ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})", rows)


def _old_chain(prev: str, names: list[str], rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """``rows`` linked as those releases linked them: SHA-256 over the columns they had, and ``prev_hash``."""
    linked = []
    for row in rows:
        digest = sha256_hex({**dict(zip(names, row, strict=True)), "prev_hash": prev})
        linked.append((*row, prev, digest))
        prev = digest
    return linked


def insert_preview(db: sqlite3.Connection, preview: PreviewRecord) -> None:
    """A preview as that release saved it (roles as a JSON list)."""
    values = list(astuple(preview))
    values[9] = json.dumps(list(preview.approver_roles))
    values[12] = preview.state.value
    db.execute(f"INSERT INTO previews VALUES ({', '.join('?' * len(values))})", values)
