"""Tampering with the audit log of a real sidecar (issue 8, defect 20).

The sidecar runs ``serve`` on a real Unix socket with a chain key, takes calls and stops, writing
its signed checkpoint; then the database is changed as someone who can write it but lacks the key
would, and ``toolbooth audit verify`` must exit 1 naming what happened: an event edited and its
chain recomputed unkeyed, the newest events deleted, a checkpoint altered. The untouched log exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.bootstrap import serve
from sidecar.cli import main
from sidecar.client import AsyncClient
from sidecar.config import Settings
from sidecar.state.chain import EVENT_COLUMNS, GENESIS_HASH, KEYED_PREFIX, event_hash
from sidecar.tools.registry import Registry
from tests.integration.conftest import make_settings, socket_path
from tests.support import tools
from tests.support.waiting import until

__all__ = ["make_settings", "socket_path"]

pytestmark = pytest.mark.integration

KEY = "a chain key of at least sixteen bytes"
CALLS = 6


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "toolbooth.db"


@pytest.fixture
def config(tmp_path: Path, db: Path) -> Path:
    """The operator's config of ``audit verify``: the sidecar's store and chain key."""
    path = tmp_path / "verify.yaml"
    path.write_text(yaml.safe_dump({"store": {"sqlite_path": str(db)}, "audit": {"chain_key": KEY}}))
    return path


Served = Callable[..., Awaitable[None]]


@contextlib.asynccontextmanager
async def serving(settings: Settings, socket_path: Path) -> AsyncIterator[AsyncClient]:
    """``serve`` with the test tools until the block ends (then it stops, writing the checkpoint); a client."""
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, registry=Registry.from_tools(tools.ALL), stop=stop))
    try:
        await until(lambda: socket_path.exists() or task.done(), what="the sidecar's socket")
        async with AsyncClient(f"unix://{socket_path}", timeout=5) as client:
            yield client
    finally:
        stop.set()
        await task


@pytest.fixture
def served(make_settings: Callable[..., Settings], socket_path: Path) -> Served:
    """``await served(**audit)``: run ``serve``, make ``CALLS`` calls through the socket, stop it (it writes the
    checkpoint at shutdown)."""

    async def run(**audit: Any) -> None:
        settings = make_settings(server={"listen": [f"unix://{socket_path}"]},
                                 audit={"chain_key": KEY, "checkpoint_interval_seconds": 0, **audit})
        async with serving(settings, socket_path) as client:
            for n in range(CALLS):
                assert (await client.execute("echo", {"text": f"call {n}"})).data is not None

    return run


async def verify(config: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    """``toolbooth audit verify --config CONFIG FLAGS`` (in a thread: it runs its own event loop)."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["audit", "verify", "--config", str(config), *flags])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def rechain_unkeyed(db: Path, start: int) -> None:
    """What someone without the key can do: recompute every link from the ``start``-th event on, unkeyed."""
    with sqlite3.connect(db) as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM audit ORDER BY id")]
        prev = conn.execute("SELECT hash FROM audit WHERE id = ?", (ids[start - 1],)).fetchone()[0] \
            if start else GENESIS_HASH
        for event_id in ids[start:]:
            row = conn.execute(f"SELECT {', '.join(EVENT_COLUMNS)} FROM audit WHERE id = ?", (event_id,)).fetchone()
            digest = event_hash(tuple(row), prev)
            conn.execute("UPDATE audit SET prev_hash = ?, hash = ? WHERE id = ?", (prev, digest, event_id))
            prev = digest


def edit(db: Path, event_id: int) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE audit SET status = 'denied', error_code = 'POLICY_DENIED' WHERE id = ?", (event_id,))


