"""What every framework adapter does with one tool call of a model, framework-free.

``ToolCalls`` lists the caller's available tools and runs one call of a model through the sidecar:

- **The idempotency key** of a tool with side effects is derived from the model's tool call id:
  ``idempotency_key(tool_call_id)`` = ``"toolcall:" + tool_call_id``. The same tool call, run again (a
  framework's retry, a run resumed from its history), carries the same key, so it replays the stored result
  instead of running twice; a new tool call of the model is a new key. Keys are scoped by the sidecar to
  (principal, tool). The tool call id is also sent as the call's ``call_id``, which the audit log records.
- **Approvals.** A call the approval policy holds comes back ``approval_required`` with its preview. The
  preview's id is remembered for that exact call (tool and arguments) and sent as ``approval_id`` when the
  model makes the same call again: once a person approved it, that call runs (exactly once); while it is
  pending the answer is ``approval_required`` with the same preview; denied or expired, it is forgotten and
  the next identical call opens a new preview. A repeated tool call of an approved call sends the approval
  it ran with again, with its key, and so replays its result.
- **The result the model reads** is ``model_view(result)``: the typed ``ToolResult`` as JSON — ``status``,
  ``data``, ``error`` (``code``, ``message``, ``retryable``, ``recovery``, ``field``), ``errors``, ``meta``
  and, for ``approval_required``, ``preview``. Denials and tool failures are results, never exceptions;
  a gRPC failure (the sidecar unreachable, a rejected token) raises ``ClientError``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sidecar.client import AsyncClient
from sidecar.contract import Status, ToolDescriptor, ToolResult

__all__ = ["KEY_PREFIX", "ToolCalls", "idempotency_key", "model_view", "needs_extra"]

KEY_PREFIX = "toolcall:"

Arguments = Mapping[str, Any] | str


def idempotency_key(tool_call_id: str) -> str:
    """The idempotency key of the model's tool call ``tool_call_id``."""
    return KEY_PREFIX + tool_call_id


def model_view(result: ToolResult) -> dict[str, Any]:
    """The typed result as the model reads it (JSON-ready)."""
    return result.model_dump(mode="json")


def needs_extra(module: str, framework: str, extra: str) -> str:
    """The message of the ``ImportError`` raised by importing ``module`` without its framework."""
    return f"{module} needs {framework}: install it with pip install 'toolbooth[{extra}]'"


class ToolCalls:
    """The caller's tools on one sidecar, and their calls, as a framework adapter makes them.

    ``client`` stays the caller's to close. ``conversation_id``, if given, is sent with every listing and call
    (policies see it; an approval is valid in its conversation only).
    """

    def __init__(self, client: AsyncClient, *, conversation_id: str | None = None) -> None:
        self._client = client
        self._conversation_id = conversation_id
        self._pending: dict[tuple[str, str], str] = {}  # (tool, arguments) -> the id of its pending preview
        self._approved: dict[tuple[str, str], str] = {}  # (tool, tool call id) -> the approval it was sent with

    async def available(self) -> tuple[ToolDescriptor, ...]:
        """The tools the caller may see now (the availability policy decides)."""
        return (await self._client.list_tools(conversation_id=self._conversation_id)).tools

    async def call(self, tool: str, arguments: Arguments, tool_call_id: str | None, *, keyed: bool) -> ToolResult:
        """Run the model's call ``tool_call_id`` of ``tool``; ``keyed``: the tool needs an idempotency key."""
        same_call = (tool, _canonical(arguments))
        by_id = None if tool_call_id is None else (tool, tool_call_id)
        approval = (self._approved.get(by_id) if by_id else None) or self._pending.get(same_call)
        result = await self._client.execute(
            tool, arguments, idempotency_key=idempotency_key(tool_call_id) if keyed and tool_call_id else None,
            approval_id=approval, conversation_id=self._conversation_id, call_id=tool_call_id)
        if result.status is Status.APPROVAL_REQUIRED and result.preview is not None:
            self._pending[same_call] = result.preview.preview_id
        elif approval is not None:
            self._pending.pop(same_call, None)
            if by_id:
                self._approved[by_id] = approval
        return result


def _canonical(arguments: Arguments) -> str:
    """The arguments as one text, whatever their key order or spacing (the text itself if it is not JSON)."""
    if isinstance(arguments, str):
        try:
            value: Any = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            return arguments
    else:
        value = arguments
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
