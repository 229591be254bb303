"""``toolbooth policy replay`` and ``audit export --format opa`` on an audit log written by a real sidecar.

The sidecar (the default policies, ``echo``'s text masked in the audit log) serves calls that run, are
denied, need approval (and an approver's attempt, which is no call), name a hidden tool, an unknown one, bad
arguments and a write; its log is then
replayed against edited copies of its policies, as a directory and as a bundle, on SQLite and PostgreSQL,
by the embedded engine and by the opa engine (a local OPA server, OPA's own engine) alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sidecar.bootstrap import open_pipeline
from sidecar.cli import main
from sidecar.client import AsyncClient
from sidecar.config import Settings, bundled_policy_dir
from sidecar.contract import Principal
from sidecar.policy.bundle import build_bundle
from sidecar.state import AuditRecord
from sidecar.state.chain import verify_store
from sidecar.tools.masking import MASK_PREFIX
from sidecar.tools.registry import Registry
from tests.contract.conftest import postgres, postgres_dsn
from tests.support import tools
from tests.support.opa_server import OpaServer

pytestmark = pytest.mark.integration
__all__ = ["postgres", "postgres_dsn"]

APPROVER = Principal(id="bob", tenant="dev", roles=("approver",))
CALLS: list[tuple[str, Any, dict[str, str]]] = [  # (tool, arguments, request fields), in this order
    ("echo", {"text": "hello"}, {}),  # runs
    ("echo", {"text": 5}, {}),  # invalid arguments
    ("admin_console", {"text": "x"}, {}),  # hidden from the developer
    ("no_such_tool", {}, {}),  # unknown
    ("delete_records", {"text": "x"}, {}),  # denied: missing permission
    ("send_email", {"text": "x"}, {"idempotency_key": "mail-1"}),  # needs approval
    ("create_note", {"text": "n"}, {"idempotency_key": "note-1"}),  # a write: dispatching, then its outcome
    ("echo", {"text": "x"}, {"call_id": "bad\nid"}),  # refused before any decision
]


@dataclass
class Log:
    """The written log: the store's config file, its records, and the policies that decided them."""

    config: Path
    records: list[AuditRecord]
    policies: Path

    def id_of(self, tool: str, *, status: str | None = None) -> int:
        return next(r.id for r in self.records if r.event.tool == tool and status in (None, r.event.status))


def edited(policies: Path, target: Path, edit: Callable[[dict[str, Any]], None],
           authz_first: str | None = None) -> Path:
    """A copy of ``policies`` with ``edit`` applied to its data and, optionally, an authz deny tried first."""
    shutil.copytree(policies, target)
    data = json.loads((target / "data.json").read_text())
    edit(data["toolbooth"])
    (target / "data.json").write_text(json.dumps(data))
    if authz_first is not None:
        rego = (target / "authz.rego").read_text()
        first = ('decision := {"allow": false, "code": "PERMISSION_DENIED", "reason": "candidate"} if {\n'
                 f"\t{authz_first}\n}} else := {{")
        (target / "authz.rego").write_text(rego.replace("decision := {", first, 1))
    return target


def candidate_edit(data: dict[str, Any]) -> None:
    """Hide echo, show admin_console, grant records:delete, require approval for create_note."""
    data["tools"] = {"echo": {"roles": ["admin"]}, "admin_console": {"roles": ["*"]}}
    data["role_permissions"]["developer"].append("records:delete")
    data["approval"]["tools"].append("create_note")


def replay(capsys: pytest.CaptureFixture[str], log: Log, *flags: str) -> tuple[int, Any]:
    code = main(["policy", "replay", "--config", str(log.config), *flags])
    out = capsys.readouterr().out
    return code, json.loads(out) if "--json" in flags else out


