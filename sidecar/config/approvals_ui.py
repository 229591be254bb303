"""``approvals_ui``: the approval inbox, web pages where a person approves or denies held calls; off unless
``listen`` is set.

``listen`` is one TCP address (``HOST:PORT``, ``[IPV6]:PORT``; port 0 for any free port), read as
``mcp.listen`` is. In ``dev`` mode it must be loopback (checked with the whole ``Settings``). Session
cookies are ``Secure`` unless the address is loopback: outside loopback the pages must be reached over
HTTPS (a TLS-terminating proxy in front). A session lasts at most ``session_seconds``, and never longer
than the token it was signed in with. Only an approver signs in (a principal with one of ``approver_roles``,
or an operator); one principal holds at most ``max_sessions_per_principal`` sessions, everyone together at most
``max_sessions``, and a sign-in never ends another principal's session. An open page's live updates
(server-sent events) look for arrived, expired and decided previews every ``live_seconds``; one principal
holds at most ``max_streams_per_principal`` such streams across their sessions (a quarter of
``http.max_connections`` at most; their next one ends their own oldest) and everyone together at most
``max_streams`` (default and most: half of ``http.max_connections``, the rest kept for page loads and sign-ins).
``http`` bounds its clients' time and number (``sidecar.config.http``). Serving it needs the ``approvals-ui`` extra
(``sidecar.config.endpoints``).

``oidc`` adds signing in through an identity provider (OpenID Connect authorization code flow with PKCE,
``sidecar.server.approvals_ui.oidc``): ``issuer`` (its discovery document is at
``ISSUER/.well-known/openid-configuration``; ``https``, or ``http`` on a loopback host), ``client_id``,
``client_secret`` for a confidential client (none: a public client), ``redirect_uri`` (the inbox's own
``…/sign-in/callback`` as the browser reaches it), ``scopes``. The access token it issues is verified
by ``auth.jwt`` as an agent's token is, so it needs ``auth.jwt`` (checked with the whole ``Settings``).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from sidecar.config.base import Section
from sidecar.config.http import HttpListenerSettings
from sidecar.config.listen import Endpoint, is_loopback, one_tcp_endpoint

__all__ = ["CALLBACK_PATH", "ApprovalsUiSettings", "OidcSettings"]

CALLBACK_PATH = "/sign-in/callback"


class OidcSettings(Section):
    """The identity provider people sign in with, and this inbox as its client."""

    issuer: str
    client_id: str = Field(min_length=1)
    client_secret: SecretStr | None = None
    redirect_uri: str
    scopes: tuple[str, ...] = ("openid",)
    timeout_seconds: float = Field(default=10.0, gt=0)

    @field_validator("issuer")
    @classmethod
    def _issuer_url(cls, value: str) -> str:
        _secure_url(value, "the issuer")
        return value.rstrip("/")

    @field_validator("redirect_uri")
    @classmethod
    def _callback_url(cls, value: str) -> str:
        if urlsplit(value).path != CALLBACK_PATH:
            raise ValueError(f"{value!r}: the redirect URI is the inbox's own {CALLBACK_PATH}, "
                             f"e.g. https://approvals.example.com{CALLBACK_PATH}")
        _secure_url(value, "the redirect URI")
        return value

    @field_validator("scopes")
    @classmethod
    def _openid_scope(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if "openid" not in value:
            raise ValueError("the scopes must include 'openid'")
        return value


def _secure_url(value: str, what: str) -> None:
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"{value!r}: {what} must be an absolute https:// URL without a query or fragment")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ValueError(f"{value!r}: {what} must use https:// (http:// only on a loopback host)")


class ApprovalsUiSettings(Section):
    """Where the approval inbox listens (``None``: nowhere, the default) and how long its sessions last."""

    listen: str | None = None
    session_seconds: int = Field(default=8 * 3600, gt=0)
    page_size: int = Field(default=20, gt=0, le=200)  # previews on one inbox page
    live_seconds: float = Field(default=2.0, ge=0.2, le=60)  # an open page's live updates look this often
    oidc: OidcSettings | None = None
    # Who may sign in: a principal with one of these roles (list every role the approval policy names in its
    # approver_roles), or an operator (auth.operator_roles). The approver rule still decides each preview.
    approver_roles: tuple[str, ...] = Field(default=("approver",), min_length=1)
    max_sessions: int = Field(default=10_000, gt=0, le=1_000_000)  # open sessions of all principals together
    max_sessions_per_principal: int = Field(default=10, gt=0)  # one principal's (their browsers); the oldest ends
    max_streams_per_principal: int = Field(default=4, gt=0)  # one principal's live pages; their oldest ends
    max_streams: int | None = Field(default=None, gt=0)  # everyone's live pages (None: half of http.max_connections)
    http: HttpListenerSettings = Field(default_factory=lambda: HttpListenerSettings(max_connections=128))

    @field_validator("listen")
    @classmethod
    def _one_tcp_address(cls, value: str | None) -> str | None:
        if value is not None:
            one_tcp_endpoint(value, "the approval inbox")
        return value

    @field_validator("approver_roles")
    @classmethod
    def _role_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not role.strip() for role in value):
            raise ValueError("a role name may not be empty")
        return value

    @model_validator(mode="after")
    def _sessions_fit(self) -> ApprovalsUiSettings:
        if self.max_sessions_per_principal > self.max_sessions:
            raise ValueError(f"max_sessions_per_principal ({self.max_sessions_per_principal}) may not exceed "
                             f"max_sessions ({self.max_sessions})")
        return self

    @model_validator(mode="after")
    def _streams_fit(self) -> ApprovalsUiSettings:
        connections, per_principal = self.http.max_connections, self.max_streams_per_principal
        if self.stream_cap * 2 > connections:
            raise ValueError(f"max_streams ({self.stream_cap}) may be at most half of http.max_connections "
                             f"({connections}): the rest is kept for page loads and sign-ins")
        if per_principal * 4 > connections:
            raise ValueError(f"max_streams_per_principal ({per_principal}) may be at most a quarter of "
                             f"http.max_connections ({connections}), so that a few principals cannot fill the listener")
        if per_principal > self.stream_cap:
            raise ValueError(f"max_streams_per_principal ({per_principal}) may not exceed max_streams "
                             f"({self.stream_cap})")
        return self

    @property
    def stream_cap(self) -> int:
        """How many live-update streams everyone together holds: ``max_streams``, else half the connections."""
        return self.http.max_connections // 2 if self.max_streams is None else self.max_streams

    @property
    def endpoint(self) -> Endpoint | None:
        """The host and port to listen on, ``None`` when the inbox is off."""
        return None if self.listen is None else one_tcp_endpoint(self.listen, "the approval inbox")
