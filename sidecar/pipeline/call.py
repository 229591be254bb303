"""``Call``: the one input object every stage of the chain gets, and what the stages learn about it.

A stage reads what earlier stages set and sets its own part: resolve sets ``tool`` and
``inputs``, validate sets ``arguments``, approval sets ``approved_preview`` (the approved rendering
of a tool that renders its calls), idempotency sets ``detached``, ``key`` and ``deadline``, dispatch
sets ``attempts`` (and ``unknown``, ``late`` for a handler whose outcome is not known). ``progress`` is
where the handler's progress reports go (a streamed call's caller; ``None``: nowhere).
``trail`` is the audit trail: every decision made for the call, by stage; ``decision_ids`` names each one.
``trace_headers`` is the trace context its caller sent (``sidecar.telemetry.propagation``); the trace stage
sets ``trace`` (the call's span) when the sidecar traces, ``span`` makes the stages' own spans, children
of the call's, and ``deciding`` notes a policy decision for the span they share (nothing at all when it
does not trace).
The accessors (``defn``, ``validated``) say which stage must have run, so a stage placed
before the one it depends on fails loudly in tests rather than silently deciding on nothing.
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
from time import monotonic
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from sidecar.canonical import canonical_bytes, legacy_sha256_hex, sha256_hex
from sidecar.contract import CallRequest, Principal, ToolResult
from sidecar.ids import random_uuid_hex
from sidecar.policy.input import CallInput, InputParts, now_utc
from sidecar.state import KeyScope
from sidecar.tools.definition import ProgressSink, ToolContext, ToolDefinition

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from sidecar.telemetry.spans import CallTrace, DecisionOutcome

__all__ = ["Arguments", "Call"]

_NO_SPAN: AbstractContextManager[None] = contextlib.nullcontext()  # also: no decision outcome to note


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


@dataclass(slots=True)
class Call:
    """One tool call on its way through the chain."""

    principal: Principal
    request: CallRequest
    policy_revision: str
    caller_deadline: float | None = None  # ``time.monotonic()`` by which the caller stops waiting
    progress: ProgressSink | None = None  # the transport's: where the handler's progress reports go
    time: str = field(default_factory=now_utc)  # ``input.context.time`` of every decision of the call
    request_id: str = field(default_factory=random_uuid_hex)
    started: float = field(default_factory=monotonic)
    tool: ToolDefinition[Any, Any] | None = None  # resolve: the tool, once available to the caller
    inputs: InputParts | None = None  # resolve: the policy input's shared parts
    arguments: Arguments | None = None  # validate
    approved_preview: dict[str, Any] | None = None  # approval: the rendering its approver approved
    key: KeyScope | None = None  # idempotency: the key this call claimed (``None``: none, or not ours)
    deadline: float | None = None  # idempotency or dispatch: ``time.monotonic()`` by which the handler must end
    attempts: int = 0  # dispatch
    unknown: bool = False  # dispatch: the handler's effect may have happened, its outcome is not known
    late: asyncio.Future[ToolResult] | None = None  # dispatch: that handler runs on; its own result when it ends
    detached: bool = False  # idempotency: a started write records its own outcome, even if the caller leaves
    trail: dict[str, Any] = field(default_factory=dict)  # decisions (as documents) and approval ids, by stage
    decision_ids: dict[str, str] = field(default_factory=dict)  # stage -> the UUID of its decision (decision log)
    trace_headers: Mapping[str, str] | None = None  # the transport's: the caller's trace context
    trace: CallTrace | None = None  # trace: the call's span, when the sidecar traces
    _request_hash: str | None = None

    @property
    def defn(self) -> ToolDefinition[Any, Any]:
        """The resolved tool (only after the resolve stage)."""
        assert self.tool is not None, "the resolve stage must run first"
        return self.tool

    @property
    def validated(self) -> Arguments:
        """The validated arguments (only after the validate stage)."""
        assert self.arguments is not None, "the validate stage must run first"
        return self.arguments

    @property
    def elapsed_ms(self) -> int:
        """Milliseconds since the call arrived."""
        return round((monotonic() - self.started) * 1000)

    @property
    def request_hash(self) -> str:
        """Hash of the canonical request: equal for equal arguments in any key order or spacing.
        Before the arguments are valid, the raw text is hashed instead."""
        if self._request_hash is None:
            if self.arguments is None:
                self._request_hash = sha256_hex(self._hashed())
            else:  # {"arguments": ..., "tool": ..., "version": ...} in JCS order, from the arguments' canonical bytes
                rest = canonical_bytes({"tool": self.request.tool, "version": self.defn.version})
                digest = hashlib.sha256(b'{"arguments":' + self.arguments.canonical + b"," + rest[1:])
                self._request_hash = "sha256:" + digest.hexdigest()
        return self._request_hash

    @property
    def legacy_request_hash(self) -> str | None:
        """The request hash as sidecars wrote it before RFC 8785 (over Python's sorted JSON), which an
        idempotency record stored then holds; it differs from ``request_hash`` for some floats, e.g. ``1e-07``."""
        return legacy_sha256_hex(self._hashed())

    def _hashed(self) -> dict[str, Any]:
        arguments: Any = self.request.arguments_json if self.arguments is None else self.arguments.data
        return {"tool": self.request.tool, "version": self.tool.version if self.tool else "", "arguments": arguments}

    def span(self, kind: str, name: str) -> AbstractContextManager[Span | None]:
        """A span ``{kind} {name}`` (``store claim``, ``handler calculate``), child of the call's,
        while the block runs; ``None`` (and nothing made) when the sidecar does not trace."""
        if self.trace is None:
            return _NO_SPAN
        return self.trace.part(f"{kind} {name}")

    def deciding(self, stage: str) -> AbstractContextManager[DecisionOutcome | None]:
        """Where the block notes the outcome of ``stage``'s policy decision, for the call's ``policy`` span;
        ``None`` (and nothing noted) when the sidecar does not trace."""
        if self.trace is None:
            return _NO_SPAN
        return self.trace.deciding(stage)

    def context(self, deadline: float) -> ToolContext:
        """What the tool's handler (or its preview renderer) may know of this call, to end by ``deadline``."""
        logger = logging.LoggerAdapter(_tool_logger(self.request.tool), {"request_id": self.request_id})
        return ToolContext(principal=self.principal, request_id=self.request_id, deadline=deadline,
                           idempotency_key=self.request.idempotency_key, attempt=1, logger=logger,
                           progress_sink=self.progress, approved_preview=self.approved_preview,
                           conversation_id=self.request.conversation_id or None, settings=self.defn.settings)

    def handler_deadline(self) -> float:
        """When the handler must end (``time.monotonic()``), fixed the first time it is asked: the tool's
        timeout from now, or the caller's deadline if earlier; for a detached call (a write) the tool's timeout
        alone: once started, it runs on after its caller stopped waiting, and its outcome is recorded."""
        if self.deadline is None:
            self.deadline = monotonic() + self.defn.timeout if self.detached else self.deadline_from_now()
        return self.deadline

    def deadline_from_now(self) -> float:
        """The tool's timeout from now, or the caller's deadline if earlier (``time.monotonic()``)."""
        deadline = monotonic() + self.defn.timeout
        return deadline if self.caller_deadline is None else min(deadline, self.caller_deadline)


@functools.cache
def _tool_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"toolbooth.tool.{name}")
