"""The bundled policies: their own Rego tests, and the scenarios the sidecar relies on."""

from __future__ import annotations

import re

import pytest
import regorus

from sidecar.config import bundled_policy_dir
from sidecar.contract import ErrorCode
from sidecar.policy import CALL_STAGES, Stage
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.input import PolicyInput

POLICY_DIR = bundled_policy_dir()


def rego_tests() -> list[tuple[str, str]]:
    """``(package, rule)`` of every ``test_*`` rule in the bundled ``*_test.rego`` files."""
    found = []
    for file in sorted(POLICY_DIR.rglob("*_test.rego")):
        text = file.read_text()
        package = re.search(r"^package\s+([\w.]+)", text, re.MULTILINE)
        assert package, f"{file} has no package"
        found += [(package[1], rule) for rule in re.findall(r"^(test_\w+)\b", text, re.MULTILINE)]
    return found


@pytest.fixture(scope="module")
def rego() -> regorus.Engine:
    """A regorus engine with the bundled policies, their tests and data."""
    engine = regorus.Engine()
    for file in sorted(POLICY_DIR.rglob("*.rego")):
        engine.add_policy(str(file), file.read_text())
    engine.add_data_json((POLICY_DIR / "data.json").read_text())
    return engine


@pytest.fixture(scope="module")
def engine() -> EmbeddedEngine:
    return EmbeddedEngine.load(POLICY_DIR)


def test_every_policy_has_tests() -> None:
    policies = {f.stem for f in POLICY_DIR.glob("*.rego") if not f.stem.endswith("_test")}
    assert policies == {stage.value for stage in CALL_STAGES}
    assert {f"{name}_test.rego" for name in policies} <= {f.name for f in POLICY_DIR.glob("*_test.rego")}


def test_test_packages_are_loaded(rego: regorus.Engine) -> None:
    assert {package for package, _ in rego_tests()} == {f"toolbooth.{stage.value}_test" for stage in CALL_STAGES}
    assert {f"data.{package}" for package, _ in rego_tests()} <= set(rego.get_packages())


@pytest.mark.parametrize(("package", "rule"), rego_tests(), ids=[f"{p}.{r}" for p, r in rego_tests()])
def test_rego(rego: regorus.Engine, package: str, rule: str) -> None:
    rego.set_input({})
    assert rego.eval_rule(f"data.{package}.{rule}") is True


def call(
    *,
    roles: tuple[str, ...] = ("developer",),
    permissions: tuple[str, ...] = (),
    tool: str = "calculate",
    side_effect: str = "none",
    requires: tuple[str, ...] = (),
) -> PolicyInput:
    """The input document the pipeline sends."""
    return PolicyInput.of({
        "principal": {"id": "u1", "tenant": "t1", "roles": list(roles), "permissions": list(permissions)},
        "tool": {
            "name": tool,
            "version": "1.0.0",
            "side_effect": side_effect,
            "permissions": list(requires),
            "plugin": "toolbooth_example",
        },
        "call": {"arguments": {}, "conversation_id": "c1", "idempotency_key": "k"},
        "context": {"stage": "authz", "time": "2026-11-30T15:00:00Z", "conversation_id": "c1"},
    })


async def test_developer_sees_calculate(engine: EmbeddedEngine) -> None:
    assert (await engine.decide(Stage.AVAILABILITY, call())).allow


@pytest.mark.parametrize(
    ("roles", "visible"), [(("developer",), False), (("reader",), False), ((), False), (("reader", "admin"), True)]
)
async def test_only_admins_see_admin_console(engine: EmbeddedEngine, roles: tuple[str, ...], visible: bool) -> None:
    decision = await engine.decide(Stage.AVAILABILITY, call(roles=roles, tool="admin_console"))
    assert decision.allow is visible


async def test_missing_permission_is_denied_and_named(engine: EmbeddedEngine) -> None:
    decision = await engine.decide(Stage.AUTHZ, call(roles=("reader",), requires=("files:read", "files:write")))
    assert not decision.allow
    assert decision.code is ErrorCode.PERMISSION_DENIED
    assert "files:write" in decision.reason
    assert "files:read" not in decision.reason


async def test_role_granted_permission_is_allowed(engine: EmbeddedEngine) -> None:
    decision = await engine.decide(Stage.AUTHZ, call(roles=("developer",), requires=("files:write",)))
    assert decision.allow
    assert decision.code is None


async def test_direct_permission_is_allowed(engine: EmbeddedEngine) -> None:
    decision = await engine.decide(Stage.AUTHZ, call(roles=(), permissions=("x:y",), requires=("x:y",)))
    assert decision.allow


async def test_external_irreversible_requires_approval(engine: EmbeddedEngine) -> None:
    decision = await engine.decide(Stage.APPROVAL, call(tool="send_email", side_effect="external_irreversible"))
    assert decision.required
    assert "irreversible" in decision.reason


@pytest.mark.parametrize("side_effect", ["none", "internal_reversible", "external_reversible"])
async def test_other_side_effects_need_no_approval(engine: EmbeddedEngine, side_effect: str) -> None:
    assert not (await engine.decide(Stage.APPROVAL, call(side_effect=side_effect))).required
