"""``approvals_ui``: the approval inbox, web pages where a person approves or denies held calls; off unless
``listen`` is set.

``listen`` is one TCP address (``HOST:PORT``, ``[IPV6]:PORT``; port 0 for any free port), read as
``mcp.listen`` is. In ``dev`` mode it must be loopback (checked with the whole ``Settings``). Session
cookies are ``Secure`` unless the address is loopback: outside loopback the pages must be reached over
HTTPS (a TLS-terminating proxy in front). A session lasts at most ``session_seconds``, and never longer
than the token it was signed in with. Serving it needs the ``approvals-ui`` extra (``check_installed``).
"""

from __future__ import annotations

import importlib.util

from pydantic import Field, field_validator

from sidecar.config.base import Section
from sidecar.config.listen import Endpoint, one_tcp_endpoint
from sidecar.errors import ConfigError

__all__ = ["ApprovalsUiSettings"]

_NEEDS = ("starlette", "uvicorn", "jinja2", "multipart")


class ApprovalsUiSettings(Section):
    """Where the approval inbox listens (``None``: nowhere, the default) and how long its sessions last."""

    listen: str | None = None
    session_seconds: int = Field(default=8 * 3600, gt=0)
    page_size: int = Field(default=20, gt=0, le=200)  # previews on one inbox page

    @field_validator("listen")
    @classmethod
    def _one_tcp_address(cls, value: str | None) -> str | None:
        if value is not None:
            one_tcp_endpoint(value, "the approval inbox")
        return value

    @property
    def endpoint(self) -> Endpoint | None:
        """The host and port to listen on, ``None`` when the inbox is off."""
        return None if self.listen is None else one_tcp_endpoint(self.listen, "the approval inbox")

    def check_installed(self) -> None:
        """``ConfigError`` when the inbox is on but its web stack (the ``approvals-ui`` extra) is not installed."""
        missing = [name for name in _NEEDS if importlib.util.find_spec(name) is None]
        if self.listen is not None and missing:
            raise ConfigError("config error at approvals_ui.listen: serving the approval inbox needs the "
                              f"'approvals-ui' extra (pip install 'toolbooth[approvals-ui]'); missing: "
                              f"{', '.join(missing)}")
