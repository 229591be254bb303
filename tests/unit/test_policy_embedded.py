"""EmbeddedEngine: loading, revision, decisions, and failing closed on anything malformed."""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import regorus

from sidecar.config import bundled_policy_dir
from sidecar.contract import ErrorCode
from sidecar.errors import PolicyEvaluationError, PolicyLoadError
from sidecar.policy import CALL_STAGES, Decision, Stage
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.files import checked_files, clean_regorus_error
from sidecar.policy.input import PolicyInput

VALID_BODIES = {
    Stage.AVAILABILITY: 'decision := {"allow": true}',
    Stage.AUTHZ: 'decision := {"allow": true}',
    Stage.APPROVAL: 'decision := {"required": false}',
}


def write_policies(root: Path, **bodies: str | None) -> Path:
    """One tiny module per stage; ``bodies`` replaces a stage's rules (``None`` leaves the package out)."""
    root.mkdir(parents=True, exist_ok=True)
    for stage in CALL_STAGES:
        body = bodies.get(stage.value, VALID_BODIES[stage])
        if body is not None:
            (root / f"{stage.value}.rego").write_text(f"package toolbooth.{stage.value}\n\nimport rego.v1\n\n{body}\n")
    return root


def sample_input(
    *, roles: tuple[str, ...] = ("developer",), tool: str = "calculate", **tool_fields: Any
) -> PolicyInput:
    """An input document of the documented shape."""
    return PolicyInput.of({
        "principal": {"id": "u1", "tenant": "t1", "roles": list(roles), "permissions": []},
        "tool": {"name": tool, "version": "1.0.0", "side_effect": "none", "permissions": [], **tool_fields},
        "call": {"arguments": {"expression": "1 + 2"}, "conversation_id": "c1", "idempotency_key": "k"},
        "context": {"stage": "authz", "time": "2026-11-30T15:00:00Z", "conversation_id": "c1"},
    })


@pytest.fixture
def policy_copy(tmp_path: Path) -> Path:
    """A writable copy of the bundled policies."""
    return Path(shutil.copytree(bundled_policy_dir(), tmp_path / "toolbooth"))


def test_loads_bundled_policies() -> None:
    engine = EmbeddedEngine.load(bundled_policy_dir())
    assert engine.revision.startswith("sha256:")
    assert len(engine.revision.removeprefix("sha256:")) == 16


def test_revision_is_stable_across_loads(policy_copy: Path) -> None:
    assert EmbeddedEngine.load(policy_copy).revision == EmbeddedEngine.load(bundled_policy_dir()).revision


@pytest.mark.parametrize("name", ["authz.rego", "data.json"])
def test_revision_changes_when_a_file_changes(policy_copy: Path, name: str) -> None:
    before = EmbeddedEngine.load(policy_copy).revision
    file = policy_copy / name
    file.write_text(file.read_text() + "\n")
    assert EmbeddedEngine.load(policy_copy).revision != before


def test_revision_changes_when_a_policy_is_added(policy_copy: Path) -> None:
    before = EmbeddedEngine.load(policy_copy).revision
    (policy_copy / "extra.rego").write_text("package toolbooth.extra\n\nlimit := 3\n")
    assert EmbeddedEngine.load(policy_copy).revision != before


def test_test_files_are_neither_loaded_nor_hashed(policy_copy: Path) -> None:
    before = EmbeddedEngine.load(policy_copy).revision
    (policy_copy / "broken_test.rego").write_text("package toolbooth.broken_test\n\ntest_x if {\n")
    assert EmbeddedEngine.load(policy_copy).revision == before


async def test_decides_each_stage() -> None:
    engine = EmbeddedEngine.load(bundled_policy_dir())
    irreversible = sample_input(tool="send_email", side_effect="external_irreversible", permissions=["email:send"])
    assert await engine.decide(Stage.AVAILABILITY, sample_input()) == Decision(allow=True, reason="tool is available")
    assert (await engine.decide(Stage.AUTHZ, irreversible)).allow
    assert (await engine.decide(Stage.APPROVAL, irreversible)).required


async def test_decide_many_keeps_input_order() -> None:
    engine = EmbeddedEngine.load(bundled_policy_dir())
    tools = ["calculate", "admin_console", "search", "admin_console"]
    decisions = await engine.decide_many(Stage.AVAILABILITY, [sample_input(tool=tool) for tool in tools])
    assert [d.allow for d in decisions] == [True, False, True, False]


