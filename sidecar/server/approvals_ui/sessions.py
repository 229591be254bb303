"""Server-side sessions of the approval inbox: a random cookie names a session, the session holds the principal.

A sign-in method (``sidecar.server.approvals_ui.signin``: a pasted bearer token, dev mode; an OIDC login
later) proves who the person is and until when; ``Sessions.open`` then keeps that principal under a random
id for at most ``approvals_ui.session_seconds`` and never past ``until`` (the token's expiry). The browser
gets only the id, in an ``HttpOnly`` cookie; each session has its own CSRF token, which every form that
changes something must carry (``csrf_matches``). Sessions live in this process: a restart signs everyone out.
At most ``max_open`` are kept: past that, the one that would end first is ended.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.contract import Principal

__all__ = ["MAX_OPEN_SESSIONS", "Session", "Sessions", "SignedIn", "csrf_matches"]

MAX_OPEN_SESSIONS = 10_000


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


class Sessions:
    """The open sessions of one inbox, in memory; expired ones are dropped when seen or when one is opened."""

    def __init__(self, max_seconds: float, *, max_open: int = MAX_OPEN_SESSIONS,
                 clock: Callable[[], float] = time.time) -> None:
        self._max_seconds, self._max_open, self._clock = max_seconds, max_open, clock
        self._open: dict[str, Session] = {}

    def open(self, signed_in: SignedIn) -> Session:
        """A new session for ``signed_in``, ending at its ``until`` or after ``max_seconds``, whichever is first."""
        now = self._clock()
        self._open = {key: s for key, s in self._open.items() if s.expires_at > now}
        while len(self._open) >= self._max_open:
            del self._open[min(self._open.values(), key=lambda s: s.expires_at).id]
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
