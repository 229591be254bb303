"""``toolbooth token``: what it signs is what the sidecar of the same configuration accepts, and what it refuses.

Also ``--field``, the output of one field of a printed result (``sidecar.cli.common.print_result``), and what any
command does when the reader of its output goes away.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jwt
import pytest

from sidecar.cli.common import CommandError, print_result
from sidecar.cli.root import EXIT_BROKEN_PIPE, main
from sidecar.config import load_settings
from sidecar.contract import Principal
from sidecar.server.auth import Authenticator
from tests.support.signing_keys import key_pair

SECRET = "a-development-secret-of-at-least-32-bytes"


@pytest.fixture(autouse=True)
def _clean(clean_env: None) -> None:
    """Without the caller's TOOLBOOTH_* variables (``clean_env``)."""


def _config(tmp_path: Path, jwt_section: str) -> Path:
    (tmp_path / "secret.key").write_text(SECRET)
    path = tmp_path / "toolbooth.yaml"
    path.write_text(f"auth:\n  jwt:\n{jwt_section}")
    return path


HMAC = "    algorithms: [HS256]\n    key_file: {dir}/secret.key\n    issuer: quick\n    audience: toolbooth\n"


def _token(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["token", *argv]) == 0
    return capsys.readouterr().out.strip()


async def test_the_token_is_accepted_by_the_sidecar_of_the_same_configuration(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, HMAC.format(dir=tmp_path))
    token = _token(capsys, "--config", str(config), "--subject", "alice", "--tenant", "dev", "--role", "developer",
                   "--role", "approver", "--permission", "email:send_external")
    principal = await Authenticator(load_settings(config).auth).authenticate([("authorization", f"Bearer {token}")])
    assert principal == Principal(id="alice", tenant="dev", roles=("developer", "approver"),
                                  permissions=("email:send_external",))


async def test_the_claim_names_and_lifetime_follow_the_configuration(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, HMAC.format(dir=tmp_path) + "    tenant_claim: org\n    roles_claim: groups\n")
    token = _token(capsys, "--config", str(config), "--subject", "bob", "--tenant", "acme", "--role", "approver",
                   "--ttl", "60")
    claims = jwt.decode(token, SECRET, algorithms=["HS256"], audience="toolbooth", issuer="quick")
    assert claims["org"] == "acme" and claims["groups"] == ["approver"] and claims["exp"] - claims["iat"] == 60
    principal = await Authenticator(load_settings(config).auth).authenticate([("authorization", f"Bearer {token}")])
    assert (principal.tenant, principal.roles) == ("acme", ("approver",))


def test_dev_mode_has_nothing_to_sign_with(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "--subject", "alice"]) == 2
    assert "dev mode: there is no key to sign with" in capsys.readouterr().err


def test_an_asymmetric_key_is_never_the_sidecars_to_sign_with(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "public.pem").write_text(key_pair("RS256").public)
    config = tmp_path / "toolbooth.yaml"
    config.write_text(f"auth:\n  jwt:\n    algorithms: [RS256]\n    key_file: {tmp_path}/public.pem\n"
                      "    issuer: quick\n    audience: toolbooth\n")
    assert main(["token", "--config", str(config), "--subject", "alice"]) == 2
    assert "only a shared HMAC secret (an HS* algorithm with key or key_file) can sign" in capsys.readouterr().err


def test_a_pem_key_configured_for_hs256_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "public.pem").write_text(key_pair("RS256").public)
    config = tmp_path / "toolbooth.yaml"
    config.write_text(f"auth:\n  jwt:\n    algorithms: [HS256]\n    key_file: {tmp_path}/public.pem\n"
                      "    issuer: quick\n    audience: toolbooth\n")
    assert main(["token", "--config", str(config), "--subject", "alice"]) == 2
    assert "the key cannot be an HS256 secret" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "expected"), [
    (["--subject", "alice", "--ttl", "0"], "--ttl 0: expected more than 0 and at most 86400 seconds"),
    (["--subject", "alice", "--ttl", "90000"], "--ttl 90000: expected more than 0"),
    (["--subject", " "], "--subject must not be empty"),
])
def test_bad_flags_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                          expected: str) -> None:
    config = _config(tmp_path, HMAC.format(dir=tmp_path))
    assert main(["token", "--config", str(config), *argv]) == 2
    assert expected in capsys.readouterr().err


def test_field_prints_a_string_as_it_is_and_anything_else_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    result = {"status": "success", "data": {"preview_id": "tp_1", "items": [1, 2]}}
    print_result(result, "data.preview_id")
    print_result(result, "data.items")
    print_result(result, None)
    out = capsys.readouterr().out
    assert out.startswith('tp_1\n[\n  1,\n  2\n]\n{\n  "status": "success"')


@pytest.mark.parametrize("path", ["data.missing", "status.deeper", "nothing", ""])
def test_a_missing_field_is_an_error_that_says_so(path: str) -> None:
    with pytest.raises(CommandError, match=f"--field {path}: the result has no such field") as raised:
        print_result({"status": "error", "data": None}, path)
    assert raised.value.exit_code == 1


def test_a_reader_that_went_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """``toolbooth … | head``: stdout closed before the command writes is SIGPIPE's exit status and no traceback."""
    config = _config(tmp_path, HMAC.format(dir=tmp_path))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    env = {name: value for name, value in os.environ.items() if not name.startswith("TOOLBOOTH_")}
    try:
        done = subprocess.run([sys.executable, "-m", "sidecar", "token", "--config", str(config), "--subject", "a"],
                              stdout=write_end, stderr=subprocess.PIPE, env=env, timeout=60, check=False)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (EXIT_BROKEN_PIPE, b"")
