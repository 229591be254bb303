"""SMTP transport security against real in-process servers: STARTTLS (required by the server) and implicit TLS
with a self-signed certificate made for the test; a server that does not offer STARTTLS, or whose certificate
is not trusted, gets nothing; credentials go only over TLS, or in clear to a loopback relay that is allowed.
(The drafts' backend plays no part here: these tests keep them in SQLite.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.plugin import ConfigError, ErrorCode
from tests.support.waiting import until
from toolbooth_email.models import SendEmailOutput

from .conftest import Certificate, Configure, MailServer, draft, self_signed, send, send_error, serving, state

pytestmark = pytest.mark.parametrize("drafts_db", ["sqlite"], indirect=True)

PASSWORD = "s3cret-smtp"
LOGIN = {"username": "mailer", "password": PASSWORD}


async def test_starttls_upgrades_first_and_logs_in_over_tls(configure: Configure, make_context: Any,
                                                            certificate: Certificate) -> None:
    async with serving(tls_context=certificate.server_context(), require_starttls=True) as server:
        configure(smtp={"port": server.port, "security": "starttls", "cert_bundle": str(certificate.cert), **LOGIN})
        result = await send(make_context, await draft(make_context))
    assert isinstance(result, SendEmailOutput)
    [got] = server.received
    assert got.encrypted and got.message["Message-ID"] == result.provider_message_id
    assert got.rcpt_tos == ["ana@example.com", "ops@example.com", "audit@example.com"]
    assert server.logins == [("mailer", PASSWORD, True)]


async def test_implicit_tls_from_the_first_byte(configure: Configure, make_context: Any,
                                                certificate: Certificate) -> None:
    # aiosmtpd counts only STARTTLS as TLS for its AUTH rule; this session is TLS from the start.
    async with serving(tls=certificate.server_context(), auth_require_tls=False) as server:
        configure(smtp={"port": server.port, "security": "tls", "cert_bundle": str(certificate.cert), **LOGIN})
        result = await send(make_context, await draft(make_context))
    assert isinstance(result, SendEmailOutput)
    [got] = server.received
    assert got.encrypted and server.logins == [("mailer", PASSWORD, True)]


async def test_a_server_without_starttls_gets_nothing_in_clear(configure: Configure, make_context: Any,
                                                               mail_server: MailServer) -> None:
    configure(smtp={"security": "starttls", **LOGIN})
    approved = await draft(make_context)
    error = await send_error(make_context, approved)
    assert (error.code, error.retryable) == (ErrorCode.SERVICE_UNAVAILABLE, False)
    assert error.safe_details == {"state": "pending", "transport": "starttls_not_offered"}
    assert "does not offer STARTTLS" in error.message and "nothing was sent" in error.message
    assert (mail_server.mail_commands, mail_server.logins, mail_server.received) == (0, [], [])
    assert await state(configure, approved["preview_id"]) == "pending"


async def test_implicit_tls_to_a_plain_text_server_fails_as_tls(configure: Configure, make_context: Any,
                                                                mail_server: MailServer) -> None:
    configure(smtp={"security": "tls", **LOGIN})
    approved = await draft(make_context)
    error = await send_error(make_context, approved)
    assert (error.code, error.retryable) == (ErrorCode.SERVICE_UNAVAILABLE, False)
    assert error.safe_details == {"state": "pending", "transport": "tls_failed"}
    assert (mail_server.mail_commands, mail_server.logins, mail_server.received) == (0, [], [])


@pytest.mark.parametrize("security", ["starttls", "tls"])
@pytest.mark.parametrize("why", ["unknown issuer", "another host's name"])
async def test_an_untrusted_certificate_is_refused_and_nothing_is_sent(configure: Configure, make_context: Any,
                                                                       tmp_path: Path, security: str,
                                                                       why: str) -> None:
    if why == "unknown issuer":  # a certificate for the right name, from no CA the client trusts
        certificate, trusted = self_signed(tmp_path / "own", "localhost", "127.0.0.1"), {}
    else:  # a trusted certificate, for another name
        certificate = self_signed(tmp_path / "other", "mx.other.test")
        trusted = {"cert_bundle": str(certificate.cert)}
    tls = {"tls_context": certificate.server_context(), "require_starttls": True} if security == "starttls" else {
        "tls": certificate.server_context(), "auth_require_tls": False}
    async with serving(**tls) as server:
        configure(smtp={"port": server.port, "security": security, **trusted, **LOGIN})
        approved = await draft(make_context)
        error = await send_error(make_context, approved)
        assert (error.code, error.retryable) == (ErrorCode.SERVICE_UNAVAILABLE, False)
        assert error.safe_details == {"state": "pending", "transport": "certificate_untrusted"}
        assert "is not trusted" in error.message and "nothing was sent" in error.message
        assert (server.mail_commands, server.logins, server.received) == (0, [], [])
        assert await state(configure, approved["preview_id"]) == "pending"
        configure(smtp={"port": server.port, "security": security, "validate_certs": False, **LOGIN})
        assert isinstance(await send(make_context, approved), SendEmailOutput)  # verification off: it goes out
        await until(lambda: len(server.received) == 1, what="the message at the server")


async def test_credentials_go_in_clear_only_to_an_allowed_loopback_relay(configure: Configure,
                                                                        make_context: Any) -> None:
    async with serving(auth_require_tls=False) as server:  # a relay that would take a login in clear
        configure(smtp={"port": server.port, **LOGIN})
        approved = await draft(make_context)
        error = await send_error(make_context, approved)
        assert (error.code, error.retryable) == (ErrorCode.SERVICE_UNAVAILABLE, False)
        assert error.safe_details == {"state": "pending", "transport": "login_in_clear"}
        assert (server.logins, server.received) == ([], [])
        configure(smtp={"port": server.port, "allow_plaintext_login": True, **LOGIN})
        assert isinstance(await send(make_context, approved), SendEmailOutput)
    assert server.logins == [("mailer", PASSWORD, False)] and len(server.received) == 1


def test_plaintext_login_is_allowed_only_for_a_loopback_host(configure: Configure) -> None:
    with pytest.raises(ConfigError, match=r"^config error at plugins\.config\.email\.smtp: allow_plaintext_login is "
                                          r"allowed only for a loopback host, not 'smtp\.example\.com'$"):
        configure(smtp={"host": "smtp.example.com", "allow_plaintext_login": True})
    for host in ("localhost", "127.0.0.2", "::1"):
        assert configure(smtp={"host": host, "allow_plaintext_login": True}).smtp.allow_plaintext_login


def test_a_missing_ca_file_names_the_key(configure: Configure, tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    with pytest.raises(ConfigError) as refused:
        configure(smtp={"security": "tls", "cert_bundle": str(missing)})
    assert str(refused.value) == (f"config error at plugins.config.email.smtp.cert_bundle: Path does not point to a "
                                  f"file ({missing})")
