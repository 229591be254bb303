"""Attacks on the audit chain's hashing since ``event_hash`` writes an event's canonical JSON field by field (and
``audit_row`` and the SQLite insert take an event's values otherwise): a log must hash exactly as before.

- Golden vectors: events holding what a caller can put into them (quotes, backslashes, control characters,
  U+2028, non-BMP characters, very long and masked arguments), with the hashes the code before the change
  (``BEFORE``) computed for them, unkeyed and keyed: the chain still computes them, a log holding them (in the
  store a real sidecar made) verifies, and changing any column of any event is the broken link.
- Across versions: a real sidecar of the code of ``BEFORE`` (taken from git into a directory of its own) writes
  a log of such calls that ``toolbooth audit verify`` of today's code finds intact, and the other way round,
  keyed and unkeyed; each version recomputes every stored hash of the other's.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.client import AsyncClient, ClientError
from sidecar.config import Settings
from sidecar.state.chain import EVENT_COLUMNS, GENESIS_HASH, LATER_COLUMNS, chained
from sidecar.state.rows import CHAINED_COLUMNS
from tests.adversarial.test_audit_tamper import serving, verify
from tests.support.cli import REPO, cli_env, start_sidecar
from tests.support.installed import install
from tests.support.required import missing

pytestmark = pytest.mark.integration

# The last commit before the audit hash was written field by field (4adde42) and the rows taken by attrgetter (753fae4).
BEFORE = "e94e93c"
KEY = "a chain key of at least sixteen bytes"
MASK = "hmac-sha256:" + "0123456789abcdef" * 4
LONG_TEXT = ("x\u2028\"\\\U0001F600\x1f" * 40_000)[:200_000]


def golden_rows() -> list[tuple[object, ...]]:
    """Events as the audit log holds them (values in ``EVENT_COLUMNS`` order), with what a caller can put into them:
    quotes, backslashes, control characters, line and paragraph separators, non-BMP characters, very long and
    masked arguments; the first from before ``decision_ids`` and ``decision_input`` existed."""
    return [
        ("req-1", "2026-01-01T00:00:00.000+00:00", "user-1", "acme", "echo", "1.0.0", "sha256:" + "1" * 64, "[]",
         "sha256:rev", None, None, None, "success", None, 3, None, None, None),
        ("req-2", "2026-01-01T00:00:01.000+00:00", 'a"b\\c\'d', "\x00\x01\x1f\x7f", "echo", "1.0.0",
         "sha256:" + "2" * 64, '[{"allow": true, "reason": "q\\"uote"}]', "sha256:rev", "key \"1\"",
         "\t\r\n\b\f", "\u2028\u2029", "error", "INVALID_ARGUMENT", 0,
         '{"text":"line\\nbreak \\"quoted\\" back\\\\slash \\u0000"}', "{}", None),
        ("req-3", "2026-01-01T00:00:02.000+00:00", "\U0001F600\U0010FFFF", "\ufeff\ue000\ud7ff\uffff", "echo",
         "1.0.0", "sha256:" + "3" * 64, "[]", "sha256:rev", "", "", "\u00e9\u0085\u00a0</script>", "success", "",
         2**53 - 1, '{"text":"\U0001F600 \u2028 \\ud83d\\ude00"}', '{"authz":"00000000-0000-0000-0000-000000000000"}',
         '{"principal":{"id":"\U0001F600"},"time":"2026-01-01T00:00:02Z"}'),
        ("req-4", "2026-01-01T00:00:03.000+00:00", "user-1", "acme", "say", "1.0.0", "sha256:" + "4" * 64, "[]",
         "sha256:rev", None, None, None, "success", None, 1_234_567,
         '{"secret":"' + MASK + '","tag":"' + MASK + '","text":"' + LONG_TEXT.replace("\\", "\\\\").replace('"', '\\"')
         .replace("\x1f", "\\u001f") + '"}', "{}", '{"principal":{"id":"user-1"}}'),
        ("req-5", "2026-01-01T00:00:04.000+00:00", "", "", "", "", "", "", "", None, None, None, "", None,
         -(2**53 - 1), "", "", ""),
    ]


# What ``chained`` of BEFORE computed for ``golden_rows()`` from the genesis: without a key, and with KEY.
GOLDEN_UNKEYED = [
    "sha256:9a7ce54bf29cecd887991914707e4b643e6ca2ee988c2ff5724e8bd2f3e59273",
    "sha256:b408b0ec9cd8250eac13316873b14890d519f08e64134e902a53f08b5c2f57fc",
    "sha256:8c0d2a2edd43a377ae181dcb9028a7f6da720b431950008746362faf2980da94",
    "sha256:f21e08e66f7ca81fa6ddcfbb54d54af787b4d1eb6b6281f733e15eea3d18d977",
    "sha256:3e84af7d7e44202f5b2466d8a2975f364c1daed9187183f1984747627eac64f9",
]
GOLDEN_KEYED = [
    "hmac-sha256:9a7d92a682d4e63b4d260d100ce75792387374c2531724416672dab6a96072aa",
    "hmac-sha256:1054b9a4776c4fc85bd5a92953e7761649fc2be26782f5dca879ec4ce6e5487c",
    "hmac-sha256:02b33c934c47ec2f53a3fc9071879d2ee0cf829523ca66524f87c2b1adb57911",
    "hmac-sha256:e8a28092c36ea4cbd5e7af31b79436e4ad7b461d3350f1c6e636f9a182de7326",
    "hmac-sha256:fa4769116215fa4dc873ea25d2a20ce894d97e2b0f279613b8c2476a9bb9f35c",
]
KEYINGS = [pytest.param(None, id="unkeyed"), pytest.param(KEY, id="keyed")]


def stored(db: Path) -> list[tuple[Any, ...]]:
    """Every audit row: ``id``, the event's values, ``prev_hash``, ``hash``."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute(f"SELECT id, {', '.join(EVENT_COLUMNS)}, prev_hash, hash FROM audit ORDER BY id").fetchall()


