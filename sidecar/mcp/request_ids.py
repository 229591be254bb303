"""The JSON-RPC request ids in flight in one MCP session, so that a duplicate is refused before anything runs.

The SDK keys a request's answer stream (and its dispatcher keys the handler) by the request's id and
overwrites an entry of the same id: two requests in flight with one id both ran, one got the other's answer
and the other never got one, its handler orphaned until shutdown. An id is in flight from the message that
carries it (a POST, a line of stdin) until both that message is done with (a POST has ended) and the session
has written its answer or the client cancelled it (``notifications/cancelled``: the SDK never answers a
cancelled request); a request the SDK refused before handing it to the session is in flight until its POST
ends. A client that went away from an event stream cannot reuse the id while its handler still runs. Ids are
compared as the SDK routes answers, by their text (``7`` and ``"7"`` are one id).
"""

from __future__ import annotations

from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse, RequestId

__all__ = ["DUPLICATE", "InFlightIds"]

DUPLICATE = "Invalid Request: a request with this id is in flight in this session; use an id of its own"


class InFlightIds:
    """The ids of one session's requests in flight (one event loop: every method is synchronous)."""

    def __init__(self) -> None:
        self._carried: set[str] = set()  # the message carrying it is being answered
        self._unanswered: set[str] = set()  # handed to the session, which has not answered it yet

    def claim(self, request_id: RequestId) -> bool:
        """Take ``request_id`` for the message carrying it; ``False`` when a request with it is in flight."""
        key = str(request_id)
        if key in self._carried or key in self._unanswered:
            return False
        self._carried.add(key)
        return True

    def release(self, request_id: RequestId) -> None:
        """The message that claimed ``request_id`` is done with (its POST has ended)."""
        self._carried.discard(str(request_id))

    def handed_over(self, item: SessionMessage | Exception) -> None:
        """``item`` goes to the session: a request stays in flight until it is answered or cancelled."""
        if not isinstance(item, SessionMessage):
            return
        message = item.message
        if isinstance(message, JSONRPCRequest):
            self._unanswered.add(str(message.id))
        elif isinstance(message, JSONRPCNotification) and message.method == "notifications/cancelled":
            self._unanswered.discard(str((message.params or {}).get("requestId")))

    def answered(self, item: SessionMessage) -> None:
        """``item`` comes from the session: an answer ends its request."""
        if isinstance(item.message, JSONRPCResponse | JSONRPCError) and item.message.id is not None:
            self._unanswered.discard(str(item.message.id))
