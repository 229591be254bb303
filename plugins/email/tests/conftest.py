"""A real SMTP server in the test's event loop (``aiosmtpd``), the plugin configured for it, and contexts.

``mail_server`` records every message it accepts (``received``: envelope, parsed message, whether it came over
TLS) and every login (``logins``), refuses at RCPT the addresses in ``refuse`` with 550, and, while ``hold`` is
set, takes the message but keeps its reply to DATA back until ``release`` is set (a server whose 250 never
reaches the client); ``data_reply`` replaces its 250 to DATA with a refusal; ``down()`` stops it listening and
``up()`` starts it again. ``serving(...)`` starts another such server: with implicit TLS, or offering (and
requiring) STARTTLS; ``certificate`` is a self-signed one made for the test.
``configure(**sections)`` makes the plugin's section ``plugins.config.email`` (SMTP pointed at the server,
drafts in this test's own database) and validates it as the sidecar does; ``make_context`` gives a handler the
settings of the latest. Every test that configures the plugin runs twice, with its drafts in SQLite and in
PostgreSQL (``drafts_db``, which also runs SQL on that database; the server is the suite's own,
``tests/contract/conftest.py``). ``draft``, ``send``, ``send_error`` and ``state`` drive ``send_email`` on an
approved draft. The sidecar fixtures are those of ``tests/integration/conftest.py``; ``toolbooth_gate`` is the plugin
test kit's.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import ipaddress
import sqlite3
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sidecar.plugin import Partial, Principal, ToolContext, ToolDefinition, ToolError
from sidecar.plugin.fixtures import toolbooth_gate
from sidecar.plugin.testing import make_context as kit_context
from tests.contract.conftest import postgres
from tests.integration.conftest import jwt_auth, make_settings, make_token, rsa_key, socket_path
from tests.support.postgres import PostgresServer
from toolbooth_email import PLUGIN, render_send_email, send_email, send_email_preview
from toolbooth_email.drafts import open_drafts
from toolbooth_email.models import SendEmailInput, SendEmailOutput, SendEmailPreviewInput, SendEmailPreviewOutput
from toolbooth_email.settings import EmailSettings

__all__ = ["jwt_auth", "make_settings", "make_token", "postgres", "rsa_key", "socket_path", "toolbooth_gate"]

ALICE = Principal(id="alice", tenant="acme", roles=("developer",))


@dataclass
class Received:
    """One message the server accepted."""

    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage
    encrypted: bool  # the session was over TLS (implicit or STARTTLS)


@dataclass
class MailServer:
    """The recording handler, and the server it runs: on ``port``, with implicit TLS when ``tls`` is set;
    ``options`` go to aiosmtpd's ``SMTP`` (``tls_context`` and ``require_starttls`` for STARTTLS,
    ``auth_require_tls``)."""

    port: int = 0
    tls: ssl.SSLContext | None = None
    options: dict[str, Any] = field(default_factory=dict)
    refuse: set[str] = field(default_factory=set)
    hold: bool = False
    data_reply: str = "250 2.0.0 queued"  # another reply refuses the message (nothing is recorded)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    data_started: asyncio.Event = field(default_factory=asyncio.Event)
    received: list[Received] = field(default_factory=list)
    logins: list[tuple[str, str, bool]] = field(default_factory=list)  # (user, password, over TLS)
    mail_commands: int = 0  # MAIL FROM commands: a transaction begun, whether or not it ended with a message
    server: asyncio.Server | None = None

    async def up(self) -> None:
        """Listen (again) on 127.0.0.1 at ``port`` (any free port the first time)."""
        self.server = await asyncio.get_running_loop().create_server(
            lambda: SMTP(self, hostname="mx.test", authenticator=self.authenticate, **self.options), "127.0.0.1",
            self.port, ssl=self.tls)
        self.port = self.server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        """Stop listening: a connection is refused, as by a server that is down."""
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None

    async def handle_MAIL(self, server: SMTP, session: Session, envelope: Envelope, address: str,
                          mail_options: list[str]) -> str:
        self.mail_commands += 1
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    def authenticate(self, server: SMTP, session: Session, envelope: Envelope, mechanism: str,
                     auth_data: Any) -> AuthResult:
        """The server's authenticator: every login succeeds, and is recorded."""
        assert isinstance(auth_data, LoginPassword)
        self.logins.append((auth_data.login.decode(), auth_data.password.decode(), _encrypted(server)))
        return AuthResult(success=True)

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
        self.received.append(Received(envelope.mail_from, list(envelope.rcpt_tos), parsed, _encrypted(server)))
        if self.hold:  # it has the message, but its reply is late: the client cannot know
            await self.release.wait()
        return "250 2.0.0 queued"


def _encrypted(server: SMTP) -> bool:
    return server.transport is not None and server.transport.get_extra_info("cipher") is not None


@asynccontextmanager
async def serving(*, tls: ssl.SSLContext | None = None, **options: Any) -> AsyncIterator[MailServer]:
    """A recording server on a free loopback port, stopped on exit: implicit TLS with ``tls``; ``options`` go to
    aiosmtpd's ``SMTP`` (``tls_context`` and ``require_starttls`` for STARTTLS, ``auth_require_tls``)."""
    handler = MailServer(tls=tls, options=options)
    await handler.up()
    try:
        yield handler
    finally:
        handler.release.set()
        await handler.down()


@pytest.fixture
async def mail_server() -> AsyncIterator[MailServer]:
    """A plain-text server (no STARTTLS, no AUTH offered)."""
    async with serving() as handler:
        yield handler


@dataclass(frozen=True)
class Certificate:
    """A self-signed server certificate for ``localhost`` and ``127.0.0.1`` (or ``names``), and its key."""

    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        return context


