"""The plugin test kit: a handler's context as the sidecar builds one, and the whole gate in-process.

A decorated tool stays callable, so a handler is tested with its input model and ``make_context``::

    from sidecar.plugin.testing import make_context

    async def test_adds() -> None:
        output = await calculate(CalculateInput(operation="add", operands=[2, 3]), make_context(calculate))
        assert output.result == 5

``open_gate`` runs calls through the sidecar's own chain (policies, validation, idempotency, approval, dispatch,
audit) with a given principal and policy directory, over a SQLite store in a temporary directory; a call's result
is the ``ToolResult`` a gRPC caller gets::

    async with open_gate([calculate]) as gate:
        result = await gate.call("calculate", {"operation": "add", "operands": [2, 3]})
    assert result.status is Status.SUCCESS

Nothing here needs pytest; its fixtures are ``sidecar.plugin.fixtures``'.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from sidecar.contract import ApprovalResult, CallRequest, Principal, Status, ToolListing, ToolResult
from sidecar.tools.definition import ProgressSink, ToolContext, ToolDefinition
from sidecar.tools.plugins import Plugin

if TYPE_CHECKING:
    from sidecar.pipeline import Pipeline
    from sidecar.state.records import AuditEvent

__all__ = ["TEST_APPROVER_ROLE", "Gate", "Status", "ToolResult", "make_context", "open_gate", "principal_for"]

TEST_APPROVER_ROLE = "approver"  # the role the bundled policies let approve (data.toolbooth.approval.approver_roles)
_TENANT = "test"


def principal_for(*tools: ToolDefinition[Any, Any], roles: Iterable[str] = ()) -> Principal:
    """A caller of tenant ``test`` holding every permission ``tools`` require, directly, and ``roles``."""
    held = sorted({permission for defn in tools for permission in defn.permissions})
    return Principal(id="test-user", tenant=_TENANT, roles=tuple(roles), permissions=tuple(held))


def make_context(tool: ToolDefinition[Any, Any] | None = None, *, principal: Principal | None = None,
                 settings: BaseModel | None = None, idempotency_key: str | None = None,
                 conversation_id: str | None = None, approved_preview: dict[str, Any] | None = None,
                 seconds: float | None = None, attempt: int = 1, request_id: str | None = None,
                 progress_sink: ProgressSink | None = None) -> ToolContext:
    """The context the sidecar gives ``tool``'s handler: its declared labels, its bound settings (``settings``
    overrides them), a deadline ``seconds`` from now (default: the tool's timeout, else 10), a new idempotency
    key for a tool with side effects when none is given (the gate refuses such a call without one), the
    principal ``principal_for(tool)`` unless given. ``progress_sink`` receives its progress reports."""
    seconds = seconds if seconds is not None else tool.timeout if tool is not None else 10.0
    if idempotency_key is None and tool is not None and tool.requires_idempotency_key:
        idempotency_key = f"test-key-{uuid.uuid4().hex}"
    return ToolContext(
        principal=principal or (principal_for(tool) if tool is not None else principal_for()),
        request_id=request_id or f"test-request-{uuid.uuid4().hex}", deadline=time.monotonic() + seconds,
        idempotency_key=idempotency_key, attempt=attempt,
        logger=logging.LoggerAdapter(logging.getLogger(f"toolbooth.test.{tool.name if tool else 'tool'}"), {}),
        progress_sink=progress_sink, approved_preview=approved_preview, conversation_id=conversation_id,
        settings=settings if settings is not None else tool.settings if tool is not None else None,
        declared_labels=tool.labels if tool is not None else frozenset())


@dataclass(slots=True)
class _Lifetime:
    closed: bool = False


@dataclass(frozen=True, slots=True)
class Gate:
    """A pipeline of the sidecar serving some tools in-process; calls are made as ``principal`` unless given.
    Once its ``open_gate`` block (or the test of ``toolbooth_gate``) ended, every method raises ``RuntimeError``."""

    pipeline: Pipeline
    principal: Principal
    _lifetime: _Lifetime = field(default_factory=_Lifetime, repr=False, compare=False)

    def _open(self) -> Pipeline:
        """The pipeline; ``RuntimeError`` saying so once the gate was closed (its store and threads are gone)."""
        if self._lifetime.closed:
            raise RuntimeError("this Gate is closed: its open_gate block (or the test that opened it with "
                               "toolbooth_gate) has ended; use a gate inside the block that opened it")
        return self.pipeline

    async def call(self, tool: str | ToolDefinition[Any, Any], arguments: Mapping[str, Any] | None = None,
                   *, principal: Principal | None = None, idempotency_key: str | None = None,
                   approval_id: str | None = None, conversation_id: str | None = None,
                   call_id: str | None = None) -> ToolResult:
        """One call through every stage, as ``ExecuteTool`` makes it; denials and failures are results."""
        name = tool.name if isinstance(tool, ToolDefinition) else tool
        request = CallRequest(tool=name, arguments_json=json.dumps(dict(arguments or {})),
                              idempotency_key=idempotency_key, approval_id=approval_id,
                              conversation_id=conversation_id, call_id=call_id)
        return await self._open().execute(principal or self.principal, request)

    async def list_tools(self, principal: Principal | None = None) -> ToolListing:
        """The tools the availability policy shows ``principal`` (default: the gate's)."""
        return await self._open().list_tools(principal or self.principal)

    async def approve(self, held: ToolResult, *, approver: Principal | None = None) -> str:
        """Approve the preview of a call ``held`` for approval, as a person of the role ``approver`` (of the
        gate principal's tenant) does; the approval id to call again with. ``AssertionError`` if it cannot be."""
        assert held.status is Status.APPROVAL_REQUIRED and held.preview is not None, f"not held for approval: {held}"
        approver = approver or Principal(id="test-approver", tenant=self.principal.tenant, roles=(TEST_APPROVER_ROLE,))
        answer: ApprovalResult = await self._open().approvals.approve(
            approver, held.preview.preview_id, held.preview.preview_hash, None)
        assert answer.ok, f"the approval was refused: {answer.error}"
        return held.preview.preview_id

    async def audit_events(self) -> list[AuditEvent]:
        """Every event the audit log holds, oldest first (arguments masked as the sidecar masks them)."""
        store = self._open().store
        await store.flush_audit()
        return [record.event for record in await store.audit_records()]


@asynccontextmanager
async def open_gate(tools: Plugin | Iterable[ToolDefinition[Any, Any]], *, principal: Principal | None = None,
                    policies: str | Path | None = None, plugin_name: str = "plugin",
                    plugin_settings: Mapping[str, Any] | None = None, config: Mapping[str, Any] | None = None,
                    state_dir: str | Path | None = None) -> AsyncIterator[Gate]:
    """A ``Gate`` over ``tools`` (a ``Plugin``'s configured with ``plugin_settings`` as the operator's
    ``plugins.config.<plugin_name>``), deciding with the policy directory ``policies`` (default: the bundled
    ones), storing in ``state_dir`` (default: a temporary directory, removed after); ``config``: other sections
    of the sidecar's configuration, as its config file has them (``limits``, ...). Closed when the block ends."""
    from sidecar.bootstrap import open_pipeline  # the composition root, only to open a gate
    from sidecar.config import parse_settings
    from sidecar.tools.registry import Registry

    listed = tools.configure(plugin_name, plugin_settings) if isinstance(tools, Plugin) else tuple(tools)
    with tempfile.TemporaryDirectory(prefix="toolbooth-gate-") as scratch:
        raw: dict[str, Any] = {**(config or {})}
        raw["store"] = {"sqlite_path": str(Path(state_dir or scratch) / "toolbooth.db"), **raw.get("store", {})}
        if policies is not None:
            raw["policy"] = {**raw.get("policy", {}), "path": str(policies)}
        pipeline = await open_pipeline(parse_settings(raw), registry=Registry.from_tools(listed))
        gate = Gate(pipeline, principal or principal_for(*listed))
        try:
            yield gate
        finally:
            gate._lifetime.closed = True
            await pipeline.aclose()
