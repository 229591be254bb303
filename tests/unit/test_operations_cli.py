"""``toolbooth operations list | resolve`` on a SQLite store holding keyed calls in every state."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.contract import ErrorCode, OperationState, Status, ToolResult
from sidecar.state import DEADLINE_GRACE_SECONDS, Claim, KeyScope
from sidecar.state.sqlite import SqliteStore
from tests.support.tables import table_columns

LOST = KeyScope("acme", "dev-1", "create_note", "lost")
RUNNING = KeyScope("acme", "dev-1", "create_note", "running")
DONE = KeyScope("acme", "dev-1", "create_note", "done")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    async def fill() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        await store.claim(LOST, "h", "r-lost", deadline_at=time.time() - DEADLINE_GRACE_SECONDS - 1)
        await store.claim(RUNNING, "h", "r-running", deadline_at=time.time() + 60)
        await store.claim(DONE, "h", "r-done", deadline_at=time.time() + 60)
        await store.complete(DONE, "{}", request_id="r-done")
        await store.aclose()

    asyncio.run(fill())
    return tmp_path / "store.db"


@pytest.fixture
def config(db: Path, store_config: Callable[[Path], Path]) -> Path:
    return store_config(db)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def claim_again(db: Path, scope: KeyScope) -> Claim:
    async def claim() -> Claim:
        store = await SqliteStore.open(db)
        try:
            return await store.claim(scope, "h", "r-retry")
        finally:
            await store.aclose()

    return asyncio.run(claim())


def resolve(capsys: pytest.CaptureFixture[str], config: Path, key: str, *flags: str) -> tuple[int, str, str]:
    return run(capsys, "operations", "resolve", key, "--tool", "create_note", "--principal", "dev-1",
               "--tenant", "acme", "--config", str(config), *flags)


def test_list_shows_calls_without_a_result(capsys: pytest.CaptureFixture[str], config: Path) -> None:
    code, out, _ = run(capsys, "operations", "list", "--config", str(config), "--output", "json")
    records = json.loads(out)
    assert code == 0 and [(record["key"], record["state"]) for record in records] == [("lost", "unknown"),
                                                                                    ("running", "in_progress")]
    assert set(records[0]) == {"tenant", "principal_id", "tool", "key", "state", "request_id", "created_at",
                               "deadline_at", "overran_at"}
    code, out, _ = run(capsys, "operations", "list", "--unknown", "--config", str(config), "--output", "json")
    assert code == 0 and [record["request_id"] for record in json.loads(out)] == ["r-lost"]


def test_list_prints_a_table_by_default(capsys: pytest.CaptureFixture[str], config: Path) -> None:
    code, out, _ = run(capsys, "operations", "list", "--config", str(config))
    header, *rows = out.splitlines()
    assert code == 0 and header.split() == ["TOOL", "KEY", "PRINCIPAL", "TENANT", "STATE", "REQUEST", "CREATED",
                                            "DEADLINE"]
    assert [row.split()[:6] for row in rows] == [["create_note", "lost", "dev-1", "acme", "unknown", "r-lost"],
                                                 ["create_note", "running", "dev-1", "acme", "in_progress",
                                                  "r-running"]]
    code, out, _ = run(capsys, "operations", "list", "--config", str(config), "--unknown")
    assert [row.split()[1] for row in out.splitlines()[1:]] == ["lost"]


def test_resolve_prints_json_with_output_json(capsys: pytest.CaptureFixture[str], config: Path) -> None:
    code, out, _ = resolve(capsys, config, "lost", "--completed", "--output", "json")
    document = json.loads(out)
    assert code == 0 and (document["resolved"], document["key"], document["outcome"]) == (True, "lost", "completed")
    assert document["result"]["status"] == "success"
    code, out, err = resolve(capsys, config, "lost", "--completed", "--output", "json")
    assert (code, out) == (1, "")
    assert json.loads(err)["error"] == {"code": "FAILURE", "exit_code": 1, "message": "the keyed call 'lost' of tool "
                                        "'create_note', principal 'dev-1', tenant 'acme' already has a result; "
                                        "nothing to resolve"}


@pytest.mark.parametrize(("flag", "status"), [("--completed", Status.SUCCESS), ("--failed", Status.ERROR)])
def test_resolve_stores_a_result_retries_replay(capsys: pytest.CaptureFixture[str], config: Path, db: Path,
                                                flag: str, status: Status) -> None:
    code, out, _ = resolve(capsys, config, "lost", flag, "--note", "checked the CRM")
    assert code == 0 and "resolved 'lost'" in out
    replay = claim_again(db, LOST).record
    assert replay is not None and replay.result_json is not None
    assert replay.state is (OperationState.COMPLETED if status is Status.SUCCESS else OperationState.FAILED)
    result = ToolResult.model_validate_json(replay.result_json)
    assert result.status is status and result.data == {"resolved_by_operator": True, "note": "checked the CRM"}
    if status is Status.ERROR:
        assert result.error is not None and result.error.code is ErrorCode.INTERNAL_ERROR
        assert result.error.message == "resolved as failed by an operator: checked the CRM"


def test_resolve_refuses_unknown_and_finished_keys(capsys: pytest.CaptureFixture[str], config: Path, db: Path) -> None:
    code, _, err = resolve(capsys, config, "never", "--completed")
    assert code == 1 and "no keyed call 'never'" in err
    code, _, err = resolve(capsys, config, "done", "--failed")
    assert code == 1 and "already has a result; nothing to resolve" in err
    done = claim_again(db, DONE)
    assert done.record is not None and not done.reused and done.record.result_json == "{}"


def test_resolve_needs_exactly_one_outcome(capsys: pytest.CaptureFixture[str], config: Path) -> None:
    assert resolve(capsys, config, "lost")[0] == 2
    assert resolve(capsys, config, "lost", "--completed", "--failed")[0] == 2
    lost = claim_again(config.parent / "store.db", LOST)
    assert lost.record is not None and not lost.reused and lost.record.state is OperationState.UNKNOWN


@pytest.mark.parametrize("width", [60, 40])
def test_list_fits_a_narrow_terminal(capsys: pytest.CaptureFixture[str], config: Path, db: Path,
                                     monkeypatch: pytest.MonkeyPatch, width: int) -> None:
    long = KeyScope("acme-corporation-emea", "service-account-billing-reconciler", "create_note",
                    "reconcile-2026-11-invoices-batch-0042")

    async def claim() -> None:
        store = await SqliteStore.open(db)
        await store.claim(long, "h", "r-long-request-id-0123456789", deadline_at=time.time() + 60)
        await store.aclose()

    asyncio.run(claim())
    monkeypatch.setenv("COLUMNS", str(width))
    code, out, _ = run(capsys, "operations", "list", "--config", str(config))
    columns = table_columns(out, ["TOOL", "KEY", "PRINCIPAL", "TENANT", "STATE", "REQUEST", "CREATED", "DEADLINE"])
    assert code == 0 and max(len(line) for line in out.splitlines()) <= width
    assert columns[:6] == ["create_note" * 3, f"lostrunning{long.key}", f"dev-1dev-1{long.principal_id}",
                           f"acmeacme{long.tenant}", "unknownin_progressin_progress",
                           "r-lostr-runningr-long-request-id-0123456789"]
    records = json.loads(run(capsys, "operations", "list", "--config", str(config), "--output", "json")[1])
    assert columns[6] == "".join(record["created_at"] for record in records)
