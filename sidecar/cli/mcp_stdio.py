"""``toolbooth mcp-stdio``: an MCP server on stdin/stdout that bridges to a running sidecar over gRPC.

For desktop and IDE clients that start their MCP servers as processes (Claude Desktop, editors): the
client runs ``toolbooth mcp-stdio --target ADDRESS``; each ``tools/list`` and ``tools/call`` becomes a
``ListTools`` or ``ExecuteTool`` of the sidecar at ``ADDRESS`` (``sidecar.client``), authenticated with
the bearer token of ``--token`` / ``$TOOLBOOTH_TOKEN`` or of the file ``--token-file`` /
``$TOOLBOOTH_TOKEN_FILE`` (read once, at start). The sidecar decides everything, as for any caller.

Every line the client writes gets a line back (``sidecar.mcp.stdio``): what is not one JSON-RPC message (not
JSON or not UTF-8, a batch, an id that is neither a string nor an integer) is answered with its JSON-RPC error
(id null), and so is a line longer than ``--max-message-bytes`` (default 4 MiB, the sidecar's own default
``limits.max_message_bytes``), which is never held in memory whole.

What the sidecar refuses at the gRPC level becomes a JSON-RPC error (``sidecar.mcp.server``):
UNAUTHENTICATED "unauthenticated: <its message>", INVALID_ARGUMENT with its message, anything else
(the sidecar unreachable, say) "service unavailable", with the gRPC status logged on stderr.
Stdout carries only the protocol; logs go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    Subparsers,
    client_flags,
    client_tls,
    find_target,
    setup_logging,
)
from sidecar.config import ENV_TOKEN_FILE, Limits
from sidecar.contract import CallRequest, ToolListing, ToolResult
from sidecar.errors import AuthenticationError, DependencyError, InvalidRequestError

if TYPE_CHECKING:
    from sidecar.client import AsyncClient
    from sidecar.client_tls import ClientTls
    from sidecar.mcp.server import SendProgress

__all__ = ["ClientTools", "add_commands", "cmd_mcp_stdio", "read_token"]

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES: int = Limits.model_fields["max_message_bytes"].default  # the sidecar's own default


def add_commands(commands: Subparsers) -> None:
    """Add ``mcp-stdio`` to the ``toolbooth`` parser."""
    bridge = commands.add_parser("mcp-stdio", help="serve MCP on stdin/stdout, bridged to a running sidecar")
    client_flags(bridge)
    bridge.add_argument("--token-file", type=Path, default=os.environ.get(ENV_TOKEN_FILE), metavar="FILE",
                        help=f"read the bearer token from FILE (default: ${ENV_TOKEN_FILE}); instead of --token")
    bridge.add_argument("--log-level", default="WARNING", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="what is logged on stderr (default: WARNING)")
    bridge.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES, metavar="N",
                        help="the longest line (one JSON-RPC message) read; a longer one is answered with an "
                             f"error (default: {DEFAULT_MAX_MESSAGE_BYTES})")
    bridge.set_defaults(handler=cmd_mcp_stdio)


def cmd_mcp_stdio(args: argparse.Namespace) -> int:
    """``toolbooth mcp-stdio``: serve until stdin closes."""
    if importlib.util.find_spec("mcp") is None:
        raise CommandError("mcp-stdio needs the 'mcp' extra (pip install 'toolbooth[mcp]')", EXIT_USAGE)
    if args.max_message_bytes <= 0:
        raise CommandError("--max-message-bytes must be a positive number of bytes", EXIT_USAGE)
    setup_logging(args.log_level)
    token = read_token(args.token, args.token_file)
    target = find_target(args)
    try:
        asyncio.run(_bridge(target.address, token, client_tls(args, implied=target.tls),
                            max_message_bytes=args.max_message_bytes))
    except KeyboardInterrupt:
        return 130
    return EXIT_OK


def read_token(token: str | None, token_file: Path | None) -> str | None:
    """The bearer token: ``token_file``'s contents (stripped) when given, else ``token``; a usage error for an
    unreadable or empty file."""
    if token_file is None:
        return token
    try:
        text = token_file.read_text().strip()
    except OSError as exc:
        raise CommandError(f"cannot read --token-file {token_file}: {exc.strerror or exc}", EXIT_USAGE) from None
    if not text:
        raise CommandError(f"--token-file {token_file} is empty", EXIT_USAGE)
    return text


async def _bridge(target: str, token: str | None, tls: ClientTls | None, *, max_message_bytes: int) -> None:
    from sidecar.client import AsyncClient
    from sidecar.mcp.server import build_server
    from sidecar.mcp.stdio import stdio_streams

    try:
        client = AsyncClient(target, token=token, tls=tls)
    except ValueError as exc:  # a TLS file that cannot be read, TLS towards a Unix socket
        raise CommandError(str(exc), EXIT_USAGE) from None
    async with client:
        tools = ClientTools(client, target)
        server = build_server(lambda ctx: tools)
        async with stdio_streams(max_line_bytes=max_message_bytes) as (read, write):
            await server.run(read, write, server.create_initialization_options())


class ClientTools:
    """``sidecar.mcp.server.Tools`` over a gRPC client: the sidecar at the other end decides."""

    def __init__(self, client: AsyncClient, target: str) -> None:
        self._client, self._target = client, target

    async def list_tools(self, *, conversation_id: str | None = None) -> ToolListing:
        with self._refusals():
            return await self._client.list_tools(conversation_id=conversation_id)

    async def execute(self, request: CallRequest, *, progress: SendProgress | None = None) -> ToolResult:
        tool, arguments = request.tool, request.arguments_json
        key, approval, conversation, call = (request.idempotency_key, request.approval_id, request.conversation_id,
                                             request.call_id)
        with self._refusals():
            if progress is None:
                return await self._client.execute(tool, arguments, idempotency_key=key, approval_id=approval,
                                                  conversation_id=conversation, call_id=call)
            async with contextlib.aclosing(self._client.execute_stream(
                    tool, arguments, idempotency_key=key, approval_id=approval, conversation_id=conversation,
                    call_id=call)) as events:
                async for event in events:
                    if isinstance(event, ToolResult):
                        return event
                    await progress(event)
        log.warning("the sidecar at %s ended a call's stream without its result", self._target)
        raise DependencyError("the stream ended without a result")

    @contextlib.contextmanager
    def _refusals(self) -> Iterator[None]:
        """A gRPC failure as the exception the MCP server maps to a JSON-RPC error."""
        import grpc

        from sidecar.client import ClientError

        try:
            yield
        except ClientError as exc:
            if exc.code is grpc.StatusCode.UNAUTHENTICATED:
                raise AuthenticationError(exc.details) from exc
            if exc.code is grpc.StatusCode.INVALID_ARGUMENT:
                raise InvalidRequestError(exc.details) from exc
            log.warning("the sidecar at %s failed the request: %s", self._target, exc)
            raise DependencyError(str(exc)) from exc
