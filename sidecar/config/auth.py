"""``auth``: who a caller is (``dev``: a static principal, loopback only; ``jwt``: a verified bearer token)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, field_validator, model_validator

from sidecar.config.base import KeySource, Section
from sidecar.contract import Principal

__all__ = ["AuthMode", "AuthSettings", "JwtSettings"]


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

    @field_validator("algorithms")
    @classmethod
    def _known_algorithms(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        allowed = {"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "EdDSA", "HS256", "HS384", "HS512"}
        if not value:
            raise ValueError("at least one algorithm is required")
        if bad := [a for a in value if a not in allowed]:
            raise ValueError(f"unsupported algorithm(s) {bad}; 'none' is never accepted")
        return value

    def verification_key(self) -> str:
        """The PEM (or HMAC secret) tokens are verified with."""
        return self.read_key("auth.jwt")


class AuthSettings(Section):
    """``dev`` trusts a static principal (loopback only); ``jwt`` verifies tokens."""

    mode: AuthMode | None = None
    jwt: JwtSettings | None = None
    dev_principal: Principal = Principal(id="dev", tenant="dev", roles=("developer",), permissions=())
    # Who may read operator details, e.g. why a policy change was refused (dev mode: everyone).
    operator_roles: tuple[str, ...] = ("operator", "admin")

    @model_validator(mode="after")
    def _mode_matches(self) -> AuthSettings:
        if self.mode is AuthMode.JWT and self.jwt is None:
            raise ValueError("mode 'jwt' needs an 'auth.jwt' section")
        return self

    @property
    def effective_mode(self) -> AuthMode:
        """No mode given: ``jwt`` when a jwt section exists, else ``dev``."""
        if self.mode is not None:
            return self.mode
        return AuthMode.JWT if self.jwt is not None else AuthMode.DEV
