"""A real SMTP server in the test's event loop (``aiosmtpd``), the plugin configured for it, and contexts.

``mail_server`` records every message it accepts (``received``: envelope and parsed message), refuses at
RCPT the addresses in ``refuse`` with 550, and, while ``hold`` is set, takes the message but keeps its
reply to DATA back until ``release`` is set (a server whose 250 never reaches the client); ``data_reply``
replaces its 250 to DATA with a refusal.
``configure(**keys)`` writes the plugin's TOML config (SMTP pointed at the server, drafts in this test's own
database) and names it in the environment. Every test that configures the plugin runs twice, with its drafts in
SQLite and in PostgreSQL (``drafts_db``, which also runs SQL on that database; the server is the suite's own,
``tests/contract/conftest.py``). The sidecar fixtures are those of ``tests/integration/conftest.py``.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiosmtpd.smtp import SMTP, Envelope, Session

from sidecar.plugin import Principal, ToolContext
from tests.contract.conftest import postgres
from tests.integration.conftest import jwt_auth, make_settings, make_token, rsa_key, socket_path
from tests.support.postgres import PostgresServer
from toolbooth_email.settings import EmailSettings, load_settings

__all__ = ["jwt_auth", "make_settings", "make_token", "postgres", "rsa_key", "socket_path"]


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
    server = await asyncio.get_running_loop().create_server(lambda: SMTP(handler, hostname="mx.test"),
                                                            "127.0.0.1", 0)
    handler.port = server.sockets[0].getsockname()[1]
    yield handler
    handler.release.set()
    server.close()
    await server.wait_closed()


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


Configure = Callable[..., EmailSettings]


@pytest.fixture
def configure(tmp_path: Path, mail_server: MailServer, drafts_db: DraftsDb,
              monkeypatch: pytest.MonkeyPatch) -> Configure:
    """``configure(rules={...}, smtp={...}, key=value)``: the plugin's settings, written as its config file and
    named in the environment; SMTP goes to ``mail_server``, drafts to ``drafts_db``."""

    def write(**sections: Any) -> EmailSettings:
        smtp = {"host": "127.0.0.1", "port": mail_server.port, "security": "none", "timeout_seconds": 5,
                **sections.pop("smtp", {})}
        top = {**drafts_db.keys(), **{k: sections.pop(k) for k in list(sections) if not isinstance(sections[k], dict)}}
        lines = [*_toml(top), "[smtp]", *_toml(smtp)]
        for name, values in sections.items():
            lines += [f"[{name}]", *_toml(values)]
        path = tmp_path / f"email-{time.monotonic_ns()}.toml"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        monkeypatch.setenv("TOOLBOOTH_EMAIL_CONFIG", str(path))
        return load_settings()

    write()
    return write


def _toml(values: dict[str, Any]) -> list[str]:
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list | tuple):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v) if isinstance(v, str) else str(v)

    return [f"{key} = {value(v)}" for key, v in values.items()]


MakeContext = Callable[..., ToolContext]


@pytest.fixture
def make_context() -> MakeContext:
    """``make_context(principal, key=, approved=, seconds=)``: a context as the pipeline builds one (alice of
    acme, a developer, by default)."""
    return _context


def _context(principal: Principal | None = None, *, key: str | None = "key-1",
             approved: dict[str, Any] | None = None, seconds: float = 10.0) -> ToolContext:
    return ToolContext(principal=principal or Principal(id="alice", tenant="acme", roles=("developer",)),
                       request_id="req-1", deadline=time.monotonic() + seconds, idempotency_key=key, attempt=1,
                       logger=logging.LoggerAdapter(logging.getLogger("test.email"), {}), approved_preview=approved)
