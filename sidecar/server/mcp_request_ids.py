"""The JSON-RPC request ids in flight in one MCP session, so that a duplicate is refused before anything runs.

The SDK keys a request's answer stream (and its dispatcher keys the handler) by the request's id and
overwrites an entry of the same id: two requests in flight with one id both ran, one POST got the other's
answer and the other never got one, its handler orphaned until shutdown. An id is in flight from the POST
that carries it until both that POST has ended and the session has written its answer (or, for a request
the SDK refused before handing it to the session, until its POST ends): a client that went away from an
event stream cannot reuse the id while its handler still runs. Ids are compared as the SDK routes answers,
by their text (``7`` and ``"7"`` are one id).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from mcp.shared._context_streams import ContextSendStream
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCRequest, JSONRPCResponse, RequestId

__all__ = ["InFlightIds", "Watched"]

T = TypeVar("T")


class InFlightIds:
    """The ids of one session's requests in flight (one event loop: every method is synchronous)."""

    def __init__(self) -> None:
        self._posted: set[str] = set()  # a POST carrying it is being answered
        self._unanswered: set[str] = set()  # handed to the session, which has not answered it yet

    def claim(self, request_id: RequestId) -> bool:
        """Take ``request_id`` for a POST; ``False`` when a request with it is in flight."""
        key = str(request_id)
        if key in self._posted or key in self._unanswered:
            return False
        self._posted.add(key)
        return True

    def posted(self, request_id: RequestId) -> None:
        """The POST that claimed ``request_id`` has ended."""
        self._posted.discard(str(request_id))

    def handed_over(self, item: SessionMessage | Exception) -> None:
        """``item`` goes to the session: a request stays in flight until it is answered."""
        if isinstance(item, SessionMessage) and isinstance(item.message, JSONRPCRequest):
            self._unanswered.add(str(item.message.id))

    def answered(self, item: SessionMessage) -> None:
        """``item`` comes from the session: an answer ends its request."""
        if isinstance(item.message, JSONRPCResponse | JSONRPCError) and item.message.id is not None:
            self._unanswered.discard(str(item.message.id))


class Watched(ContextSendStream[T]):
    """A session's stream that shows each message to ``seen`` before sending it."""

    __slots__ = ("_seen",)

    def __init__(self, stream: ContextSendStream[T], seen: Callable[[T], None]) -> None:
        super().__init__(stream._inner)
        self._seen = seen

    async def send(self, item: T) -> None:
        self._seen(item)
        await super().send(item)
