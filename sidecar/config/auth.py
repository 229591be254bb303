"""``auth``: who a caller is (``dev``: a static principal, loopback only; ``jwt``: a verified bearer token).

A token is verified with a key given as ``key`` or ``key_file``, or with the issuer's published keys:
``jwks_url``, a JSON Web Key Set fetched over https (http only from a loopback host), its keys chosen by
the token's ``kid`` (``sidecar.server.jwks``). Exactly one of the three is set.

``max_token_bytes`` is the largest bearer token any listener accepts; gRPC's metadata limit is that plus
``OTHER_METADATA_BYTES`` for the rest of a call's metadata (``AuthSettings.max_metadata_bytes``).
"""

from __future__ import annotations

from enum import StrEnum
from urllib.parse import urlsplit

from pydantic import Field, FilePath, field_validator, model_validator

from sidecar.config.base import KeySource, Section
from sidecar.config.listen import is_loopback
from sidecar.contract import Principal

__all__ = ["OTHER_METADATA_BYTES", "AuthMode", "AuthSettings", "JwtSettings"]

OTHER_METADATA_BYTES = 8192  # a call's metadata besides its token (path, user agent, deadline, trace context)


class AuthMode(StrEnum):
    DEV = "dev"
    JWT = "jwt"


class JwtSettings(KeySource):
    """Verification of the bearer token in the ``authorization`` metadata."""

    algorithms: tuple[str, ...] = ("RS256", "ES256")
    issuer: str = Field(min_length=1)
    audience: str = Field(min_length=1)
    leeway_seconds: float = Field(default=30.0, ge=0)
    tenant_claim: str = "tenant"
    roles_claim: str = "roles"
    permissions_claim: str = "permissions"
    jwks_url: str | None = None
    jwks_ca_file: FilePath | None = None  # the CA of the JWKS server (default: the system's)
    jwks_timeout_seconds: float = Field(default=5.0, gt=0, le=60)  # one fetch, at most
    jwks_cache_seconds: float = Field(default=300.0, gt=0)  # a fetched key set is used this long, never longer
    # A kid the set lacks fetches it again, and a failed fetch is tried again, at most this often.
    jwks_min_refresh_seconds: float = Field(default=30.0, ge=0)

    @field_validator("algorithms")
    @classmethod
    def _known_algorithms(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        allowed = {"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "EdDSA", "HS256", "HS384", "HS512"}
        if not value:
            raise ValueError("at least one algorithm is required")
        if bad := [a for a in value if a not in allowed]:
            raise ValueError(f"unsupported algorithm(s) {bad}; 'none' is never accepted")
        return value

    @field_validator("jwks_url")
    @classmethod
    def _https(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError(f"{value!r}: expected https://HOST[:PORT]/PATH")
        if parts.scheme == "http" and not is_loopback(parts.hostname):
            raise ValueError(f"{value!r}: the keys that verify tokens are fetched over https:// "
                             "(http:// only from a loopback host)")
        return value

    @model_validator(mode="after")
    def _one_key(self) -> JwtSettings:
        """Overrides ``KeySource``'s rule: exactly one of ``key``, ``key_file`` or ``jwks_url``."""
        if sum(source is not None for source in (self.key, self.key_file, self.jwks_url)) != 1:
            raise ValueError("exactly one of 'key', 'key_file' or 'jwks_url' must be set")
        if self.jwks_url is not None and (hmac := [a for a in self.algorithms if a.startswith("HS")]):
            raise ValueError(f"{', '.join(hmac)}: an HMAC secret is never published in a JWKS; verify HS* tokens "
                             "with 'key' or 'key_file'")
        if self.jwks_url is None and self.jwks_ca_file is not None:
            raise ValueError("'jwks_ca_file' needs 'jwks_url'")
        return self

    def verification_key(self) -> str:
        """The PEM (or HMAC secret) tokens are verified with (not with ``jwks_url``)."""
        return self.read_key("auth.jwt")


class AuthSettings(Section):
    """``dev`` trusts a static principal (loopback only); ``jwt`` verifies tokens."""

    mode: AuthMode | None = None
    jwt: JwtSettings | None = None
    dev_principal: Principal = Principal(id="dev", tenant="dev", roles=("developer",), permissions=())
    # Who may read operator details, e.g. why a policy change was refused (dev mode: everyone).
    operator_roles: tuple[str, ...] = ("operator", "admin")
    # The largest bearer token accepted (jwt mode), on every listener; a larger one is refused, always.
    max_token_bytes: int = Field(default=16 * 1024, ge=1024, le=1024 * 1024)

    @model_validator(mode="after")
    def _mode_matches(self) -> AuthSettings:
        if self.mode is AuthMode.JWT and self.jwt is None:
            raise ValueError("mode 'jwt' needs an 'auth.jwt' section")
        return self

    @property
    def max_metadata_bytes(self) -> int:
        """The most metadata a gRPC call may carry: room for the largest token and the rest."""
        return self.max_token_bytes + OTHER_METADATA_BYTES

    @property
    def effective_mode(self) -> AuthMode:
        """No mode given: ``jwt`` when a jwt section exists, else ``dev``."""
        if self.mode is not None:
            return self.mode
        return AuthMode.JWT if self.jwt is not None else AuthMode.DEV
