"""The policy seam: every engine has every ``PolicyEngine`` member, and ``DelegatingEngine`` passes each on."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from sidecar.policy import Decision, DelegatingEngine, PolicyEngine, Stage
from sidecar.policy.cache import CachingEngine
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.input import PolicyInput
from sidecar.policy.opa import OpaEngine
from sidecar.policy.reload import ReloadingEngine

MEMBERS = {"revision", "reads_idempotency_key", "decide", "decide_many", "audit_masks", "history_needs",
           "aclose"}


class Inner:
    """An engine that answers from fixed values and records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    @property
    def revision(self) -> str:
        return "sha256:inner"

    @property
    def reads_idempotency_key(self) -> bool:
        return True

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        self.calls.append(("decide", (stage, input)))
        return Decision(allow=True, reason="inner")

    async def decide_many(self, stage: Stage, inputs: Sequence[PolicyInput]) -> list[Decision]:
        self.calls.append(("decide_many", (stage, list(inputs))))
        return [Decision(allow=False, reason=str(i)) for i, _ in enumerate(inputs)]

    async def audit_masks(self) -> dict[str, tuple[str, ...]]:
        self.calls.append(("audit_masks", None))
        return {"login": ("/password",)}

    async def aclose(self) -> None:
        self.calls.append(("aclose", None))


class Denying(DelegatingEngine):
    """A wrapper that changes one thing: every single decision is a deny."""

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        return Decision(reason="denied by the wrapper")


def test_the_protocol_names_everything_callers_use() -> None:
    assert {name for name in vars(PolicyEngine) if not name.startswith("_")} == MEMBERS


@pytest.mark.parametrize("engine", [EmbeddedEngine, OpaEngine, DelegatingEngine])
def test_every_engine_defines_every_member_itself(engine: type) -> None:
    assert MEMBERS <= set(vars(engine)), MEMBERS - set(vars(engine))


@pytest.mark.parametrize("wrapper", [CachingEngine, ReloadingEngine])
def test_wrappers_are_delegating_engines(wrapper: type) -> None:
    assert issubclass(wrapper, DelegatingEngine)


async def test_delegating_engine_passes_every_call_on() -> None:
    inner = Inner()
    engine: PolicyEngine = DelegatingEngine(inner)
    one, two = PolicyInput.of({"n": 1}), PolicyInput.of({"n": 2})
    assert engine.revision == "sha256:inner" and engine.reads_idempotency_key
    assert await engine.decide(Stage.AUTHZ, one) == Decision(allow=True, reason="inner")
    assert await engine.decide_many(Stage.APPROVAL, [one, two]) == [Decision(reason="0"), Decision(reason="1")]
    assert await engine.audit_masks() == {"login": ("/password",)}
    await engine.aclose()
    assert inner.calls == [("decide", (Stage.AUTHZ, one)), ("decide_many", (Stage.APPROVAL, [one, two])),
                           ("audit_masks", None), ("aclose", None)]


async def test_a_wrapper_overrides_only_what_it_changes() -> None:
    inner = Inner()
    engine = Denying(inner)
    assert await engine.decide(Stage.AUTHZ, PolicyInput.of({})) == Decision(reason="denied by the wrapper")
    assert await engine.decide_many(Stage.AUTHZ, [PolicyInput.of({})]) == [Decision(reason="0")]
    assert engine.revision == "sha256:inner" and await engine.audit_masks() == {"login": ("/password",)}
    await engine.aclose()
    assert [name for name, _ in inner.calls] == ["decide_many", "audit_masks", "aclose"]


async def test_the_wrapped_engine_can_be_replaced() -> None:
    first, second = Inner(), Inner()
    engine = DelegatingEngine(first)
    engine.inner = second
    await engine.decide(Stage.AVAILABILITY, PolicyInput.of({}))
    assert first.calls == [] and [name for name, _ in second.calls] == ["decide"]
