"""``Call``: the one input object every stage of the chain gets, and the records the stages add to it.

Its input, given when the transport makes it: ``principal``, ``request`` (whose malformed string fields the
request stage replaces by placeholders, the one change to the input), ``policy_revision``, ``caller_deadline``
(``time.monotonic()`` by which the caller stops waiting), ``progress`` (where the handler's progress reports go;
``None``: nowhere), ``trace_headers`` (the trace context its caller sent, ``sidecar.telemetry.propagation``),
``time`` (``input.context.time`` of its decisions), ``request_id`` and ``started``.

What the stages learn is a record each, set once by the stage that owns it (stages numbered as in
``sidecar.pipeline.order``), ``None`` until then; setting one again is a bug (``AssertionError`` naming its stage):

==============  ===============  ==========================================================================
record          set by           what it holds
==============  ===============  ==========================================================================
``trace``       trace (0)        the call's span (``CallTrace``), when the sidecar traces and samples it
``inputs``      resolve (3)      the policy input's shared parts, before the availability decision
``tool``        resolve (3)      the tool, once it is available to the caller
``arguments``   validate (4)     the validated arguments (``Arguments``)
``history``     history (5)      the history facts its decisions read (``Seen``), when its policies read history
``approved``    approval (7)     the checked approval (``Approved``: the rendering its approver approved)
``claim``       idempotency (8)  a write's key and its handler's deadline (``KeyClaim``): the call is detached
``dispatched``  dispatch (10)    the handler's attempts, for an unknown outcome its late result, its result's labels
==============  ===============  ==========================================================================

``trail`` gathers every decision made for the call, by stage (the audit log records it); ``decision_ids`` names
each one. ``span`` makes the stages' own spans, children of the call's, and ``deciding`` notes a policy decision
for the span they share (nothing at all when the sidecar does not trace). The accessors (``defn``, ``validated``)
say which stage must have run, so a stage placed before the one it depends on fails loudly in tests rather than
silently deciding on nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from operator import attrgetter
from time import monotonic
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from pydantic import BaseModel

from sidecar.canonical import canonical_bytes, legacy_sha256_hex, sha256_hex
from sidecar.contract import CallRequest, Principal, ToolResult
from sidecar.ids import random_uuid_hex
from sidecar.pipeline.approval_calls import Approved
from sidecar.policy.input import CallInput, InputParts, dumps, now_utc
from sidecar.state import KeyScope
from sidecar.tools.definition import ProgressSink, ToolContext, ToolDefinition

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from sidecar.policy.reload import Pin
    from sidecar.telemetry.spans import CallTrace, DecisionOutcome

__all__ = ["Arguments", "Call", "Dispatched", "KeyClaim", "Reservation", "Seen"]

_NO_SPAN: AbstractContextManager[None] = contextlib.nullcontext()  # also: no decision outcome to note
T = TypeVar("T")


class Once(property, Generic[T]):
    """A record of ``Call``, kept in the slot ``slot``: ``None`` until set; set once, by ``stage`` (setting it again
    raises ``AssertionError``). A ``property`` whose getter is ``attrgetter``: read as fast as any property."""

    def __init__(self, slot: str, stage: str) -> None:
        read = attrgetter(slot)

        def write(call: Call, value: T) -> None:
            if read(call) is not None:
                raise AssertionError(f"call.{slot.lstrip('_')} is set once, by the {stage} stage")
            setattr(call, slot, value)

        super().__init__(read, write)

    if TYPE_CHECKING:  # what the property's own ``__get__`` and ``__set__`` return and take, for the type checker
        @overload
        def __get__(self, call: None, owner: type | None = None, /) -> Once[T]: ...
        @overload
        def __get__(self, call: Call, owner: type | None = None, /) -> T | None: ...
        def __get__(self, call: Call | None, owner: type | None = None, /) -> Once[T] | T | None: ...
        def __set__(self, call: Call, value: T, /) -> None: ...


@dataclass(frozen=True, slots=True)
class Arguments:
    """Validated arguments: the model the handler gets, its JSON data with secrets in clear (for policies,
    hashes and previews), the JSON pointers of its sensitive values, ``input.call`` for the policies (whose
    ``arguments`` is the data's ``sorted_json``, what the audit log records when nothing is sensitive), and
    the data's canonical form (RFC 8785, which the request hash covers)."""

    model: BaseModel
    data: dict[str, Any]
    sensitive: frozenset[str]
    call: CallInput
    canonical: bytes


@dataclass(frozen=True, slots=True)
class KeyClaim:
    """A write's claim (idempotency): the key it claims, which the stages after that one own, and its handler's
    deadline (``time.monotonic()``): the tool's timeout from the claim, not the caller's deadline."""

    key: KeyScope
    deadline: float


@dataclass(frozen=True, slots=True)
class Dispatched:
    """What dispatching the handler did: its ``attempts`` (0: it never started), whether its outcome is
    ``unknown`` (its effect may have happened), for a handler that runs on, its own result when it ends, and the
    ``labels`` its handler added to its output (none without one; a result that does not give the output, one too
    large, carries none)."""

    attempts: int
    unknown: bool = False
    late: asyncio.Future[ToolResult] | None = None
    labels: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Reservation:
    """A call's place on one meter (``scope``), taken at ``at`` (epoch seconds): released if the call does not run."""

    scope: str
    at: float


@dataclass(frozen=True, slots=True)
class Seen:
    """One call's history facts: ``document`` (``{"history": {"meters", "failures"}, "conversation": {"id",
    "labels"}}``), its JSON text (what the policy input holds), and the meter places the call reserved."""

    document: dict[str, Any]
    json: str
    reservations: tuple[Reservation, ...] = ()
    _parts: dict[frozenset[str], str | None] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, meters: Mapping[str, Any], failures: list[dict[str, Any]], conversation: str | None,
           labels: list[dict[str, Any]], reservations: tuple[Reservation, ...] = ()) -> Seen:
        """The facts from their parts."""
        document = {"history": {"meters": dict(meters), "failures": failures},
                    "conversation": {"id": conversation, "labels": labels}}
        return cls(document, dumps(document)[1:-1], reservations)

    def json_of(self, members: frozenset[str]) -> str | None:
        """The JSON text of ``members`` of the document (``history``, ``conversation``): what a decision reading
        them gets in its input (``None``: none)."""
        if members.issuperset(self.document):
            return self.json
        if (text := self._parts.get(members)) is None and members not in self._parts:
            part = {name: value for name, value in self.document.items() if name in members}
            text = self._parts[members] = dumps(part)[1:-1] if part else None
        return text

    @property
    def labels(self) -> list[dict[str, Any]]:
        """``input.conversation.labels``."""
        return self.document["conversation"]["labels"]  # type: ignore[no-any-return]


