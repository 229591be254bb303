"""Server-side sessions of the approval inbox: a random cookie names a session, the session holds the principal.

A sign-in method (``sidecar.server.approvals_ui.signin``: a pasted bearer token, dev mode; an OIDC login
later) proves who the person is and until when; ``Sessions.open`` then keeps that principal under a random
id for at most ``approvals_ui.session_seconds`` and never past ``until`` (the token's expiry). The browser
gets only the id, in an ``HttpOnly`` cookie; each session has its own CSRF token, which every form that
changes something must carry (``csrf_matches``). Sessions live in this process: a restart signs everyone out.
One principal (id and tenant) holds at most ``per_principal`` (``approvals_ui.max_sessions_per_principal``):
their next sign-in ends their own oldest. All principals together hold at most ``max_open``
(``approvals_ui.max_sessions``): past that, a principal who holds one gives up their oldest, and anyone else
is refused (``SessionsFull``). A sign-in never ends another principal's session.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.contract import Principal
from sidecar.server.approvals_ui.places import to_end

__all__ = ["Session", "Sessions", "SessionsFull", "SignedIn", "csrf_matches"]


@dataclass(frozen=True, slots=True)
class SignedIn:
    """What a sign-in method proved: who, by which ``method``, and until when (``None``: no limit of its own)."""

    principal: Principal
    method: str  # "token", "dev"
    until: float | None = None


@dataclass(frozen=True, slots=True)
class Session:
    """One signed-in person: the cookie's ``id``, the principal, the session's CSRF token and its end."""

    id: str
    principal: Principal
    method: str
    csrf: str
    expires_at: float


class SessionsFull(Exception):
    """The inbox holds as many sessions as it may, none of them the newcomer's: nobody was signed out."""


class Sessions:
    """The open sessions of one inbox, in memory, oldest first; expired ones are dropped when seen or when one
    is opened."""

    def __init__(self, max_seconds: float, *, max_open: int, per_principal: int,
                 clock: Callable[[], float] = time.time) -> None:
        self._max_seconds, self._max_open, self._per_principal = max_seconds, max_open, per_principal
        self._clock = clock
        self._open: dict[str, Session] = {}  # in the order they were opened

    def open(self, signed_in: SignedIn) -> Session:
        """A new session for ``signed_in``, ending at its ``until`` or after ``max_seconds``, whichever is first;
        ``SessionsFull`` when it would take another principal's place."""
        now = self._clock()
        self._open = {key: s for key, s in self._open.items() if s.expires_at > now}
        mine = [s.id for s in self._open.values() if s.principal.identity == signed_in.principal.identity]
        ended = to_end(mine, len(self._open), per_principal=self._per_principal, max_open=self._max_open)
        if ended is None:
            raise SessionsFull(f"the inbox holds its most sessions ({self._max_open}, approvals_ui.max_sessions)")
        for session_id in ended:
            del self._open[session_id]
        ends = now + self._max_seconds if signed_in.until is None else min(signed_in.until, now + self._max_seconds)
        session = Session(secrets.token_urlsafe(32), signed_in.principal, signed_in.method, secrets.token_urlsafe(32),
                          ends)
        self._open[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The unexpired session ``session_id`` names, else ``None``."""
        session = None if session_id is None else self._open.get(session_id)
        if session is not None and session.expires_at <= self._clock():
            del self._open[session.id]
            return None
        return session

    def close(self, session_id: str) -> None:
        """End a session (signing out)."""
        self._open.pop(session_id, None)

    def seconds_left(self, session: Session) -> int:
        """How long ``session`` has left, in whole seconds (the cookie's ``Max-Age``)."""
        return max(0, int(session.expires_at - self._clock()))


def csrf_matches(expected: str, presented: str | None) -> bool:
    """Whether a form's CSRF token is ``expected``, compared in constant time."""
    return presented is not None and hmac.compare_digest(expected.encode(), presented.encode())