@pytest.fixture(params=["sqlite", "postgres"])
async def log(request: pytest.FixtureRequest, tmp_path: Path, make_settings: Callable[..., Settings],
              start_sidecar: Any) -> AsyncIterator[Log]:
    policies = edited(bundled_policy_dir(), tmp_path / "policies",
                      lambda data: data.update(audit={"mask": {"echo": ["/text"]}}))
    store: dict[str, Any] = {"sqlite_path": str(tmp_path / "toolbooth.db")}
    if request.param == "postgres":
        store = {"postgres_dsn": request.getfixturevalue("postgres_dsn")}
    settings = make_settings(policy={"path": str(policies)}, store=store)
    pipeline = await open_pipeline(settings, registry=Registry.from_tools(tools.ALL))
    try:
        sidecar = await start_sidecar(settings, pipeline)
        async with AsyncClient(str(sidecar.addresses[0]), timeout=10) as client:
            for tool, arguments, fields in CALLS:
                result = await client.execute(tool, arguments, **fields)
                if result.preview is not None:  # an approver's decision is audited too
                    await pipeline.approvals.approve(APPROVER, result.preview.preview_id, result.preview.preview_hash,
                                                     "fine")
        await pipeline.store.flush_audit()
        records = await pipeline.store.audit_records()
        assert (await verify_store(pipeline.store)).broken is None
    finally:
        await pipeline.aclose()
    config = tmp_path / "toolbooth.yaml"
    config.write_text(json.dumps({"store": store}))
    yield Log(config, records, policies)


def changes_of(report: dict[str, Any]) -> dict[int, tuple[str, str, list[tuple[str, str, str]]]]:
    return {c["id"]: (c["before"], c["after"], [(s["stage"], s["before"], s["after"]) for s in c["changes"]])
            for c in report["changes"]}