@dataclass(slots=True)
class Call:
    """One tool call on its way through the chain."""

    principal: Principal
    request: CallRequest
    policy_revision: str
    caller_deadline: float | None = None
    progress: ProgressSink | None = None
    time: str = field(default_factory=now_utc)
    request_id: str = field(default_factory=random_uuid_hex)
    started: float = field(default_factory=monotonic)
    trace_headers: Mapping[str, str] | None = None
    trail: dict[str, Any] = field(default_factory=dict)  # decisions (as documents) and approval ids, by stage
    decision_ids: dict[str, str] = field(default_factory=dict)  # stage -> the UUID of its decision (decision log)
    pin: Pin | None = field(default=None, repr=False)  # the decisions': the policy set they come from (``Decider``)
    _trace: CallTrace | None = field(default=None, init=False, repr=False)
    _inputs: InputParts | None = field(default=None, init=False, repr=False)
    _tool: ToolDefinition[Any, Any] | None = field(default=None, init=False, repr=False)
    _arguments: Arguments | None = field(default=None, init=False, repr=False)
    _history: Seen | None = field(default=None, init=False, repr=False)
    _approved: Approved | None = field(default=None, init=False, repr=False)
    _claim: KeyClaim | None = field(default=None, init=False, repr=False)
    _dispatched: Dispatched | None = field(default=None, init=False, repr=False)
    _request_hash: str | None = field(default=None, init=False, repr=False)

    trace = Once["CallTrace"]("_trace", "trace")
    inputs = Once[InputParts]("_inputs", "resolve")
    tool = Once[ToolDefinition[Any, Any]]("_tool", "resolve")
    arguments = Once[Arguments]("_arguments", "validate")
    history = Once[Seen]("_history", "history")
    approved = Once[Approved]("_approved", "approval")
    claim = Once[KeyClaim]("_claim", "idempotency")
    dispatched = Once[Dispatched]("_dispatched", "dispatch")

    @property
    def defn(self) -> ToolDefinition[Any, Any]:
        """The resolved tool (only after the resolve stage)."""
        assert self._tool is not None, "the resolve stage must run first"
        return self._tool

    @property
    def validated(self) -> Arguments:
        """The validated arguments (only after the validate stage)."""
        assert self._arguments is not None, "the validate stage must run first"
        return self._arguments

    @property
    def detached(self) -> bool:
        """Whether the idempotency stage detached this write from its caller (``claim``): it records its own
        outcome, even if the caller leaves."""
        return self._claim is not None

    @property
    def attempts(self) -> int:
        """How many times the handler was started (0 before dispatch, or if it never started)."""
        return 0 if self._dispatched is None else self._dispatched.attempts

    @property
    def elapsed_ms(self) -> int:
        """Milliseconds since the call arrived."""
        return round((monotonic() - self.started) * 1000)

    @property
    def request_hash(self) -> str:
        """Hash of the canonical request: equal for equal arguments in any key order or spacing.
        Before the arguments are valid, the raw text is hashed instead."""
        if self._request_hash is None:
            if self._arguments is None:
                self._request_hash = sha256_hex(self._hashed())
            else:  # {"arguments": ..., "tool": ..., "version": ...} in JCS order, from the arguments' canonical bytes
                rest = canonical_bytes({"tool": self.request.tool, "version": self.defn.version})
                digest = hashlib.sha256(b'{"arguments":' + self._arguments.canonical + b"," + rest[1:])
                self._request_hash = "sha256:" + digest.hexdigest()
        return self._request_hash

    @property
    def legacy_request_hash(self) -> str | None:
        """The request hash as sidecars wrote it before RFC 8785 (over Python's sorted JSON), which an
        idempotency record stored then holds; it differs from ``request_hash`` for some floats, e.g. ``1e-07``."""
        return legacy_sha256_hex(self._hashed())

    def _hashed(self) -> dict[str, Any]:
        arguments: Any = self.request.arguments_json if self._arguments is None else self._arguments.data
        return {"tool": self.request.tool, "version": self._tool.version if self._tool else "", "arguments": arguments}

    def span(self, kind: str, name: str) -> AbstractContextManager[Span | None]:
        """A span ``{kind} {name}`` (``store claim``, ``handler calculate``), child of the call's,
        while the block runs; ``None`` (and nothing made) when the sidecar does not trace."""
        if self._trace is None:
            return _NO_SPAN
        return self._trace.part(f"{kind} {name}")

    def deciding(self, stage: str) -> AbstractContextManager[DecisionOutcome | None]:
        """Where the block notes the outcome of ``stage``'s policy decision, for the call's ``policy`` span;
        ``None`` (and nothing noted) when the sidecar does not trace."""
        if self._trace is None:
            return _NO_SPAN
        return self._trace.deciding(stage)

    def context(self, deadline: float) -> ToolContext:
        """What the tool's handler (or its preview renderer) may know of this call, to end by ``deadline``."""
        logger = logging.LoggerAdapter(_tool_logger(self.request.tool), {"request_id": self.request_id})
        return ToolContext(principal=self.principal, request_id=self.request_id, deadline=deadline,
                           idempotency_key=self.request.idempotency_key, attempt=1, logger=logger,
                           progress_sink=self.progress,
                           approved_preview=None if self._approved is None else self._approved.rendering,
                           conversation_id=self.request.conversation_id or None, settings=self.defn.settings,
                           declared_labels=self.defn.labels)

    def handler_deadline(self) -> float:
        """When the handler must end (``time.monotonic()``): for a detached call (a write) its claim's, the tool's
        timeout alone (once started, it runs on after its caller stopped waiting, and its outcome is recorded);
        for another, ``deadline_from_now``."""
        return self.deadline_from_now() if self._claim is None else self._claim.deadline

    def deadline_from_now(self) -> float:
        """The tool's timeout from now, or the caller's deadline if earlier (``time.monotonic()``)."""
        deadline = monotonic() + self.defn.timeout
        return deadline if self.caller_deadline is None else min(deadline, self.caller_deadline)


@functools.cache
def _tool_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"toolbooth.tool.{name}")