async def test_decide_many_of_nothing_is_empty() -> None:
    assert await EmbeddedEngine.load(bundled_policy_dir()).decide_many(Stage.AUTHZ, []) == []


async def test_recursive_modules_and_data_are_loaded(tmp_path: Path) -> None:
    root = write_policies(tmp_path, authz=None)
    (root / "authz.rego").write_text(
        'package toolbooth.authz\n\nimport data.toolbooth.lib\n\ndecision := {"allow": lib.permitted}\n'
    )
    (root / "lib").mkdir()
    (root / "lib" / "common.rego").write_text("package toolbooth.lib\n\npermitted := data.toolbooth.open\n")
    (root / "data.json").write_text('{"toolbooth": {"open": true}}')
    assert (await EmbeddedEngine.load(root).decide(Stage.AUTHZ, sample_input())).allow


async def test_policies_checked_in_a_worker_thread_evaluate_on_the_loop(tmp_path: Path) -> None:
    engine = EmbeddedEngine(await asyncio.to_thread(checked_files, write_policies(tmp_path)))
    assert (await engine.decide(Stage.AUTHZ, sample_input())).allow


async def test_other_threads_cannot_use_the_bound_engine(tmp_path: Path) -> None:
    engine = EmbeddedEngine.load(write_policies(tmp_path))
    await engine.decide(Stage.APPROVAL, sample_input())
    raised: list[BaseException] = []

    def decide_elsewhere() -> None:
        try:
            asyncio.run(engine.decide(Stage.APPROVAL, sample_input()))
        except PolicyEvaluationError as exc:
            raised.append(exc)

    # A thread joined here: it holds no reference that could outlive the engine's own thread.
    worker = threading.Thread(target=decide_elsewhere)
    worker.start()
    worker.join()
    assert len(raised) == 1 and "thread" in str(raised[0])


async def test_resource_not_found_code_is_accepted(tmp_path: Path) -> None:
    root = write_policies(tmp_path, authz='decision := {"allow": false, "code": "RESOURCE_NOT_FOUND", "reason": "r"}')
    decision = await EmbeddedEngine.load(root).decide(Stage.AUTHZ, sample_input())
    assert decision == Decision(allow=False, code=ErrorCode.RESOURCE_NOT_FOUND, reason="r")


def test_syntax_error_names_the_file(tmp_path: Path) -> None:
    root = write_policies(tmp_path, authz='decision := {"allow": ')
    with pytest.raises(PolicyLoadError, match=r"authz\.rego") as caught:
        EmbeddedEngine.load(root)
    assert "Stack backtrace" not in str(caught.value)


def test_compile_error_is_found_at_load(tmp_path: Path) -> None:
    root = write_policies(tmp_path, approval='decision := {"required": true} if undefined_thing')
    with pytest.raises(PolicyLoadError, match=r"approval\.rego(.|\n)*undefined_thing"):
        EmbeddedEngine.load(root)


def test_invalid_data_names_the_file(tmp_path: Path) -> None:
    root = write_policies(tmp_path)
    (root / "data.json").write_text("[1, 2]")
    with pytest.raises(PolicyLoadError, match=r"data\.json"):
        EmbeddedEngine.load(root)


def test_missing_package_is_named(tmp_path: Path) -> None:
    root = write_policies(tmp_path, approval=None)
    with pytest.raises(PolicyLoadError, match=r"data\.toolbooth\.approval"):
        EmbeddedEngine.load(root)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="does not exist"):
        EmbeddedEngine.load(tmp_path / "nowhere")


def test_directory_without_policies(tmp_path: Path) -> None:
    (tmp_path / "authz_test.rego").write_text("package toolbooth.authz_test\n")
    with pytest.raises(PolicyLoadError, match="no policies"):
        EmbeddedEngine.load(tmp_path)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('decision := {"allow": 1 / input.zero > 0}', "divide by zero"),
        ('decision := {"allow": to_number(input.call.arguments.expression) > 0}', "could not parse"),
    ],
)
async def test_runtime_error_fails_closed(tmp_path: Path, body: str, message: str) -> None:
    engine = EmbeddedEngine.load(write_policies(tmp_path, authz=body))
    with pytest.raises(PolicyEvaluationError, match=message):
        await engine.decide(Stage.AUTHZ, PolicyInput.of({**sample_input().document(), "zero": 0}))


