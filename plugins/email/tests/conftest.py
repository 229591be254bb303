"""A real SMTP server in the test's event loop (``aiosmtpd``), the plugin configured for it, and contexts.

``mail_server`` records every message it accepts (``received``: envelope and parsed message), refuses at
RCPT the addresses in ``refuse`` with 550, and, while ``hold`` is set, takes the message but keeps its
reply to DATA back until ``release`` is set (a server whose 250 never reaches the client); ``data_reply``
replaces its 250 to DATA with a refusal; ``down()`` stops it listening and ``up()`` starts it again.
``configure(**sections)`` makes the plugin's section ``plugins.config.email`` (SMTP pointed at the server,
drafts in ``tmp_path``) and validates it as the sidecar does; ``make_context`` gives a handler the settings of
the latest. The sidecar fixtures are those of ``tests/integration/conftest.py``.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.smtp import SMTP, Envelope, Session

from sidecar.plugin import Principal, ToolContext, ToolDefinition
from tests.integration.conftest import jwt_auth, make_settings, make_token, rsa_key, socket_path
from toolbooth_email import PLUGIN
from toolbooth_email.settings import EmailSettings

__all__ = ["jwt_auth", "make_settings", "make_token", "rsa_key", "socket_path"]


@dataclass
class Received:
    """One message the server accepted."""

    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage


@dataclass
class MailServer:
    """The recording handler, and the port the server listens on."""

    port: int = 0
    refuse: set[str] = field(default_factory=set)
    hold: bool = False
    data_reply: str = "250 2.0.0 queued"  # another reply refuses the message (nothing is recorded)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    data_started: asyncio.Event = field(default_factory=asyncio.Event)
    received: list[Received] = field(default_factory=list)
    server: asyncio.Server | None = None

    async def up(self) -> None:
        """Listen (again) on 127.0.0.1 at ``port`` (any free port the first time)."""
        self.server = await asyncio.get_running_loop().create_server(lambda: SMTP(self, hostname="mx.test"),
                                                                     "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        """Stop listening: a connection is refused, as by a server that is down."""
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None

    async def handle_RCPT(self, server: SMTP, session: Session, envelope: Envelope, address: str,
                          rcpt_options: list[str]) -> str:
        if address in self.refuse:
            return "550 5.1.1 mailbox unavailable"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        self.data_started.set()
        if not self.data_reply.startswith("250"):
            return self.data_reply
        assert isinstance(envelope.content, bytes) and envelope.mail_from is not None
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        self.received.append(Received(envelope.mail_from, list(envelope.rcpt_tos), parsed))
        if self.hold:  # it has the message, but its reply is late: the client cannot know
            await self.release.wait()
        return "250 2.0.0 queued"


@pytest.fixture
async def mail_server() -> AsyncIterator[MailServer]:
    handler = MailServer()
    await handler.up()
    yield handler
    handler.release.set()
    await handler.down()


@dataclass
class Configure:
    """``configure(rules={...}, smtp={...})``: the plugin's section ``plugins.config.email`` of these keys (SMTP
    at ``mail_server``, drafts in ``drafts``), validated as the sidecar validates it; the latest is ``section``
    and ``settings``, and ``tools()`` the plugin's tools configured with it."""

    mail_server: MailServer
    drafts: Path
    section: dict[str, Any] = field(default_factory=dict)
    settings: EmailSettings = field(default_factory=EmailSettings)

    def __call__(self, **sections: dict[str, Any]) -> EmailSettings:
        smtp = {"host": "127.0.0.1", "port": self.mail_server.port, "security": "none", "timeout_seconds": 5,
                **sections.pop("smtp", {})}
        section: dict[str, Any] = {"drafts_path": str(self.drafts), "smtp": smtp, **sections}
        [configured, *_] = PLUGIN.configure("email", section)
        assert isinstance(configured.settings, EmailSettings)
        self.section, self.settings = section, configured.settings
        return self.settings

    def tools(self) -> tuple[ToolDefinition[Any, Any], ...]:
        return PLUGIN.configure("email", self.section)


@pytest.fixture
def configure(tmp_path: Path, mail_server: MailServer) -> Configure:
    configured = Configure(mail_server, tmp_path / "drafts.db")
    configured()
    return configured


MakeContext = Callable[..., ToolContext]


@pytest.fixture
def make_context(configure: Configure) -> MakeContext:
    """``make_context(principal, key=, approved=, seconds=)``: a context as the pipeline builds one (alice of
    acme, a developer, by default), with the plugin's settings ``configure`` made last."""

    def make(principal: Principal | None = None, *, key: str | None = "key-1", approved: dict[str, Any] | None = None,
             seconds: float = 10.0) -> ToolContext:
        return ToolContext(principal=principal or Principal(id="alice", tenant="acme", roles=("developer",)),
                           request_id="req-1", deadline=time.monotonic() + seconds, idempotency_key=key, attempt=1,
                           logger=logging.LoggerAdapter(logging.getLogger("test.email"), {}), approved_preview=approved,
                           settings=configure.settings)

    return make
