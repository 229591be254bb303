"""The input document every policy decision sees (documented in ``docs/policies.md``).

Inputs travel as JSON text, which is what every engine evaluates (regorus parses
it; an OPA server receives it). One call's three decisions share the principal, the
tool and the arguments, so each part is serialized once and the documents are
composed from the parts — and only when an engine reads them: a decision the cache
answers needs only the input's ``cache_key``, made of the same parts.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sidecar.canonical import sorted_json
from sidecar.contract import CallRequest, Principal, SideEffect
from sidecar.policy.decision import Stage

__all__ = ["IDEMPOTENCY_KEY", "CallInput", "InputBatch", "InputParts", "PolicyInput", "ToolFacts", "dumps", "now_utc",
           "principal_json", "tool_json"]

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode  # made once
IDEMPOTENCY_KEY = "idempotency_key"  # ``input.call``'s field the decision cache leaves out where no policy reads it


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


class PolicyInput:
    """One decision's input document, as JSON text (composed when first read).

    ``cache_key`` identifies the input without its clock (``context.time``) and without
    ``idempotency_key`` (``input.call.idempotency_key``, kept apart so that the decision cache
    can leave it out where no policy reads it: ``sidecar.policy.cache``): two inputs with equal
    keys and keys differ only in when they were made. ``cache_key`` ``None``: never cached.
    """

    __slots__ = ("_compose", "_json", "cache_key", "idempotency_key")

    def __init__(self, json: str | Callable[[], str], cache_key: tuple[str, ...] | None = None,
                 idempotency_key: str | None = None) -> None:
        self._json: str | None = json if isinstance(json, str) else None
        self._compose: Callable[[], str] | None = None if isinstance(json, str) else json
        self.cache_key, self.idempotency_key = cache_key, idempotency_key

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> PolicyInput:
        """Serialize a document (tests and tools build inputs this way)."""
        return cls(dumps(document))

    @property
    def json(self) -> str:
        """The input document as JSON text."""
        if self._json is None:
            assert self._compose is not None
            self._json, self._compose = self._compose(), None
        return self._json

    def document(self) -> dict[str, Any]:
        """The input as Python data."""
        return json.loads(self.json)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class CallInput:
    """``input.call`` in parts: the validated arguments as JSON text and the request's identifiers."""

    arguments: str  # ``sidecar.canonical.sorted_json`` of the arguments: the text the audit log records
    conversation_id: str | None
    idempotency_key: str | None

    @classmethod
    def of(cls, arguments: Mapping[str, Any], request: CallRequest) -> CallInput:
        """``input.call`` of ``arguments`` (JSON data) in the call ``request``."""
        return cls(sorted_json(arguments), request.conversation_id, request.idempotency_key)

    def json(self) -> str:
        """``input.call`` as JSON text."""
        return (f'{{"arguments":{self.arguments},"conversation_id":{_text(self.conversation_id)},'
                f'"idempotency_key":{_text(self.idempotency_key)}}}')


@dataclass(frozen=True, slots=True)
class InputParts:
    """The serialized parts shared by the decisions of one call (or one listing)."""

    principal: str
    tool: str
    time: str
    conversation_id: str | None

    def build(self, stage: Stage, call: CallInput | None = None, history: str | None = None) -> PolicyInput:
        """The input for ``stage``; ``call`` once arguments are validated; ``history``: the members ``history`` and
        ``conversation`` as JSON text (``sidecar.pipeline.history.Seen.json``), where the policies read them."""
        key: tuple[str, ...] = (self.principal, self.tool, self.conversation_id or "",
                                "" if call is None else call.arguments)
        if history is not None:
            key = (*key, history)
        return PolicyInput(functools.partial(self._compose, stage, call, history), key,
                           None if call is None else call.idempotency_key)

    def _compose(self, stage: Stage, call: CallInput | None, history: str | None) -> str:
        context = f'{{"stage":"{stage.value}","time":"{self.time}","conversation_id":{_text(self.conversation_id)}}}'
        tail = "" if call is None else f',"call":{call.json()}'
        if history is not None:
            tail = f"{tail},{history}"
        return f'{{"principal":{self.principal},"tool":{self.tool},"context":{context}{tail}}}'

    def recorded(self) -> str:
        """The parts but the conversation id, as one JSON object: what the audit log keeps of them."""
        return f'{{"principal":{self.principal},"tool":{self.tool},"time":{dumps(self.time)}}}'

    @classmethod
    def from_recorded(cls, recorded: str, conversation_id: str | None) -> InputParts:
        """The parts again, from ``recorded()`` and the call's conversation id."""
        document = json.loads(recorded)
        return cls(dumps(document["principal"]), dumps(document["tool"]), document["time"], conversation_id)


class InputBatch(Sequence[PolicyInput]):
    """The inputs of one stage's decisions for many tools (a listing), each made when read.

    ``cache_key`` names the whole batch as ``PolicyInput.cache_key`` names one input — principal, conversation and
    ``tools_key``, which names the tools (their ``tool_json`` texts, in order) — so that a cache can answer the
    batch as one without making its inputs.
    """

    def __init__(self, stage: Stage, principal: str, tools: Sequence[str], time: str, conversation_id: str | None,
                 tools_key: str) -> None:
        self._stage, self._principal, self._tools, self._time = stage, principal, tools, time
        self._conversation_id = conversation_id
        self.cache_key = (principal, conversation_id or "", tools_key)

    def __len__(self) -> int:
        return len(self._tools)

    @typing.overload
    def __getitem__(self, index: int) -> PolicyInput: ...
    @typing.overload
    def __getitem__(self, index: slice) -> Sequence[PolicyInput]: ...
    def __getitem__(self, index: int | slice) -> PolicyInput | Sequence[PolicyInput]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return InputParts(self._principal, self._tools[index], self._time, self._conversation_id).build(self._stage)


@functools.lru_cache(maxsize=1024)
def principal_json(principal: Principal) -> str:
    """``input.principal`` (principals are frozen: the text of recent ones is kept)."""
    return dumps(principal.model_dump(mode="json"))


def tool_json(defn: ToolFacts) -> str:
    """``input.tool``."""
    return dumps({
        "name": defn.name,
        "version": defn.version,
        "side_effect": defn.side_effect.value,
        "permissions": list(defn.permissions),
        "plugin": defn.plugin,
    })


_clock: tuple[int, str] = (-1, "")  # the last second asked for, and its text


def now_utc() -> str:
    """``input.context.time``: RFC 3339, UTC, seconds (the text of the current second is kept)."""
    global _clock
    second = int(time.time())
    if _clock[0] != second:
        _clock = (second, dt.datetime.fromtimestamp(second, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return _clock[1]


def _text(value: str | None) -> str:
    """An optional string as JSON (most are absent)."""
    return "null" if value is None else dumps(value)


def dumps(value: Any) -> str:
    """``value`` as compact JSON text, as every input document is written."""
    return _encode(value)