def write_config(path: Path, db: Path, key: str | None, **sections: Any) -> Path:
    """A config of ``db``'s store (and of ``key``, the chain key, if given) plus ``sections``."""
    config: dict[str, Any] = {"store": {"sqlite_path": str(db)}, **sections}
    if key is not None:
        config["audit"] = {**config.get("audit", {}), "chain_key": key}
    path.write_text(yaml.safe_dump(config))
    return path


# --- golden vectors ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", KEYINGS)
def test_the_chain_still_computes_the_hashes_of_before(key: str | None) -> None:
    golden = GOLDEN_KEYED if key else GOLDEN_UNKEYED
    linked = list(chained(None, golden_rows(), key.encode() if key else None))
    assert [row[-1] for row in linked] == golden
    assert [row[-2] for row in linked[1:]] == golden[:-1]


@pytest.fixture
async def golden_log(make_settings: Callable[..., Settings], socket_path: Path, tmp_path: Path) -> Path:
    """A real sidecar's store (one call made, then stopped) whose log is replaced by ``golden_rows()`` linked as the
    code of BEFORE linked them, without a key; ``golden_log.with_suffix('.keyed.db')``: the same, keyed."""
    db = tmp_path / "toolbooth.db"
    settings = make_settings(server={"listen": [f"unix://{socket_path}"]})
    async with serving(settings, socket_path) as client:
        assert (await client.execute("echo", {"text": "made the store"})).data is not None
    assert not db.with_name(db.name + ".checkpoint").exists()  # unkeyed: no checkpoint to contradict
    shutil.copy(db, keyed := db.with_suffix(".keyed.db"))
    for path, hashes in ((db, GOLDEN_UNKEYED), (keyed, GOLDEN_KEYED)):
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("DELETE FROM audit")
            prev = [GENESIS_HASH, *hashes[:-1]]
            conn.executemany(f"INSERT INTO audit (id, chain_id, {', '.join(CHAINED_COLUMNS)}) "
                             f"VALUES ({', '.join('?' * (len(CHAINED_COLUMNS) + 2))})",
                             [(n, 1, *row, prev[n - 1], hashes[n - 1]) for n, row in enumerate(golden_rows(), 1)])
    return db


