"""Bearer-token authentication: what is accepted, what is refused, and with which message."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from sidecar.config import AuthMode, AuthSettings, JwtSettings, parse_settings
from sidecar.contract import Principal
from sidecar.errors import AuthenticationError, ConfigError
from sidecar.server.auth import Authenticator

ISSUER, AUDIENCE = "https://issuer.example", "toolbooth"


def _pem(public_key: Any) -> str:
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _authenticator(public_key: Any, *, algorithms: tuple[str, ...] = ("RS256", "ES256"), **extra: Any) -> Authenticator:
    jwt_settings = JwtSettings(
        algorithms=algorithms, issuer=ISSUER, audience=AUDIENCE, key=_pem(public_key), leeway_seconds=0, **extra
    )
    return Authenticator(AuthSettings(mode=AuthMode.JWT, jwt=jwt_settings))


def _claims(**changes: Any) -> dict[str, Any]:
    claims = {"sub": "user-1", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 300,
              "tenant": "acme", "roles": ["developer"], "permissions": ["email:send"]}
    claims.update(changes)
    return {name: value for name, value in claims.items() if value is not None}


def _bearer(token: str) -> list[tuple[str, str | bytes]]:
    return [("user-agent", "test"), ("authorization", f"Bearer {token}")]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unsigned(claims: dict[str, Any], alg: str = "none") -> str:
    header = {"alg": alg, "typ": "JWT"}
    return f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}."


def _forged_hs256(claims: dict[str, Any], secret: bytes) -> str:
    signing_input = _unsigned(claims, "HS256").rstrip(".")
    return f"{signing_input}.{_b64(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())}"


async def _refused(authenticator: Authenticator, metadata: list[tuple[str, str | bytes]]) -> str:
    with pytest.raises(AuthenticationError) as caught:
        await authenticator.authenticate(metadata)
    return str(caught.value)


async def test_valid_rs256_token_yields_the_principal(rsa_key: rsa.RSAPrivateKey) -> None:
    token = jwt.encode(_claims(), rsa_key, algorithm="RS256")
    principal = await _authenticator(rsa_key.public_key()).authenticate(_bearer(token))
    assert principal == Principal(id="user-1", tenant="acme", roles=("developer",), permissions=("email:send",))


async def test_valid_es256_token_yields_the_principal(ec_key: ec.EllipticCurvePrivateKey) -> None:
    token = jwt.encode(_claims(sub="agent-7", roles=None, permissions=None), ec_key, algorithm="ES256")
    principal = await _authenticator(ec_key.public_key()).authenticate(_bearer(token))
    assert principal == Principal(id="agent-7", tenant="acme")


async def test_claim_names_come_from_settings_and_scope_strings_split(rsa_key: rsa.RSAPrivateKey) -> None:
    claims = _claims(org="globex", groups=["ops", "admin"], scope="records:read records:delete")
    authenticator = _authenticator(
        rsa_key.public_key(), tenant_claim="org", roles_claim="groups", permissions_claim="scope"
    )
    principal = await authenticator.authenticate(_bearer(jwt.encode(claims, rsa_key, algorithm="RS256")))
    assert (principal.tenant, principal.roles) == ("globex", ("ops", "admin"))
    assert principal.permissions == ("records:read", "records:delete")


async def test_roles_must_be_a_list_of_strings(rsa_key: rsa.RSAPrivateKey) -> None:
    token = jwt.encode(_claims(roles="admin"), rsa_key, algorithm="RS256")
    assert await _refused(_authenticator(rsa_key.public_key()), _bearer(token)) == "invalid token claim roles"


async def test_bad_signature_is_refused(rsa_key: rsa.RSAPrivateKey) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = jwt.encode(_claims(), other, algorithm="RS256")
    assert await _refused(_authenticator(rsa_key.public_key()), _bearer(token)) == "invalid token"


async def test_expired_token_is_refused(rsa_key: rsa.RSAPrivateKey) -> None:
    token = jwt.encode(_claims(exp=int(time.time()) - 5), rsa_key, algorithm="RS256")
    assert await _refused(_authenticator(rsa_key.public_key()), _bearer(token)) == "token expired"


async def test_leeway_accepts_a_recently_expired_token(rsa_key: rsa.RSAPrivateKey) -> None:
    token = jwt.encode(_claims(exp=int(time.time()) - 5), rsa_key, algorithm="RS256")
    authenticator = Authenticator(AuthSettings(jwt=JwtSettings(
        issuer=ISSUER, audience=AUDIENCE, key=_pem(rsa_key.public_key()), leeway_seconds=60
    )))
    assert (await authenticator.authenticate(_bearer(token))).id == "user-1"


async def test_wrong_audience_is_refused(rsa_key: rsa.RSAPrivateKey) -> None:
    token = jwt.encode(_claims(aud="another-service"), rsa_key, algorithm="RS256")
    assert await _refused(_authenticator(rsa_key.public_key()), _bearer(token)) == "invalid token audience"


async def test_wrong_issuer_is_refused(rsa_key: rsa.RSAPrivateKey) -> None:
    token = jwt.encode(_claims(iss="https://evil.example"), rsa_key, algorithm="RS256")
    assert await _refused(_authenticator(rsa_key.public_key()), _bearer(token)) == "invalid token issuer"


@pytest.mark.parametrize("claim", ["exp", "sub", "aud", "iss"])
async def test_missing_required_claim_is_refused(rsa_key: rsa.RSAPrivateKey, claim: str) -> None:
    token = jwt.encode(_claims(**{claim: None}), rsa_key, algorithm="RS256")
    assert await _refused(_authenticator(rsa_key.public_key()), _bearer(token)) == f"token is missing the {claim} claim"


async def test_alg_none_is_refused(rsa_key: rsa.RSAPrivateKey) -> None:
    assert await _refused(_authenticator(rsa_key.public_key()), _bearer(_unsigned(_claims()))) == "invalid token"


async def test_hs256_signed_with_the_public_key_is_refused(rsa_key: rsa.RSAPrivateKey) -> None:
    """The key-confusion attack: the public PEM used as an HMAC secret."""
    token = _forged_hs256(_claims(), _pem(rsa_key.public_key()).encode())
    authenticator = _authenticator(rsa_key.public_key(), algorithms=("RS256",))
    assert await _refused(authenticator, _bearer(token)) == "invalid token"


async def test_hs256_with_a_configured_shared_secret_is_accepted() -> None:
    """Proves the forging helper above makes well-formed tokens."""
    secret = "s" * 32
    jwt_settings = JwtSettings(algorithms=("HS256",), issuer=ISSUER, audience=AUDIENCE, key=secret)
    authenticator = Authenticator(AuthSettings(jwt=jwt_settings))
    assert (await authenticator.authenticate(_bearer(_forged_hs256(_claims(), secret.encode())))).id == "user-1"


async def test_allowed_algorithm_whose_key_type_differs_is_refused(
    rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    token = jwt.encode(_claims(), ec_key, algorithm="ES256")
    assert await _refused(_authenticator(rsa_key.public_key()), _bearer(token)) == "invalid token"


def test_hmac_algorithm_with_a_pem_key_is_a_config_error(rsa_key: rsa.RSAPrivateKey) -> None:
    with pytest.raises(ConfigError, match=r"auth\.jwt"):
        _authenticator(rsa_key.public_key(), algorithms=("HS256",))


async def test_missing_header_is_refused(rsa_key: rsa.RSAPrivateKey) -> None:
    assert await _refused(_authenticator(rsa_key.public_key()), [("user-agent", "x")]) == "missing bearer token"


@pytest.mark.parametrize(
    "value", ["Basic dXNlcjpwYXNz", "Bearer", "Bearer ", "Bearer a b", "token-without-scheme", b"Bearer x"]
)
async def test_malformed_header_is_refused(rsa_key: rsa.RSAPrivateKey, value: str | bytes) -> None:
    message = await _refused(_authenticator(rsa_key.public_key()), [("authorization", value)])
    assert message == "malformed authorization header"


async def test_two_authorization_headers_are_refused(rsa_key: rsa.RSAPrivateKey) -> None:
    token = jwt.encode(_claims(), rsa_key, algorithm="RS256")
    metadata = [*_bearer(token), ("authorization", f"Bearer {token}")]
    assert await _refused(_authenticator(rsa_key.public_key()), metadata) == "malformed authorization header"


async def test_garbage_token_is_refused(rsa_key: rsa.RSAPrivateKey) -> None:
    assert await _refused(_authenticator(rsa_key.public_key()), _bearer("not.a.jwt")) == "invalid token"


async def test_dev_mode_returns_the_static_principal_and_ignores_tokens() -> None:
    principal = Principal(id="alice", tenant="local", roles=("admin",))
    authenticator = Authenticator(AuthSettings(dev_principal=principal))
    assert await authenticator.authenticate([]) is principal
    assert await authenticator.authenticate(_bearer("anything")) is principal


@pytest.mark.parametrize(("value", "message"), [
    (100, "config error at auth.max_token_bytes: Input should be greater than or equal to 1024"),
    (2 * 1024 * 1024, "config error at auth.max_token_bytes: Input should be less than or equal to 1048576"),
])
def test_a_token_size_limit_out_of_range_is_refused_with_its_key(value: int, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings({"auth": {"max_token_bytes": value}})
    assert str(caught.value) == message


async def test_a_token_over_the_limit_is_refused_before_it_is_read(rsa_key: rsa.RSAPrivateKey) -> None:
    jwt_settings = JwtSettings(issuer=ISSUER, audience=AUDIENCE, key=_pem(rsa_key.public_key()))
    authenticator = Authenticator(AuthSettings(jwt=jwt_settings, max_token_bytes=1024))
    assert await _refused(authenticator, _bearer("x" * 1025)) == (
        "token too large: at most 1024 bytes (auth.max_token_bytes)")