async def test_an_edited_policy_reports_exactly_what_would_change(log: Log, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    candidate = edited(log.policies, tmp_path / "candidate", candidate_edit)
    code, report = await asyncio.to_thread(replay, capsys, log, "--policies", str(candidate), "--json")
    assert code == 3
    assert changes_of(report) == {
        log.id_of("echo", status="success"): ("would_run", "unavailable", [("availability", "allow", "deny")]),
        log.id_of("echo", status="error"): ("invalid_arguments", "unavailable", [("availability", "allow", "deny")]),
        log.id_of("admin_console"): ("unavailable", "arguments not recorded", [
            ("availability", "deny", "allow"), ("validation", "not reached", "arguments not recorded")]),
        log.id_of("delete_records"): ("denied", "would_run", [
            ("authz", "deny", "allow"), ("approval", "not reached", "not required")]),
        log.id_of("create_note", status="dispatching"): ("would_run", "approval_required", [
            ("approval", "not required", "required")]),
    }
    assert (report["replayed"], report["changed"]) == (6, 5)
    assert report["skipped"] == {"no_decision": 1, "unknown_tool": 1, "same_call": 1}
    denied = next(c for c in report["changes"] if c["tool"] == "delete_records")
    assert denied["principal"] == {"id": "dev", "tenant": "dev", "roles": ["developer"], "permissions": []}
    assert denied["changes"][0]["reason"] == "all required permissions are held"  # the candidate's reason
    hidden = next(c for c in report["changes"] if c["tool"] == "echo" and c["before"] == "would_run")
    assert hidden["changes"][0]["reason"] == "tool is not available"

    code, table = await asyncio.to_thread(replay, capsys, log, "--policies", str(candidate))
    assert code == 3
    lines = table.splitlines()
    assert lines[0].split() == ["ID", "TIME", "TOOL", "PRINCIPAL", "BEFORE", "AFTER", "STAGE", "CHANGE", "REASON"]
    denied_row = next(line for line in lines if "delete_records" in line)
    assert denied_row.startswith(f"{log.id_of('delete_records')} ") and "denied" in denied_row
    assert any("authz" in line and "deny -> allow" in line for line in lines)
    assert lines[-1].startswith(f"replayed 6 call(s) against revision {report['revision']}: 5 would change; "
                                "skipped 3 (")


async def test_the_unchanged_policies_report_nothing_and_exit_0(log: Log, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = await asyncio.to_thread(replay, capsys, log, "--policies", str(log.policies), "--json")
    assert (code, report["changes"], report["replayed"]) == (0, [], 6)
    code, table = await asyncio.to_thread(replay, capsys, log, "--policies", str(log.policies))
    assert code == 0 and table.startswith("replayed 6 call(s) against revision ")
    assert (": 0 would change; skipped 3 (1 a tool no plugin had, 1 refused before any decision, 1 the same call's "
            "later event)") in table


async def test_a_masked_value_replays_as_its_mask(log: Log, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    reads_value = edited(log.policies, tmp_path / "value", lambda data: None, 'input.call.arguments.text == "hello"')
    code, report = await asyncio.to_thread(replay, capsys, log, "--policies", str(reads_value), "--json")
    assert (code, report["changes"]) == (0, [])  # the rule never sees "hello": the log kept its mask
    reads_mask = edited(log.policies, tmp_path / "mask", lambda data: None,
                        f'startswith(input.call.arguments.text, "{MASK_PREFIX}")')
    code, report = await asyncio.to_thread(replay, capsys, log, "--policies", str(reads_mask), "--json")
    assert code == 3
    assert changes_of(report) == {log.id_of("echo", status="success"): ("would_run", "denied", [
        ("authz", "allow", "deny")])}
    assert report["changes"][0]["changes"][0]["reason"] == "PERMISSION_DENIED candidate"


async def test_a_bundle_replays_like_its_directory(log: Log, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    candidate = edited(log.policies, tmp_path / "candidate", candidate_edit)
    bundle = tmp_path / "candidate.tar.gz"
    bundle.write_bytes(build_bundle(candidate, revision="candidate-7"))
    code, from_bundle = await asyncio.to_thread(replay, capsys, log, "--policies", str(bundle), "--json")
    _, from_directory = await asyncio.to_thread(replay, capsys, log, "--policies", str(candidate), "--json")
    assert code == 3 and from_bundle["revision"] == "candidate-7"
    assert changes_of(from_bundle) == changes_of(from_directory)


async def test_since_and_tool_filter_the_calls(log: Log, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    candidate = str(edited(log.policies, tmp_path / "candidate", candidate_edit))
    code, report = await asyncio.to_thread(replay, capsys, log, "--policies", candidate, "--tool", "delete_records",
                                           "--json")
    assert code == 3 and list(changes_of(report)) == [log.id_of("delete_records")] and report["replayed"] == 1
    code, report = await asyncio.to_thread(replay, capsys, log, "--policies", candidate, "--tool", "send_email",
                                           "--json")
    assert (code, report["replayed"], report["changes"]) == (0, 1, [])
    since = next(r.event.time for r in log.records if r.event.tool == "delete_records")
    code, report = await asyncio.to_thread(replay, capsys, log, "--policies", candidate, "--since", since, "--json")
    later = {r.id for r in log.records if r.event.time >= since}
    assert code == 3 and set(changes_of(report)) == later & {log.id_of("delete_records"),
                                                             log.id_of("create_note", status="dispatching")}
    code, report = await asyncio.to_thread(replay, capsys, log, "--policies", candidate, "--since", "2999-01-01",
                                           "--json")
    assert (code, report["replayed"]) == (0, 0)


async def test_a_candidate_that_does_not_load_is_a_clear_error(log: Log, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    broken = edited(log.policies, tmp_path / "broken", lambda data: None)
    (broken / "authz.rego").write_text("package toolbooth.authz\n\ndecision := {\n")
    not_a_bundle = tmp_path / "nonsense.tar.gz"
    not_a_bundle.write_bytes(b"not a bundle")
    for path, message in ((tmp_path / "missing", "no policy directory or bundle at"), (broken, "authz.rego"),
                          (not_a_bundle, "gzip")):
        code = await asyncio.to_thread(main, ["policy", "replay", "--config", str(log.config), "--policies", str(path)])
        captured = capsys.readouterr()
        assert code == 2 and captured.out == ""
        assert captured.err.startswith(f"toolbooth: error: --policies {path}: "), captured.err
        assert message in captured.err, captured.err


async def test_export_as_opa_decision_logs(log: Log, capsys: pytest.CaptureFixture[str]) -> None:
    code = await asyncio.to_thread(main, ["audit", "export", "--config", str(log.config), "--format", "opa"])
    entries = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    by_record: dict[int, list[dict[str, Any]]] = {}
    for entry in entries:
        assert set(entry) == {"decision_id", "path", "input", "result", "timestamp", "bundles", "labels", "req_id"}
        assert entry["labels"]["app"] == "toolbooth" and entry["timestamp"].endswith("Z")
        by_record.setdefault(entry["req_id"], []).append(entry)
    ran = by_record[log.id_of("echo", status="success")]
    assert [e["path"] for e in ran] == ["toolbooth/availability/decision", "toolbooth/authz/decision",
                                        "toolbooth/approval/decision"]
    record = next(r for r in log.records if r.id == log.id_of("echo", status="success"))
    assert {e["decision_id"] for e in ran} == set(json.loads(record.event.decision_ids or "{}").values())
    assert len({e["decision_id"] for e in entries}) == len(entries)
    assert all(e["bundles"] == {"toolbooth": {"revision": record.event.policy_revision}} for e in ran)
    availability, authz, approval = ran
    assert availability["input"]["context"]["stage"] == "availability" and "call" not in availability["input"]
    assert authz["input"]["principal"]["id"] == "dev" and authz["input"]["tool"]["name"] == "echo"
    assert authz["input"]["call"]["arguments"]["text"].startswith(MASK_PREFIX)  # masked, as in the audit log
    assert "hello" not in json.dumps(entries)
    assert (authz["result"]["allow"], approval["result"]["required"]) == (True, False)
    denied = by_record[log.id_of("delete_records")]
    assert denied[1]["result"]["allow"] is False and denied[1]["result"]["code"] == "PERMISSION_DENIED"
    hidden = by_record[log.id_of("admin_console")]
    assert [(e["path"], e["result"]["allow"]) for e in hidden] == [("toolbooth/availability/decision", False)]


async def test_a_candidate_whose_decision_fails_reports_an_error(log: Log, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    failing = edited(log.policies, tmp_path / "failing", lambda data: None)
    (failing / "authz.rego").write_text('package toolbooth.authz\n\nimport rego.v1\n\ndecision := {"allow": "yes"}\n')
    code, report = await asyncio.to_thread(replay, capsys, log, "--policies", str(failing), "--tool", "echo", "--json")
    assert code == 3
    [change] = report["changes"]  # the invalid call never reached authz
    assert (change["before"], change["after"]) == ("would_run", "policy_error")
    [(stage, before, after)] = [(s["stage"], s["before"], s["after"]) for s in change["changes"]]
    assert (stage, before, after) == ("authz", "allow", "error")
    assert "data.toolbooth.authz.decision.allow must be a boolean" in change["changes"][0]["reason"]


@pytest.fixture
def opa() -> Iterator[OpaServer]:
    with OpaServer() as server:
        yield server


def on_opa(log: Log, opa: OpaServer) -> Log:
    """The same log, its config naming the opa engine: the candidate is sent to ``opa``, which decides."""
    config = log.config.with_name("toolbooth-opa.yaml")
    config.write_text(json.dumps({**json.loads(log.config.read_text()),
                                  "policy": {"engine": "opa", "opa": {"url": opa.url, "timeout_seconds": 5}}}))
    return dataclasses.replace(log, config=config)


async def test_the_opa_engine_replays_as_the_embedded_one(log: Log, opa: OpaServer, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    candidate = edited(log.policies, tmp_path / "candidate", candidate_edit)
    bundle = tmp_path / "candidate.tar.gz"
    bundle.write_bytes(build_bundle(candidate, revision="candidate-7"))
    for policies, changed in ((log.policies, 0), (candidate, 3), (bundle, 3)):
        embedded = await asyncio.to_thread(replay, capsys, log, "--policies", str(policies), "--json")
        remote = await asyncio.to_thread(replay, capsys, on_opa(log, opa), "--policies", str(policies), "--json",
                                         "--upload")
        assert remote == embedded and remote[0] == changed, policies
    assert any(seen.method == "POST" and seen.path.startswith("/v1/data/toolbooth/authz/decision") for seen in opa.seen)
    sent = len(opa.seen)
    code, _ = await asyncio.to_thread(replay, capsys, on_opa(log, opa), "--policies", str(candidate))
    assert code == 2 and len([seen for seen in opa.seen[sent:] if seen.method == "PUT"]) == 0  # not without --upload