def _engines_reachable_from(exc: BaseException) -> list[Any]:
    """The regorus engines in the locals of every frame an exception (and its cause or context) keeps alive."""
    found, seen, todo = [], set(), [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        tb = current.__traceback__
        while tb is not None:
            found += [value for value in tb.tb_frame.f_locals.values() if isinstance(value, regorus.Engine)]
            tb = tb.tb_next
        todo += [chained for chained in (current.__cause__, current.__context__) if chained is not None]
    return found


@pytest.mark.parametrize("stage", [Stage.AUTHZ, Stage.AVAILABILITY])
async def test_a_failed_decision_keeps_no_regorus_engine_alive(tmp_path: Path, stage: Stage) -> None:
    """A log record or a reference cycle may keep a failure's traceback alive until another thread frees it;
    a regorus engine it held would then be dropped on that thread, which regorus forbids."""
    bodies = {Stage.AUTHZ: 'decision := {"allow": 1 / input.zero > 0}', Stage.AVAILABILITY: 'decision := {"allow": 1}'}
    engine = EmbeddedEngine.load(write_policies(tmp_path, **{stage.value: bodies[stage]}))
    with pytest.raises(PolicyEvaluationError) as failure:
        await engine.decide(stage, PolicyInput.of({**sample_input().document(), "zero": 0}))
    assert _engines_reachable_from(failure.value) == []


async def test_input_that_is_not_json_fails_closed(tmp_path: Path) -> None:
    engine = EmbeddedEngine.load(write_policies(tmp_path))
    with pytest.raises(PolicyEvaluationError):
        await engine.decide(Stage.AUTHZ, PolicyInput('{"principal": '))


@pytest.mark.parametrize(
    ("stage", "body"),
    [
        pytest.param(Stage.AUTHZ, 'decision := {"allow": true} if input.never', id="undefined"),
        pytest.param(Stage.AUTHZ, "decision := null", id="null"),
        pytest.param(Stage.AUTHZ, "decision := true", id="boolean"),
        pytest.param(Stage.AUTHZ, 'decision := ["allow"]', id="array"),
        pytest.param(Stage.AVAILABILITY, 'decision := {"reason": "no flag"}', id="missing-allow"),
        pytest.param(Stage.AVAILABILITY, 'decision := {"allow": "yes"}', id="string-allow"),
        pytest.param(Stage.APPROVAL, 'decision := {"allow": true}', id="approval-without-required"),
        pytest.param(Stage.APPROVAL, 'decision := {"required": 1}', id="number-required"),
        pytest.param(Stage.AUTHZ, 'decision := {"allow": false, "code": "TOOL_UNAVAILABLE"}', id="unknown-code"),
        pytest.param(Stage.AUTHZ, 'decision := {"allow": false, "code": ["PERMISSION_DENIED"]}', id="array-code"),
        pytest.param(Stage.AUTHZ, 'decision := {"allow": false, "reason": 7}', id="number-reason"),
    ],
)
async def test_malformed_decision_fails_closed(tmp_path: Path, stage: Stage, body: str) -> None:
    engine = EmbeddedEngine.load(write_policies(tmp_path, **{stage.value: body}))
    with pytest.raises(PolicyEvaluationError, match=rf"data\.toolbooth\.{stage.value}\.decision"):
        await engine.decide(stage, sample_input())


def test_clean_regorus_error_drops_the_backtrace() -> None:
    exc = RuntimeError("\n--> a.rego:4:7\nerror: divide by zero\n\nStack backtrace:\n   0: <unknown>\n")
    assert clean_regorus_error(exc) == "--> a.rego:4:7\nerror: divide by zero"


@pytest.mark.parametrize(("body", "message"), [
    ('decision := {"allow": x}', "var x is unsafe"),
    ('decision := {"allow": undefined_function(1)}', "could not find function"),
])
def test_rules_that_cannot_compile_are_refused_at_load(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(PolicyLoadError, match=message):
        EmbeddedEngine.load(write_policies(tmp_path, authz=body))
