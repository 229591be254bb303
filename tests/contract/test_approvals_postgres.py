"""Two sidecars sharing one PostgreSQL database: an approval granted through one is usable through
the other, once, even when both try at the same time."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

from sidecar import bootstrap
from sidecar.config import parse_settings
from sidecar.contract import CallRequest, ErrorCode, Principal, Status
from sidecar.pipeline import Pipeline
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.approvals import NOTE, policies

ALICE = Principal(id="alice", tenant="acme", roles=("developer",))
BOB = Principal(id="bob", tenant="acme", roles=("approver",))


async def open_pipeline(dsn: str, tmp_path: Path, policy_dir: Path) -> Pipeline:
    settings = parse_settings({"store": {"postgres_dsn": dsn, "sqlite_path": str(tmp_path / "unused.db")}})
    return await bootstrap.open_pipeline(settings, registry=Registry.from_tools(tools.ALL), policy=policies(policy_dir))


def note_call(key: str, approval_id: str | None = None) -> CallRequest:
    return CallRequest(tool="file_note", arguments_json=json.dumps(NOTE), idempotency_key=key, approval_id=approval_id)


async def test_an_approval_through_one_sidecar_runs_once_through_either(postgres_dsn: str, tmp_path: Path) -> None:
    first = await open_pipeline(postgres_dsn, tmp_path, tmp_path / "p1")
    second = await open_pipeline(postgres_dsn, tmp_path, tmp_path / "p2")
    try:
        asked = await first.execute(ALICE, note_call("k-0"))
        assert asked.status is Status.APPROVAL_REQUIRED and asked.preview is not None
        preview = asked.preview
        assert (await second.approvals.approve(BOB, preview.preview_id, preview.preview_hash, None)).ok
        before = tools.CREATED.value
        results = await asyncio.gather(*(pipeline.execute(ALICE, note_call(f"k-{i}", preview.preview_id))
                                         for i, pipeline in enumerate([first, second] * 8, start=1)))
        outcomes = Counter(r.error.code if r.error else r.status for r in results)
        assert outcomes == {Status.SUCCESS: 1, ErrorCode.PERMISSION_DENIED: 15}
        assert tools.CREATED.value == before + 1
    finally:
        await first.aclose()
        await second.aclose()
