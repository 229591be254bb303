"""The input document every policy decision sees (documented in ``docs/policies.md``).

Inputs travel as JSON text, which is what every engine evaluates (regorus parses
it; an OPA server receives it). One call's three decisions share the principal, the
tool and the arguments, so each part is serialized once and the documents are
composed from the parts.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sidecar.contract import CallRequest, Principal, SideEffect
from sidecar.policy.decision import Stage

__all__ = ["InputParts", "PolicyInput", "ToolFacts", "call_json", "now_utc", "principal_json", "tool_json"]


class ToolFacts(Protocol):
    """What ``input.tool`` tells a policy about a tool (a ``sidecar.tools`` ``ToolDefinition`` has it all)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def side_effect(self) -> SideEffect: ...
    @property
    def permissions(self) -> Sequence[str]: ...
    @property
    def plugin(self) -> str: ...


@dataclass(frozen=True, slots=True)
class PolicyInput:
    """One decision's input document, as JSON text.

    ``cache_key`` identifies the input without its clock (``context.time``): two
    inputs with equal keys differ only in when they were made. ``None``: never cached.
    """

    json: str
    cache_key: tuple[str, ...] | None = None

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> PolicyInput:
        """Serialize a document (tests and tools build inputs this way)."""
        return cls(_dumps(document))

    def document(self) -> dict[str, Any]:
        """The input as Python data."""
        return json.loads(self.json)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class InputParts:
    """The serialized parts shared by the decisions of one call (or one listing)."""

    principal: str
    tool: str
    time: str
    conversation_id: str | None

    def build(self, stage: Stage, call: str | None = None) -> PolicyInput:
        """The input for ``stage``; ``call`` (see ``call_json``) once arguments are validated."""
        context = f'{{"stage":"{stage.value}","time":"{self.time}","conversation_id":{_dumps(self.conversation_id)}}}'
        tail = "" if call is None else f',"call":{call}'
        key = (self.principal, self.tool, self.conversation_id or "", call or "")
        return PolicyInput(f'{{"principal":{self.principal},"tool":{self.tool},"context":{context}{tail}}}', key)

    def recorded(self) -> str:
        """The parts but the conversation id, as one JSON object: what the audit log keeps of them."""
        return f'{{"principal":{self.principal},"tool":{self.tool},"time":{_dumps(self.time)}}}'

    @classmethod
    def from_recorded(cls, recorded: str, conversation_id: str | None) -> InputParts:
        """The parts again, from ``recorded()`` and the call's conversation id."""
        document = json.loads(recorded)
        return cls(_dumps(document["principal"]), _dumps(document["tool"]), document["time"], conversation_id)


def principal_json(principal: Principal) -> str:
    """``input.principal``."""
    return _dumps(principal.model_dump(mode="json"))


def tool_json(defn: ToolFacts) -> str:
    """``input.tool``."""
    return _dumps({
        "name": defn.name,
        "version": defn.version,
        "side_effect": defn.side_effect.value,
        "permissions": list(defn.permissions),
        "plugin": defn.plugin,
    })


def call_json(arguments: Mapping[str, Any], request: CallRequest) -> str:
    """``input.call``: the validated arguments and the request's identifiers."""
    return _dumps({
        "arguments": arguments,
        "conversation_id": request.conversation_id,
        "idempotency_key": request.idempotency_key,
    })


def now_utc() -> str:
    """``input.context.time``: RFC 3339, UTC, seconds."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
