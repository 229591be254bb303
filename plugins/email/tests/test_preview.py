"""``send_email_preview``: validation, normalization, the rules, the stable hash, and that it sends nothing.
Also the plugin's configuration and its packaging."""

from __future__ import annotations

import json
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sidecar.plugin import ConfigError, ErrorCode, Principal, SideEffect, ToolError, read_plugin_settings
from toolbooth_email import PLUGIN, TOOLS, send_email, send_email_preview
from toolbooth_email.access import content_hash
from toolbooth_email.drafts import open_drafts
from toolbooth_email.models import SendEmailPreviewInput, SendEmailPreviewOutput
from toolbooth_email.settings import EmailSettings

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
MAIL: dict[str, Any] = {"recipients": [{"email": " Ana@EXAMPLE.com ", "display_name": "Ana"}],
                        "cc": [{"email": "ops@Example.COM"}], "subject": "Deployment complete",
                        "body_text": "The new version has been deployed."}
ADMIN = Principal(id="alice", tenant="acme", roles=("admin",))


async def preview(make_context: Any, mail: dict[str, Any] = MAIL,
                  principal: Principal | None = None) -> SendEmailPreviewOutput:
    output = await send_email_preview(SendEmailPreviewInput.model_validate(mail), make_context(principal))
    assert isinstance(output, SendEmailPreviewOutput)
    return output


async def refused(make_context: Any, mail: dict[str, Any], principal: Principal | None = None) -> ToolError:
    with pytest.raises(ToolError) as caught:
        await preview(make_context, mail, principal)
    return caught.value


async def test_normalizes_addresses_and_renders_the_exact_message(configure: Any, make_context: Any) -> None:
    out = await preview(make_context)
    assert out.preview_id.startswith("email_preview_") and out.expires_at.endswith("Z")
    dumped = out.model_dump(mode="json")["email"]
    assert dumped == {"from": {"email": "toolbooth@example.com", "display_name": "Toolbooth"},
                      "recipients": [{"email": "Ana@example.com", "display_name": "Ana"}],
                      "cc": [{"email": "ops@example.com", "display_name": None}], "bcc": [],
                      "subject": "Deployment complete", "body_text": "The new version has been deployed."}
    assert out.warnings == []


async def test_does_not_send_an_email_and_stores_the_draft(configure: Any, make_context: Any,
                                                           mail_server: Any) -> None:
    out = await preview(make_context)
    assert mail_server.received == [] and not mail_server.data_started.is_set()
    draft = await open_drafts(configure.settings).get(out.preview_id)
    assert draft is not None and draft.state == "pending" and draft.preview == out
    assert (draft.tenant, draft.principal_id) == ("acme", "alice")


async def test_warns_about_external_recipients(configure: Any, make_context: Any) -> None:
    mail = {**MAIL, "bcc": [{"email": "bo@Partner.org"}, {"email": "cy@mail.example.com"}]}
    out = await preview(make_context, mail, ADMIN)
    assert [(w.code, w.message) for w in out.warnings] == [
        ("EXTERNAL_RECIPIENT", "recipients outside your organization: partner.org")]


async def test_an_external_recipient_needs_the_external_permission(configure: Any, make_context: Any) -> None:
    error = await refused(make_context, {**MAIL, "cc": [{"email": "bo@partner.org"}]})
    assert error.code is ErrorCode.PERMISSION_DENIED
    assert error.message == ("sending to recipients outside the organization (partner.org) needs permission "
                             "email:send_external")
    granted = Principal(id="alice", tenant="acme", permissions=("email:send_external",))
    assert (await preview(make_context, {**MAIL, "cc": [{"email": "bo@partner.org"}]}, granted)).warnings


async def test_rejects_blocked_domains_and_their_subdomains(configure: Any, make_context: Any) -> None:
    configure(rules={"blocked_domains": ["rival.com"]})
    for address, domain in (("ceo@rival.com", "rival.com"), ("ceo@EU.Rival.com", "eu.rival.com")):
        error = await refused(make_context, {**MAIL, "cc": [{"email": address}]}, ADMIN)
        assert (error.code, error.field) == (ErrorCode.POLICY_VIOLATION, "recipients")
        assert error.message == f"sending to {domain} is not allowed"
        assert error.safe_details == {"blocked_domains": [domain]}
    assert await preview(make_context, {**MAIL, "cc": [{"email": "ceo@notrival.com"}]}, ADMIN)


async def test_recipient_limit_counts_recipients_cc_and_bcc(configure: Any, make_context: Any) -> None:
    configure(rules={"max_recipients": 3})
    boxes = [{"email": f"u{i}@example.com"} for i in range(4)]
    error = await refused(make_context, {**MAIL, "recipients": boxes[:2], "cc": boxes[2:3], "bcc": boxes[3:]})
    assert error.code is ErrorCode.POLICY_VIOLATION
    assert error.message == "4 recipients (recipients, cc and bcc together); at most 3 are allowed"
    assert error.safe_details == {"max_recipients": 3, "recipient_count": 4}
    assert await preview(make_context, {**MAIL, "recipients": boxes[:3], "cc": []})


async def test_duplicates_are_dropped_with_a_warning(configure: Any, make_context: Any) -> None:
    mail = {**MAIL, "cc": [{"email": "ana@example.com"}], "bcc": [{"email": "ANA@example.com"}]}
    out = await preview(make_context, mail)
    assert [b.email for b in out.email.recipients] == ["Ana@example.com"] and out.email.cc == out.email.bcc == []
    assert [w.code for w in out.warnings] == ["DUPLICATE_RECIPIENT"]