def self_signed(folder: Path, *names: str) -> Certificate:
    """A new certificate in ``folder``, valid for an hour, for the DNS names and IP addresses ``names``."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.now(UTC)
    alternatives: list[x509.GeneralName] = []
    for name in names:
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternatives.append(x509.DNSName(name))
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=1))
            .not_valid_after(now + timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    made = Certificate(folder / "cert.pem", folder / "key.pem")
    made.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    made.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return made


@pytest.fixture
def certificate(tmp_path: Path) -> Certificate:
    """The mail server's certificate, for ``127.0.0.1`` and ``localhost``; trust it with ``smtp.cert_bundle``."""
    return self_signed(tmp_path / "tls", "localhost", "127.0.0.1")


@dataclass(frozen=True)
class DraftsDb:
    """The database of this test's drafts: a SQLite file, or a PostgreSQL schema (``dsn``)."""

    path: Path
    dsn: str | None = None

    def keys(self) -> dict[str, str]:
        """The plugin's config keys that name it."""
        return {"drafts_path": str(self.path), **({"drafts_dsn": self.dsn} if self.dsn else {})}

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (``?`` placeholders) on it; its rows."""
        if self.dsn is not None:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                cursor = conn.execute(sql.replace("?", "%s").encode(), params)
                return cursor.fetchall() if cursor.description else []
        with sqlite3.connect(self.path, isolation_level=None) as conn:
            return conn.execute(sql, params).fetchall()


@pytest.fixture(params=["sqlite", "postgres"])
def drafts_db(request: pytest.FixtureRequest, tmp_path: Path) -> DraftsDb:
    """Where this test's drafts are, on each backend."""
    if request.param == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres")
        return DraftsDb(tmp_path / "drafts.db", server.new_schema())
    return DraftsDb(tmp_path / "drafts.db")


@dataclass
class Configure:
    """``configure(rules={...}, smtp={...}, key=value)``: the plugin's section ``plugins.config.email`` of these
    keys (SMTP at ``mail_server``, drafts in ``drafts``), validated as the sidecar validates it; the latest is
    ``section`` and ``settings``, and ``tools()`` the plugin's tools configured with it."""

    mail_server: MailServer
    drafts: DraftsDb
    section: dict[str, Any] = field(default_factory=dict)
    settings: EmailSettings = field(default_factory=EmailSettings)

    def __call__(self, **sections: Any) -> EmailSettings:
        smtp = {"host": "127.0.0.1", "port": self.mail_server.port, "security": "none", "timeout_seconds": 5,
                **sections.pop("smtp", {})}
        section: dict[str, Any] = {**self.drafts.keys(), "smtp": smtp, **sections}
        [configured, *_] = PLUGIN.configure("email", section)
        assert isinstance(configured.settings, EmailSettings)
        self.section, self.settings = section, configured.settings
        return self.settings

    def tools(self) -> tuple[ToolDefinition[Any, Any], ...]:
        return PLUGIN.configure("email", self.section)


@pytest.fixture
def configure(mail_server: MailServer, drafts_db: DraftsDb) -> Configure:
    configured = Configure(mail_server, drafts_db)
    configured()
    return configured


MakeContext = Callable[..., ToolContext]


@pytest.fixture
def make_context(configure: Configure) -> MakeContext:
    """``make_context(principal, key=, approved=, seconds=)``: the context the sidecar gives ``send_email`` (the test
    kit's, ``sidecar.plugin.testing.make_context``; alice of acme, a developer, by default), with the plugin's settings
    ``configure`` made last."""

    def make(principal: Principal | None = None, *, key: str | None = "key-1", approved: dict[str, Any] | None = None,
             seconds: float = 10.0) -> ToolContext:
        return kit_context(send_email, principal=principal or ALICE, idempotency_key=key, approved_preview=approved,
                           seconds=seconds, settings=configure.settings)

    return make


# --- sending: a draft, its approved rendering, and send_email on it --------------------------

MAIL: dict[str, Any] = {"recipients": [{"email": "ana@example.com", "display_name": "Ana Lima"}],
                        "cc": [{"email": "ops@example.com"}], "bcc": [{"email": "audit@example.com"}],
                        "subject": "Deployment complete", "body_text": "The new version has been deployed.\n"}


async def draft(make_context: Any, mail: dict[str, Any] = MAIL, principal: Principal | None = None) -> dict[str, Any]:
    """A stored draft, and its rendering as the approver approves it (``ctx.approved_preview``)."""
    out = await send_email_preview(SendEmailPreviewInput.model_validate(mail), make_context(principal))
    assert isinstance(out, SendEmailPreviewOutput)
    rendered = await render_send_email(SendEmailInput(preview_id=out.preview_id), make_context(principal))
    return rendered.model_dump(mode="json")


async def send(make_context: Any, approved: dict[str, Any], *, key: str = "key-1", principal: Principal | None = None,
               seconds: float = 10.0) -> SendEmailOutput | Partial[SendEmailOutput]:
    result = await send_email(SendEmailInput(preview_id=approved["preview_id"]),
                              make_context(principal, key=key, approved=approved, seconds=seconds))
    assert isinstance(result, SendEmailOutput | Partial)
    return result


async def send_error(make_context: Any, approved: dict[str, Any], **kw: Any) -> ToolError:
    with pytest.raises(ToolError) as caught:
        await send(make_context, approved, **kw)
    return caught.value


async def state(configure: Configure, preview_id: str) -> str:
    """Where the draft is in its life now, in the store of the latest settings."""
    found = await open_drafts(configure.settings).get(preview_id)
    assert found is not None
    return found.state
