"""``toolbooth policy check`` and ``policy eval`` decide with the engine ``--config`` names.

With ``policy.engine: opa`` the policies are sent to an OPA server (``tests.support.opa_server``: OPA's own
engine) as ``serve`` sends them, and it decides: on the default policies, and on a copy whose decisions are
malformed, it answers as the embedded engine does. ``policy replay`` on both engines is in
``test_policy_replay.py``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import main
from sidecar.config import PolicyEngineKind, bundled_policy_dir
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.opa_server import OpaServer

pytestmark = pytest.mark.integration

CALLS = [("echo", '{"text": "hi"}'), ("echo", '{"txt": 1}'), ("admin_console", '{"text": "x"}'),
         ("delete_records", '{"text": "x"}'), ("send_email", '{"text": "hi"}'), ("create_note", '{"text": "n"}')]
PRINCIPALS = ['{"id": "u1", "tenant": "acme", "roles": ["developer"], "permissions": []}',
              '{"id": "a1", "tenant": "acme", "roles": ["admin"], "permissions": ["records:delete"]}']


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TOOLBOOTH_* variables from the caller; the test tools instead of the installed plugins."""
    for name in list(os.environ):
        if name.startswith("TOOLBOOTH_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(Registry, "from_entry_points", lambda **kwargs: Registry.from_tools(tools.ALL))


@pytest.fixture
def opa() -> Iterator[OpaServer]:
    with OpaServer() as server:
        yield server


def config(tmp_path: Path, opa: OpaServer, kind: PolicyEngineKind, **opa_settings: Any) -> Path:
    """A config file naming ``kind``, with the OPA server's section (which the embedded engine ignores)."""
    path = tmp_path / f"{kind.value}-{len(list(tmp_path.glob('*.yaml')))}.yaml"
    path.write_text(json.dumps({"policy": {"engine": kind.value,
                                           "opa": {"url": opa.url, "timeout_seconds": 5, **opa_settings}}}))
    return path


def run_json(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, Any]:
    code = main([*map(str, argv), "--output", "json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out else err


def evaluations(capsys: pytest.CaptureFixture[str], tmp_path: Path, config_file: Path,
                *extra: str | Path) -> list[tuple[int, Any]]:
    """``policy eval`` of every call of ``CALLS`` by every principal of ``PRINCIPALS``."""
    found = []
    for index, principal in enumerate(PRINCIPALS):
        file = tmp_path / f"principal-{index}.json"
        file.write_text(principal)
        for tool, arguments in CALLS:
            found.append(run_json(capsys, "policy", "eval", "--tool", tool, "--principal", file, "--args", arguments,
                                  "--time", "2026-11-30T15:00:00Z", "--config", config_file, *extra))
    return found


def test_eval_decides_alike_on_both_engines(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            opa: OpaServer) -> None:
    embedded = evaluations(capsys, tmp_path, config(tmp_path, opa, PolicyEngineKind.EMBEDDED))
    remote = evaluations(capsys, tmp_path, config(tmp_path, opa, PolicyEngineKind.OPA), "--upload")
    assert remote == embedded
    assert {result["outcome"] for _, result in embedded} == {
        "would_run", "invalid_arguments", "unavailable", "denied", "approval_required"}
    assert any(seen.method == "POST" and "/v1/data/toolbooth/authz/decision" in seen.path for seen in opa.seen)


def test_eval_on_policies_opa_manages_uses_what_it_serves(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                          opa: OpaServer) -> None:
    uploaded = evaluations(capsys, tmp_path, config(tmp_path, opa, PolicyEngineKind.OPA), "--upload")
    writes = [seen for seen in opa.seen if seen.method in ("PUT", "DELETE")]
    managed = evaluations(capsys, tmp_path, config(tmp_path, opa, PolicyEngineKind.OPA, upload_policies=False))
    assert [seen for seen in opa.seen if seen.method in ("PUT", "DELETE")] == writes  # nothing sent
    assert {result["revision"] for _, result in managed} == {f"opa:{opa.url}"}
    assert [(code, {**result, "revision": ""}) for code, result in managed] == [
        (code, {**result, "revision": ""}) for code, result in uploaded]

    given = config(tmp_path, opa, PolicyEngineKind.OPA, upload_policies=False)
    code, err = run_json(capsys, "policy", "eval", "--tool", "echo", "--principal", tmp_path / "principal-0.json",
                         "--config", given, "--dir", bundled_policy_dir())
    assert code == 2
    assert f"decides on the policies its server manages (upload_policies: false): {bundled_policy_dir()} " \
           "cannot be sent to it" in err


def malformed(tmp_path: Path) -> Path:
    """The default policies, their approval decision malformed for tools without side effects."""
    policies = Path(shutil.copytree(bundled_policy_dir(), tmp_path / "malformed"))
    (policies / "approval.rego").write_text(
        'package toolbooth.approval\n\nimport rego.v1\n\ndecision := {"required": "yes"} if input.tool.side_effect '
        '== "none"\n\ndecision := {"required": false} if input.tool.side_effect != "none"\n')
    return policies


def test_check_finds_the_same_on_both_engines(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                              opa: OpaServer) -> None:
    policies = malformed(tmp_path)
    reports = {kind: [run_json(capsys, "policy", "check", "--upload", "--config", config(tmp_path, opa, kind), *given)
                      for given in ((), (policies,))] for kind in PolicyEngineKind}
    assert reports[PolicyEngineKind.OPA] == reports[PolicyEngineKind.EMBEDDED]
    (ok_code, ok), (bad_code, bad) = reports[PolicyEngineKind.OPA]
    assert (ok_code, ok["ok"], ok["samples"]) == (0, True, 32)
    assert bad_code == 1 and [p["samples"] for p in bad["problems"]] == [8]
    assert any(seen.method == "PUT" and seen.path == "/v1/policies/toolbooth/approval.rego" for seen in opa.seen)


def test_nothing_is_sent_to_a_serving_opa_without_upload(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                         opa: OpaServer) -> None:
    """A dev tool pointed at the config of a serving sidecar must not replace what its OPA server serves."""
    given = config(tmp_path, opa, PolicyEngineKind.OPA)
    principal = tmp_path / "principal.json"
    principal.write_text(PRINCIPALS[0])
    for argv in (("policy", "check", "--config", given),
                 ("policy", "eval", "--tool", "echo", "--principal", principal, "--config", given)):
        code, err = run_json(capsys, *argv)
        assert code == 2, argv
        assert f"opa {opa.url} would be sent these policies in place of those it serves" in err
        assert "pass --upload if none does" in err
    assert not [seen for seen in opa.seen if seen.method in ("PUT", "DELETE")]
