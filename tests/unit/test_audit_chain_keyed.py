"""The keyed audit chain on a SQLite store: unkeyed links may come first, never after keyed ones; keyed links
need the key to verify; the checkpoint counts the links and names the head."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.state.chain import KEYED_PREFIX, verify_store
from sidecar.state.checkpoint import (
    Checkpoint,
    Checkpointer,
    CheckpointError,
    compare,
    read_checkpoint,
    write_checkpoint,
)
from sidecar.state.heads import extend
from sidecar.state.records import ChainHead
from sidecar.state.sqlite import SqliteStore
from tests.unit.test_audit_cli import event

KEY = b"k" * 32


async def test_a_key_configured_later_keys_the_links_from_then_on(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "a.db")
    try:
        await store.record_audit(event(1))
        store.use_chain_key(KEY)
        await store.record_audit(event(2))
        await store.record_audit(event(3))
        hashes = [r.hash or "" for r in await store.audit_records()]
        assert hashes[0].startswith("sha256:") and all(h.startswith(KEYED_PREFIX) for h in hashes[1:])
        keyed = await verify_store(store, key=KEY, marks={1: 2})
        assert (keyed.checked, keyed.unkeyed, keyed.broken, keyed.marks) == (3, 1, None, {1: hashes[1]})
        unkeyed = await verify_store(store)
        assert unkeyed.broken is not None and "no chain key is configured" in unkeyed.broken.problem
        wrong = await verify_store(store, key=b"w" * 32)
        assert wrong.broken is not None and "chain key is not the one" in wrong.broken.problem
    finally:
        await store.aclose()


async def test_the_checkpoint_counts_the_links_and_names_the_head(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "a.db")
    path = tmp_path / "state" / "cp.json"
    try:
        store.use_chain_key(KEY)
        assert await Checkpointer(store, KEY, path).write() is None and not path.exists()  # no links yet
        for n in range(4):
            store.queue_audit(event(n))
        written = await Checkpointer(store, KEY, path).write()
        [head] = await extend(store, KEY, None)
        assert written is not None and (written.count, written.heads) == (4, (head,))
        checkpoint = read_checkpoint(path, KEY)
        assert checkpoint == written
        assert compare(await verify_store(store, key=KEY, marks=checkpoint.marks), checkpoint) is None
        with pytest.raises(CheckpointError, match="signature"):
            read_checkpoint(path, b"w" * 32)
    finally:
        await store.aclose()


async def test_a_checkpoint_file_that_fails_its_signature_is_kept_and_nothing_is_signed(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "a.db")
    path = tmp_path / "cp.json"
    try:
        store.use_chain_key(KEY)
        await store.record_audit(event(1))
        [record] = await store.audit_records()
        head = ChainHead(record.id, record.hash or "", 1)
        write_checkpoint(path, Checkpoint((head,), "2026-12-01T00:00:00.000+00:00"), b"w" * 32)  # another key's
        kept = path.read_bytes()
        with pytest.raises(CheckpointError, match="kept as it is"):
            await Checkpointer(store, KEY, path).write()
        assert path.read_bytes() == kept
    finally:
        await store.aclose()


def test_chain_key_settings(tmp_path: Path) -> None:
    from sidecar.config import parse_settings
    from sidecar.errors import ConfigError

    with pytest.raises(ConfigError, match="at most one of 'chain_key' or 'chain_key_file'"):
        parse_settings({"audit": {"chain_key": "x" * 16, "chain_key_file": str(tmp_path / "k")}})
    with pytest.raises(ConfigError, match=r"audit\.chain_key: must be at least 16 bytes"):
        parse_settings({"audit": {"chain_key": "short"}})
    (tmp_path / "k").write_text("short\n")
    with pytest.raises(ConfigError, match=r"audit\.chain_key_file"):
        parse_settings({"audit": {"chain_key_file": str(tmp_path / "k")}}).audit.read_chain_key()
    settings = parse_settings({"store": {"sqlite_path": str(tmp_path / "t.db")}})
    assert settings.audit.read_chain_key() is None
    assert settings.audit.checkpoint_path(settings.store) == tmp_path / "t.db.checkpoint"