async def test_the_untouched_log_verifies_with_its_checkpoint(served: Served, db: Path, config: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    await served()
    code, out, err = await verify(config, capsys)
    assert code == 0, out + err
    assert out.startswith(f"audit chain intact: {CALLS} event(s), last hash {KEYED_PREFIX}")
    assert f"checkpoint matches: {CALLS} event(s)" in out and "unkeyed" not in err
    code, out, err = await verify(config, capsys, "--output", "json")
    document = json.loads(out)
    assert (code, err, document["ok"], document["keyed"], document["warnings"]) == (0, "", True, True, [])
    assert document["chain"]["checked"] == CALLS and document["chain"]["last_hash"].startswith(KEYED_PREFIX)
    assert document["checkpoint"]["state"] == "matches" and document["checkpoint"]["count"] == CALLS


async def test_an_edited_event_rechained_without_the_key_is_found(served: Served, db: Path, config: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    await served()
    with sqlite3.connect(db) as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM audit ORDER BY id")]
    edit(db, ids[2])
    rechain_unkeyed(db, 0)  # the whole chain recomputed without the key: every link holds, unkeyed
    code, out, _ = await verify(config, capsys)
    assert code == 1
    assert "events removed after the checkpoint" in out and "head not found" in out


async def test_an_edit_in_the_middle_of_the_keyed_chain_is_the_broken_link(
        served: Served, db: Path, config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    await served()
    with sqlite3.connect(db) as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM audit ORDER BY id")]
    edit(db, ids[3])
    rechain_unkeyed(db, 3)  # its hash and every later link, recomputed without the key
    code, out, _ = await verify(config, capsys)
    assert code == 1
    assert out.startswith(f"audit chain BROKEN at event id {ids[3]}: ") and "without the chain key" in out
    code, out, _ = await verify(config, capsys, "--output", "json")
    document = json.loads(out)
    assert (code, document["ok"], document["chain"]["broken"]["id"]) == (1, False, ids[3])
    assert document["chain"]["checked"] == 3 and document["checkpoint"]["state"] == "not_compared"


async def test_deleting_the_newest_events_is_found(served: Served, db: Path, config: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    await served()
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM audit WHERE id IN (SELECT id FROM audit ORDER BY id DESC LIMIT 2)")
    code, out, _ = await verify(config, capsys)
    assert code == 1
    assert out.startswith(f"audit chain intact: {CALLS - 2} event(s)")  # what is left is a valid chain ...
    assert "events removed after the checkpoint" in out and f"the log holds {CALLS - 2}" in out  # ... but short
    code, out, _ = await verify(config, capsys, "--output", "json")
    checkpoint = json.loads(out)["checkpoint"]
    assert (code, checkpoint["state"], checkpoint["count"]) == (1, "contradicted", CALLS)
    assert f"the log holds {CALLS - 2}" in checkpoint["problem"]


async def test_an_altered_checkpoint_fails_its_signature(served: Served, db: Path, config: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    await served()
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM audit WHERE id IN (SELECT id FROM audit ORDER BY id DESC LIMIT 2)")
    checkpoint = db.with_name(db.name + ".checkpoint")
    data = json.loads(checkpoint.read_text())
    [chain] = data["chains"]
    checkpoint.write_text(json.dumps({**data, "chains": [{**chain, "count": chain["count"] - 2}]}))  # hide it
    code, out, _ = await verify(config, capsys)
    assert code == 1 and out.startswith("audit checkpoint INVALID: ") and "signature" in out
    code, out, _ = await verify(config, capsys, "--output", "json")
    document = json.loads(out)
    assert (code, document["ok"], document["chain"], document["checkpoint"]["state"]) == (1, False, None, "invalid")
    assert "signature" in document["checkpoint"]["problem"]


async def test_a_wrong_key_fails_the_checkpoint(served: Served, db: Path, config: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    await served()
    key_file = tmp_path / "other.key"
    key_file.write_text("another key of sixteen bytes or more\n")
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"store": {"sqlite_path": str(db)}, "audit": {"chain_key_file": str(key_file)}}))
    code, out, _ = await verify(other, capsys)
    assert code == 1 and "signature that fails under the chain key" in out


def counted(checkpoint: Path) -> int:
    """The links the checkpoint file counts, over its chains."""
    return sum(chain["count"] for chain in json.loads(checkpoint.read_text())["chains"])


async def test_the_checkpoint_is_written_at_the_interval(make_settings: Callable[..., Settings], socket_path: Path,
                                                         db: Path, config: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    settings = make_settings(server={"listen": [f"unix://{socket_path}"]},
                             audit={"chain_key": KEY, "checkpoint_interval_seconds": 0.05})
    checkpoint = db.with_name(db.name + ".checkpoint")
    async with serving(settings, socket_path) as client:
        await client.execute("echo", {"text": "x"})
        await until(lambda: checkpoint.exists() and counted(checkpoint) == 1, what="the interval's checkpoint")
        assert (await verify(config, capsys))[0] == 0  # while the sidecar runs
    assert counted(checkpoint) == 1
    assert checkpoint.stat().st_mode & 0o777 == 0o600


async def test_without_a_chain_key_the_chain_is_unkeyed_and_says_so(
        make_settings: Callable[..., Settings], socket_path: Path, db: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    settings = make_settings(server={"listen": [f"unix://{socket_path}"]})
    async with serving(settings, socket_path) as client:
        await client.execute("echo", {"text": "x"})
    assert not db.with_name(db.name + ".checkpoint").exists()
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump({"store": {"sqlite_path": str(db)}}))
    code, out, err = await verify(plain, capsys)
    assert code == 0 and out == f"audit chain intact: 1 event(s), last hash {sqlite_hash(db)}\n"
    assert "audit chain unkeyed" in err and "not detected" in err


def sqlite_hash(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        digest: str = conn.execute("SELECT hash FROM audit ORDER BY id DESC LIMIT 1").fetchone()[0]
    assert digest.startswith("sha256:")
    return digest
