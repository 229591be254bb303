"""The MCP server of Toolbooth: ``tools/list`` and ``tools/call`` over whatever reaches the pipeline.

``build_server(tools_for)`` returns an MCP SDK ``Server`` whose two handlers ask ``tools_for(ctx)`` —
the caller's ``Tools`` for this request — and convert, nothing else: the sidecar's Streamable HTTP
endpoint passes the pipeline as the request's authenticated principal (``sidecar.server.mcp_http``);
``toolbooth mcp-stdio`` passes a gRPC client of a running sidecar (``sidecar.cli.mcp_stdio``). Either
way every call goes through the one ``Pipeline.execute``, so it is decided, validated, keyed and
audited like ``ExecuteTool``:

- ``tools/list`` is the availability-filtered listing (``conversation_id`` from ``_meta``), each tool
  as ``sidecar.api.schemas.mcp_tool`` writes it;
- ``tools/call`` takes its arguments and the ``_meta`` fields of ``sidecar.mcp.meta`` and answers with
  ``sidecar.mcp.results.call_result``. A hidden tool and an unknown one get the same result.

What fails outside a call maps to a JSON-RPC error (``protocol_error``), as it maps to a gRPC status
there, from its ``sidecar.faults`` kind and public message: a broken request is ``INVALID_PARAMS`` with its
message, a failed dependency (the policy engine during a listing) ``INTERNAL_ERROR`` "service unavailable",
a refused token ``INVALID_REQUEST`` "unauthenticated: …", a bug ``INTERNAL_ERROR`` "internal error" (its
traceback logged).

Progress: a ``tools/call`` whose ``_meta`` carries a ``progressToken`` is executed with a progress
sender (``Tools.execute(..., progress=)``): the handler's ``ctx.report_progress`` reports, rate-limited
as on ``ExecuteToolStream``, become ``notifications/progress`` for that token, related to the request so
that Streamable HTTP sends them on the event stream answering that request (``sidecar.server.mcp_transport``;
``mcp.json_response`` has none: they are dropped by the transport). Without a token the call runs as a unary
one, and this server sends nothing about it but its response.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params

from sidecar import __version__
from sidecar.api.schemas import mcp_tool
from sidecar.contract import CallRequest, Progress, ToolListing, ToolResult
from sidecar.faults import FaultKind, classify
from sidecar.mcp.meta import call_request, conversation_id
from sidecar.mcp.results import call_result

__all__ = ["SERVER_NAME", "Context", "SendProgress", "Tools", "ToolsFor", "build_server", "protocol_error"]

log = logging.getLogger(__name__)

SERVER_NAME = "toolbooth"

# The JSON-RPC error code of each kind of fault, and how its public message is worded.
_MCP_ERRORS: dict[FaultKind, tuple[int, str]] = {
    FaultKind.UNAUTHENTICATED: (types.INVALID_REQUEST, "unauthenticated: {}"),
    FaultKind.INVALID_REQUEST: (types.INVALID_PARAMS, "{}"),
    FaultKind.UNAVAILABLE: (types.INTERNAL_ERROR, "{}"),
    FaultKind.INTERNAL: (types.INTERNAL_ERROR, "{}"),
}

Context = ServerRequestContext[Any, Any]
SendProgress = Callable[[Progress], Awaitable[None]]


class Tools(Protocol):
    """What the MCP server needs for one caller: the listing and one call, both through the pipeline."""

    async def list_tools(self, *, conversation_id: str | None = None) -> ToolListing: ...

    async def execute(self, request: CallRequest, *, progress: SendProgress | None = None) -> ToolResult:
        """Run ``request``; the handler's progress reports go to ``progress`` (``None``: a unary call)."""
        ...


ToolsFor = Callable[[Context], Tools]


def build_server(tools_for: ToolsFor) -> Server[Any]:
    """An MCP server serving the tools ``tools_for`` gives for each request."""

    async def list_tools(ctx: Context, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        with _protocol_errors():
            meta = None if params is None else params.meta
            listing = await tools_for(ctx).list_tools(conversation_id=conversation_id(meta))
        return types.ListToolsResult(tools=[types.Tool.model_validate(mcp_tool(tool)) for tool in listing.tools])

    async def call_tool(ctx: Context, params: types.CallToolRequestParams) -> types.CallToolResult:
        with _protocol_errors():
            request = call_request(params.name, params.arguments, params.meta)
            result = await tools_for(ctx).execute(request, progress=_progress_sender(ctx))
        return call_result(result)

    return Server(SERVER_NAME, version=__version__, on_list_tools=list_tools, on_call_tool=call_tool)


def _progress_sender(ctx: Context) -> SendProgress | None:
    """What sends a call's reports as ``notifications/progress`` for its ``progressToken``; ``None`` without one."""
    token = progress_token_from_params(ctx.params)
    if token is None:
        return None
    related = None if ctx.request_id is None else str(ctx.request_id)

    async def send(update: Progress) -> None:
        await ctx.session.send_progress_notification(token, update.progress, update.total, update.message,
                                                     related_request_id=related)

    return send


@contextlib.contextmanager
def _protocol_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        raise protocol_error(exc) from exc


def protocol_error(exc: Exception) -> MCPError:
    """The JSON-RPC error for a failure outside a call's result; only constant messages are sent, a bug is logged."""
    fault = classify(exc)
    if fault.kind is FaultKind.INTERNAL:
        log.error("unexpected error while serving an MCP request", exc_info=exc)
    code, wording = _MCP_ERRORS[fault.kind]
    return MCPError(code, wording.format(fault.message))
