"""One incoming MCP message read as JSON-RPC 2.0, or the JSON-RPC error it is owed, the same on every transport.

The SDK reads each message itself, unevenly: on stdio a line it cannot read (not JSON, a lone ``\\ud800``
escape, 5,000-deep nesting) only reaches its dispatcher as an exception, which it logs and drops, so the client
waits forever; over HTTP and stdio a request whose id is neither a string nor an integer is read as a
notification (no answer at all); a batch or a broken envelope is answered -32602 with pydantic's errors.
``read`` decides first, raising ``Refused`` with the error JSON-RPC 2.0 names, a constant message and id null:

- not one JSON value in UTF-8 (or nested deeper than the JSON reader allows): ``PARSE_ERROR`` (-32700);
- a batch (an array; MCP removed batches in protocol 2025-06-18), anything but an object, an id that is not a
  string or an integer (an object, an array, a float, a boolean, null on a request), or an object that is no
  JSON-RPC request, notification or response: ``INVALID_REQUEST`` (-32600).
"""

from __future__ import annotations

import pydantic_core
from mcp_types import (
    INVALID_REQUEST,
    PARSE_ERROR,
    ErrorData,
    JSONRPCError,
    JSONRPCMessage,
    RequestId,
    jsonrpc_message_adapter,
)
from pydantic import ValidationError

__all__ = ["Refused", "error", "read"]

_NOT_JSON = "Parse error: the message is not one JSON value in UTF-8"
_BATCH = "Invalid Request: batches are not part of MCP (removed in protocol 2025-06-18); send one message at a time"
_NOT_OBJECT = "Invalid Request: a message is one JSON object"
_BAD_ID = "Invalid Request: an id is a string or an integer"
_NOT_JSONRPC = "Invalid Request: not a JSON-RPC 2.0 request, notification or response"


class Refused(ValueError):
    """A message that is not one JSON-RPC message, or one refused as it is: ``error`` is its answer (id null
    unless ``request_id`` names the request)."""

    def __init__(self, code: int, message: str, *, request_id: RequestId | None = None) -> None:
        super().__init__(message)
        self.error = error(code, message, request_id=request_id)


def error(code: int, message: str, *, request_id: RequestId | None = None) -> JSONRPCError:
    """The JSON-RPC error answering a request (id null unless ``request_id`` names it)."""
    return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=code, message=message))


def read(body: bytes | str) -> JSONRPCMessage:
    """The one JSON-RPC message ``body`` carries; ``Refused`` with the error to answer it with otherwise."""
    try:
        message = pydantic_core.from_json(body)
    except ValueError:
        raise Refused(PARSE_ERROR, _NOT_JSON) from None
    if isinstance(message, list):
        raise Refused(INVALID_REQUEST, _BATCH)
    if not isinstance(message, dict):
        raise Refused(INVALID_REQUEST, _NOT_OBJECT)
    if "id" in message and not _valid_id(message["id"], response="method" not in message):
        raise Refused(INVALID_REQUEST, _BAD_ID)
    try:
        return jsonrpc_message_adapter.validate_python(message, by_name=False)
    except ValidationError:
        raise Refused(INVALID_REQUEST, _NOT_JSONRPC) from None


def _valid_id(value: object, *, response: bool) -> bool:
    """MCP's ids are strings or integers (never booleans); only an error response may carry null."""
    if value is None:
        return response
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
