"""SQLite files from before versioned migrations, upgraded in place.

Releases before ``toolbooth_schema`` created their tables with ``CREATE TABLE IF NOT EXISTS`` and
added later columns with ``ALTER TABLE ADD COLUMN`` on open, so such a file holds some part of the
schema of version ``UNVERSIONED_VERSION`` (a file from before the audit chain lacks ``prev_hash`` and
``hash``, one from before previews lacks that table, ...). ``adopt_unversioned`` compares the file
with that schema, built from the migration files themselves, adds every table, column and index it
lacks (no row is touched), and records versions 1..``UNVERSIONED_VERSION`` as applied; the migrator
then applies the later ones as for any database.
"""

from __future__ import annotations

import logging
import sqlite3

from sidecar.state.driver import Transaction
from sidecar.state.migrate import MIGRATION_LOCK, migrations
from sidecar.state.sqlite.driver import SQLITE, SqliteDriver, script_statements

__all__ = ["UNVERSIONED_TABLES", "UNVERSIONED_VERSION", "adopt_unversioned"]

# The schema version the unversioned releases ended at, and the tables they created.
UNVERSIONED_VERSION = 4
UNVERSIONED_TABLES = frozenset({"idempotency", "audit", "audit_mask_key", "previews"})
log = logging.getLogger("toolbooth.store")


async def adopt_unversioned(driver: SqliteDriver) -> bool:
    """Bring a file written before versioned migrations to version ``UNVERSIONED_VERSION`` and record it;
    ``False`` (nothing done) for a new file or one with ``toolbooth_schema``."""
    async with driver.transaction(lock=MIGRATION_LOCK) as tx:
        tables = {name for (name,) in await tx.fetch("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "toolbooth_schema" in tables or not tables & UNVERSIONED_TABLES:
            return False
        for statement in await _missing(tx, tables):
            await tx.execute(statement)
        await tx.execute(SQLITE.version_table)
        await tx.execute_many("INSERT INTO toolbooth_schema (version, name) VALUES (?, ?)",
                              [(m.version, m.name) for m in migrations(SQLITE.name)[:UNVERSIONED_VERSION]])
    log.info("upgraded a SQLite store from before versioned migrations to version %d", UNVERSIONED_VERSION)
    return True


async def _missing(tx: Transaction, tables: set[str]) -> list[str]:
    """The statements adding to the file what the unversioned schema has and it lacks."""
    reference = _unversioned_schema()
    try:
        added: list[str] = []
        objects = reference.execute("SELECT type, name, tbl_name, sql FROM sqlite_master "
                                    "WHERE sql IS NOT NULL ORDER BY type = 'index', rowid").fetchall()
        indexes = {name for (name,) in await tx.fetch("SELECT name FROM sqlite_master WHERE type = 'index'")}
        for kind, name, table, sql in objects:
            if kind == "table" and name not in tables:
                added.append(sql)
            elif kind == "table":
                have = {row[1] for row in await tx.fetch(f"PRAGMA table_info({name})")}
                added += [_add_column(name, column) for column in reference.execute(f"PRAGMA table_info({table})")
                          if column[1] not in have]
            elif kind == "index" and name not in indexes:
                added.append(sql)
        return added
    finally:
        reference.close()


def _add_column(table: str, column: tuple[object, ...]) -> str:
    _, name, kind, not_null, default, _ = column
    if not_null and default is None:
        raise RuntimeError(f"cannot add the required column {table}.{name} to a SQLite store in place")
    return f"ALTER TABLE {table} ADD COLUMN {name} {kind}" + ("" if default is None else f" DEFAULT {default}")


def _unversioned_schema() -> sqlite3.Connection:
    """An in-memory database at version ``UNVERSIONED_VERSION``."""
    reference = sqlite3.connect(":memory:")
    for migration in migrations(SQLITE.name)[:UNVERSIONED_VERSION]:
        for statement in script_statements(migration.sql):
            reference.execute(statement)
    return reference