async def test_produces_a_stable_hash_over_the_rendered_message(configure: Any, make_context: Any) -> None:
    first = await preview(make_context)
    second = await preview(make_context, {**MAIL, "cc": [{"email": "ops@example.com"}]})  # the same, normalized
    assert first.preview_id != second.preview_id
    assert first.preview_hash == second.preview_hash == content_hash(first.email)
    assert first.preview_hash.startswith("sha256:") and len(first.preview_hash) == 7 + 64
    changed = await preview(make_context, {**MAIL, "subject": "Deployment complete."})
    assert changed.preview_hash != first.preview_hash


@pytest.mark.parametrize(("change", "where", "says"), [
    ({"recipients": []}, ("recipients",), "at least 1"),
    ({"recipients": [{"email": "not an address"}]}, ("recipients", 0, "email"), "not a valid email address"),
    ({"cc": [{"email": "ana@localhost"}]}, ("cc", 0, "email"), "not a valid email address"),
    ({"subject": "Hi\r\nBcc: x@evil.test"}, ("subject",), "one line"),
    ({"subject": "   "}, ("subject",), "blank"),
    ({"body_text": ""}, ("body_text",), "at least 1"),
    ({"recipients": [{"email": "a@example.com", "display_name": "A\nB"}]}, ("recipients", 0, "display_name"),
     "one line"),
    ({"from": "boss@example.com"}, ("from",), "Extra inputs"),
])
def test_invalid_arguments_are_refused_with_their_field(change: dict[str, Any], where: tuple[Any, ...],
                                                        says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        SendEmailPreviewInput.model_validate({**MAIL, **change})
    [error] = caught.value.errors()
    assert error["loc"] == where and says in error["msg"]


# --- configuration --------------------------------------------------------------


def test_the_smtp_password_is_inline_or_read_from_its_file(configure: Any, tmp_path: Path) -> None:
    secret = tmp_path / "smtp-password"
    secret.write_text("s3cret\n", encoding="utf-8")
    settings = configure(smtp={"username": "mailer", "password_file": str(secret)})
    assert settings.smtp.password is not None and settings.smtp.password.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)
    env = {"TOOLBOOTH_PLUGINS__CONFIG__EMAIL__SMTP__PASSWORD": "from-env"}  # e.g. a Kubernetes secret
    password = read_plugin_settings("email", EmailSettings, env=env).smtp.password
    assert password is not None and password.get_secret_value() == "from-env"


@pytest.mark.parametrize(("smtp", "message"), [
    ({"password": "inline", "password_file": "/run/secrets/smtp"},
     "config error at plugins.config.email.smtp: set at most one of 'password' or 'password_file'"),
    ({"password_file": "/nonexistent/smtp-password"},
     "config error at plugins.config.email.smtp: password_file: cannot read /nonexistent/smtp-password: "
     "No such file or directory"),
    ({"security": "ssl"}, "config error at plugins.config.email.smtp.security: Input should be 'starttls', 'tls' "
                          "or 'none'"),
    ({"port": 0}, "config error at plugins.config.email.smtp.port: Input should be greater than or equal to 1"),
    ({"passwd": "x"}, "config error at plugins.config.email.smtp.passwd: unknown key"),
])
def test_a_bad_config_names_the_key(configure: Any, smtp: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        configure(smtp=smtp)
    assert str(caught.value) == message
    assert "inline" not in str(caught.value)


def test_bad_policy_data_is_named(configure: Any, tmp_path: Path) -> None:
    (tmp_path / "data.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^config error at plugins\.config\.email\.rules: policy_data: "
                                          rf"{tmp_path / 'data.json'} is not policy data with toolbooth\.email"):
        configure(rules={"policy_data": str(tmp_path / "data.json")})


def test_the_rules_can_come_from_the_policy_data(configure: Any, tmp_path: Path) -> None:
    data = {"toolbooth": {"role_permissions": {"boss": ["email:out"], "dev": ["email:send"]},
                          "email": {"internal_domains": ["acme.test"], "external_permission": "email:out"}}}
    (tmp_path / "data.json").write_text(json.dumps(data), encoding="utf-8")
    rules = configure(rules={"policy_data": str(tmp_path / "data.json"), "max_recipients": 5}).rules
    assert (rules.internal_domains, rules.external_permission, rules.external_roles) == (("acme.test",), "email:out",
                                                                                         ("boss",))
    assert rules.max_recipients == 5


# --- metadata and packaging -----------------------------------------------------


def test_tool_metadata() -> None:
    assert (send_email_preview.side_effect, send_email_preview.permissions, send_email_preview.timeout) == (
        SideEffect.NONE, ("email:preview_send",), 2.0)
    assert send_email_preview.retry.max_attempts == 2
    assert (send_email.side_effect, send_email.permissions, send_email.timeout) == (
        SideEffect.EXTERNAL_IRREVERSIBLE, ("email:send",), 10.0)
    assert send_email.retry.max_attempts == 1 and send_email.preview is not None
    assert send_email.requires_idempotency_key


def test_installed_entry_point_loads_the_tools() -> None:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    assert project["entry-points"]["toolbooth.tools"] == {"email": "toolbooth_email:PLUGIN"}
    (entry_point,) = metadata.entry_points(group="toolbooth.tools", name="email")
    assert entry_point.load() is PLUGIN and list(PLUGIN.tools) == TOOLS == [send_email_preview, send_email]
    assert PLUGIN.settings is EmailSettings