@pytest.mark.parametrize("key", KEYINGS)
async def test_a_log_written_before_verifies(golden_log: Path, tmp_path: Path, key: str | None,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    db = golden_log if key is None else golden_log.with_suffix(".keyed.db")
    config = write_config(tmp_path / "verify.yaml", db, key)
    code, out, err = await verify(config, capsys, "--output", "json")
    report = json.loads(out)
    assert (code, report["ok"], report["keyed"]) == (0, True, key is not None), out + err
    golden = GOLDEN_KEYED if key else GOLDEN_UNKEYED
    assert report["chain"]["checked"] == len(golden) and report["chain"]["last_hash"] == golden[-1]
    assert report["chain"]["unkeyed"] == (0 if key else len(golden))


def tampered(value: Any) -> list[Any]:
    """Other values a column could be changed to: each must break the link."""
    if value is None:
        return ["", "null"]
    if isinstance(value, int):  # (an integer's text in the INTEGER column would be stored as the same integer)
        nearer = value - 1 if value > 0 else value + 1  # within JCS's integers (see the last test)
        return [nearer, f"{value}x", value / 3 if value else 0.25]
    if not value:
        return [None, " "]
    changed = value[:-1] + chr(ord(value[-1]) ^ 1) if ord(value[-1]) ^ 1 < 0xD800 else value[:-1] + "a"
    return [changed, value + " ", None, value.replace("\\", "\\\\") if "\\" in value else value.upper()]


TAMPERED_COLUMNS = [*EVENT_COLUMNS, "prev_hash", "hash"]
NULLABLE = {*LATER_COLUMNS, "idempotency_key", "call_id", "conversation_id", "error_code", "arguments_json",
            "prev_hash", "hash"}


@pytest.mark.parametrize("key", KEYINGS)
async def test_changing_any_column_of_an_event_written_before_breaks_its_link(
        golden_log: Path, tmp_path: Path, key: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    source = golden_log if key is None else golden_log.with_suffix(".keyed.db")
    tried: list[tuple[str, int, Any]] = []
    missed: list[tuple[str, int, Any, str]] = []
    for event_id, row in enumerate(stored(source), 1):
        for column, original in zip(TAMPERED_COLUMNS, row[1:], strict=True):
            for value in tampered(original):
                if value == original or (value is None and column not in NULLABLE):
                    continue  # the same, or NULL where the column cannot be NULL
                db = tmp_path / "tampered.db"
                shutil.copy(source, db)
                with contextlib.closing(sqlite3.connect(db)) as conn, conn:
                    conn.execute(f"UPDATE audit SET {column} = ? WHERE id = ?", (value, event_id))
                code, out, err = await verify(write_config(tmp_path / "verify.yaml", db, key), capsys,
                                              "--output", "json")
                broken = json.loads(out)["chain"]["broken"] if code == 1 else None
                # the changed event itself, or (its hash changed) the next one, whose prev_hash no longer matches
                expected = {event_id, event_id + 1} if column == "hash" else {event_id}
                if broken is None or broken["id"] not in expected:
                    missed.append((column, event_id, value, out + err))
                tried.append((column, event_id, value))
    assert {column for column, _, _ in tried} == set(TAMPERED_COLUMNS)
    assert missed == []


@pytest.mark.parametrize("value", [2**53, -(2**63), 2.0**60, b"\x00"], ids=["2^53", "-2^63", "2.0^60", "blob"])
async def test_a_value_canonical_json_cannot_hold_is_a_broken_link_not_a_crash(
        golden_log: Path, tmp_path: Path, value: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with contextlib.closing(sqlite3.connect(golden_log)) as conn, conn:
        conn.execute("UPDATE audit SET duration_ms = ? WHERE id = 3", (value,))
    code, out, _ = await verify(write_config(tmp_path / "verify.yaml", golden_log, None), capsys, "--output", "json")
    report = json.loads(out)
    assert (code, report["ok"], report["chain"]["broken"]["id"]) == (1, False, 3)


# --- across versions -----------------------------------------------------------------------------------------------

PLUGIN = '''
    from pydantic import BaseModel, Field, SecretStr

    from sidecar.plugin import SENSITIVE, Plugin, SideEffect, ToolContext, tool


    class SayInput(BaseModel):
        text: str
        secret: SecretStr
        tag: str = Field(default="", json_schema_extra=SENSITIVE)


    class Said(BaseModel):
        length: int


    @tool(name="say", version="1.0.0", side_effect=SideEffect.NONE, timeout=5)
    async def say(args: SayInput, ctx: ToolContext) -> Said:
        """Count the text's characters."""
        return Said(length=len(args.text))


    PLUGIN = Plugin([say])
'''
BURST = 48  # calls at once
HOSTILE = ['"', "\\", '\\"', "'\"\\u0000", "\x00\x01\x1f\x7f", "\t\r\n\b\f", "\u2028\u2029", "\U0001F600\U0010FFFF",
           "\ufeff\ue000\uffff", "</script>", "\u00e9\u0085\u00a0", '{"a":1}', MASK]


@pytest.fixture(scope="session")
def before(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The code of BEFORE (``sidecar`` and the default ``policies``), in a directory of its own."""
    root = tmp_path_factory.mktemp("before")
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", BEFORE, "sidecar", "policies"],
                                 capture_output=True, check=True, timeout=120).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        missing(f"the code of {BEFORE} is not in this clone ({exc})", install="a clone with its history")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    return root


class Version:
    """Running the code of one version (``root``: a directory holding its ``sidecar``) with the test plugin."""

    def __init__(self, root: Path, site: Path) -> None:
        self.root, self.site = root, site

    def env(self, home: Path) -> dict[str, str]:
        # PYTHONSAFEPATH: ``python -m`` in the repository's directory must not put today's code first.
        env = cli_env(home, PYTHONSAFEPATH="1")
        env["PYTHONPATH"] = os.pathsep.join([str(self.site), str(self.root)])
        return env

    def python(self, home: Path, code: str, *args: str) -> str:
        done = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=self.env(home), capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def toolbooth(self, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sidecar", *args], cwd=REPO, env=self.env(home),
                              capture_output=True, text=True, timeout=120, check=False)

    def hashes(self, home: Path, db: Path, key: str | None) -> list[str]:
        """Every stored event's hash as this version computes it (from its values and stored ``prev_hash``)."""
        return list(json.loads(self.python(home, _RECOMPUTE, str(db), key or "")))


_RECOMPUTE = """
import json, sqlite3, sys
from sidecar.state.chain import EVENT_COLUMNS, event_hash
key = sys.argv[2].encode() or None
with sqlite3.connect(sys.argv[1]) as conn:
    rows = conn.execute(f"SELECT {', '.join(EVENT_COLUMNS)}, prev_hash FROM audit ORDER BY id").fetchall()
print(json.dumps([event_hash(tuple(row[:-1]), row[-1], key) for row in rows]))
"""
_WHICH = "import inspect, sidecar.state.chain as c; print(c.__file__); print('_linked_bytes' in inspect.getsource(c))"


@pytest.fixture
def versions(before: Path, home: Path) -> dict[str, Version]:
    site = home / "site"
    install(site, "toolbooth-test-say", "toolbooth_test_say", {"say": "toolbooth_test_say:PLUGIN"}, PLUGIN)
    found = {"before": Version(before, site), "now": Version(REPO, site)}
    for name, version in found.items():  # each runs its own code
        module, field_by_field = version.python(home, _WHICH).split()
        assert Path(module).is_relative_to(version.root) and field_by_field == str(name == "now"), (name, module)
    return found


async def write_log(version: Version, home: Path, jwt_auth: dict[str, Any], make_token: Callable[..., str],
                    key: str | None) -> tuple[Path, Path, int]:
    """Run ``version``'s ``toolbooth serve`` (JWT auth, the ``say`` plugin), make calls carrying ``HOSTILE`` strings
    wherever a caller can put them, stop it; the store, the config, and how many events it wrote."""
    db, socket = home / "tb.db", home / "tb.sock"
    config = write_config(home / "toolbooth.yaml", db, key, server={"listen": [f"unix://{socket}"]}, auth=jwt_auth,
                          plugins={"allow": ["say"]}, policy={"reload_interval_seconds": 0},
                          limits={"max_argument_bytes": 4 * 1024 * 1024, "max_message_bytes": 8 * 1024 * 1024})
    sidecar = start_sidecar(home, socket, "--config", str(config), env=version.env(home))
    try:
        for n, text in enumerate(HOSTILE):
            token = make_token(sub=f"user {text}", tenant=text)
            async with AsyncClient(f"unix://{socket}", token=token, timeout=30) as client:
                arguments = {"text": text * (1 + n), "secret": f"s3cr3t {n} {text}", "tag": f"t4g {n} {text}"}
                await client.execute("say", arguments, conversation_id=f"c-{n}", call_id=f"call-{n}")
                try:  # control characters in a request's fields: refused, and audited
                    await client.execute("say", arguments, conversation_id=text, call_id=text,
                                         idempotency_key=text)
                except ClientError:
                    pass
                await client.execute("say", {"text": 5, "secret": f"s3cr3t {text}"})  # invalid arguments
                await client.execute(f"no such tool {text}", {"text": text})
        async with AsyncClient(f"unix://{socket}", token=make_token(sub="\u2028 burst"), timeout=60) as client:
            burst = await asyncio.gather(*(client.execute("say", {"text": f"{n} {HOSTILE[n % len(HOSTILE)]}",
                                                                  "secret": f"s3cr3t {n}"}, call_id=f"b-{n}")
                                           for n in range(BURST)))  # written in batches (several rows an insert)
            assert all(result.data is not None for result in burst)
            long = await client.execute("say", {"text": LONG_TEXT, "secret": "s3cr3t " + LONG_TEXT,
                                                "tag": "t4g " + LONG_TEXT[:1000]})
        assert long.data == {"length": len(LONG_TEXT)}, long.error
    finally:
        assert sidecar.stop() == 0, sidecar.log.read_text()
    return db, config, len(stored(db))


@pytest.mark.slow
@pytest.mark.parametrize("key", KEYINGS)
@pytest.mark.parametrize(("writer", "reader"), [("before", "now"), ("now", "before")], ids=["before-now", "now-before"])
async def test_a_log_written_by_one_version_verifies_with_the_other(
        versions: dict[str, Version], home: Path, jwt_auth: dict[str, Any], make_token: Callable[..., str],
        key: str | None, writer: str, reader: str) -> None:
    db, config, events = await write_log(versions[writer], home, jwt_auth, make_token, key)
    rows = stored(db)
    assert events >= 4 * len(HOSTILE) + BURST and all(row[-1] for row in rows)
    logged = "\n".join(str(value) for row in rows for value in row)
    assert "s3cr3t" not in logged and "t4g" not in logged and '"secret":"hmac-sha256:' in logged  # masked
    assert any("\u2028" in str(value) for row in rows for value in row)  # hostile values reached the log
    assert any(any(ord(char) < 0x20 for char in str(value)) for row in rows for value in row[1:-2])

    for name in (writer, reader):  # each version recomputes every stored hash
        assert versions[name].hashes(home, db, key) == [row[-1] for row in rows], name
        verified = versions[name].toolbooth(home, "audit", "verify", "--config", str(config), "--output", "json")
        report = json.loads(verified.stdout)
        assert (verified.returncode, report["ok"], report["keyed"]) == (0, True, key is not None), \
            (name, verified.stdout + verified.stderr)
        assert report["chain"]["checked"] == events and report["chain"]["unkeyed"] == (0 if key else events)
        if key is not None:
            assert report["checkpoint"]["state"] == "matches", report  # the writer's signed checkpoint, too


@pytest.mark.slow
async def test_a_version_appends_to_the_others_log_and_both_verify_the_whole(
        versions: dict[str, Version], home: Path, jwt_auth: dict[str, Any], make_token: Callable[..., str]) -> None:
    _, config, first = await write_log(versions["before"], home, jwt_auth, make_token, KEY)
    _, _, events = await write_log(versions["now"], home, jwt_auth, make_token, KEY)
    assert events > first
    for name, version in versions.items():
        verified = version.toolbooth(home, "audit", "verify", "--config", str(config), "--output", "json")
        report = json.loads(verified.stdout)
        assert (verified.returncode, report["chain"]["checked"]) == (0, events), (name, verified.stdout)
        assert report["checkpoint"]["state"] == "matches"
