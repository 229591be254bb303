"""Rendering a call for its approver: the tool's ``preview`` function, run when the gate opens a preview.

``@tool(..., preview=render)`` names a function ``(args, ctx) -> dict | BaseModel`` (sync or async) that
says what the call will do — the email's recipients, subject and body, the task to create — as a JSON
object. The approver sees it with the preview, the preview hash covers it, and the handler of the
approved call gets exactly it as ``ctx.approved_preview``. It must have no effect of its own: it runs
whenever a call of the tool needs approval, in the sidecar's process (a sync one in a thread, even for
an isolated tool), within the tool's timeout.

``render`` returns the rendering, or the error that ends the call, and nothing is stored: a ``ToolError``
the renderer raised (e.g. ``RESOURCE_NOT_FOUND`` for a preview id the tool does not know), ``TIMEOUT``, or
``INTERNAL_ERROR`` for anything else it raised and for a rendering that is not a JSON object of at most
``MAX_RENDERING_BYTES`` with a canonical form (details in the log).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from typing import Any

from pydantic import BaseModel

from sidecar.canonical import CanonicalizationError, canonical_bytes
from sidecar.contract import ErrorCode, ErrorInfo
from sidecar.tools.definition import ToolContext, ToolDefinition
from sidecar.tools.outcomes import ToolError, published

__all__ = ["MAX_RENDERING_BYTES", "render"]

MAX_RENDERING_BYTES = 256 * 1024  # of canonical JSON: stored with the preview, shown to approvers


async def render(defn: ToolDefinition[Any, Any], args: BaseModel, ctx: ToolContext) -> dict[str, Any] | ErrorInfo:
    """``defn``'s rendering of the call with ``args``, by ``ctx.deadline``; or the error that ends the call."""
    renderer = defn.preview
    assert renderer is not None, "only a tool with a preview renderer renders"
    try:
        async with asyncio.timeout(ctx.time_remaining()):
            if inspect.iscoroutinefunction(renderer):
                rendered = await renderer(args, ctx)
            else:
                rendered = await asyncio.to_thread(functools.partial(renderer, args, ctx))
    except ToolError as exc:
        return published(exc, defn.side_effect)
    except TimeoutError:
        return ErrorInfo.of(ErrorCode.TIMEOUT, f"tool {defn.name!r} did not render its preview in time; nothing ran")
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        ctx.logger.error("the preview renderer of tool %r raised %s", defn.name, type(exc).__name__, exc_info=exc)
        return _failed()
    return _checked(defn, rendered, ctx)


def _checked(defn: ToolDefinition[Any, Any], rendered: object, ctx: ToolContext) -> dict[str, Any] | ErrorInfo:
    value = rendered.model_dump(mode="json") if isinstance(rendered, BaseModel) else rendered
    if not isinstance(value, dict):
        ctx.logger.error("the preview renderer of tool %r returned %s, not a JSON object", defn.name,
                         type(value).__name__)
        return _failed()
    try:
        encoded = canonical_bytes(value)
    except CanonicalizationError as exc:
        ctx.logger.error("the preview renderer of tool %r returned a value without a canonical JSON form: %s",
                         defn.name, exc)
        return _failed()
    if len(encoded) > MAX_RENDERING_BYTES:
        ctx.logger.error("the preview renderer of tool %r returned %d bytes (limit %d)", defn.name, len(encoded),
                         MAX_RENDERING_BYTES)
        return _failed()
    copy: dict[str, Any] = json.loads(encoded)
    return copy


def _failed() -> ErrorInfo:
    return ErrorInfo.of(ErrorCode.INTERNAL_ERROR, "the tool could not render its preview; nothing was stored or run")
