"""``policy``: which engine decides on which policies (a directory, a bundle, an OPA server); reloading, caching."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, FilePath, SecretStr, field_validator, model_validator

from sidecar.config.base import KeySource, Section, bundled_policy_dir

__all__ = ["BundleKeySettings", "BundleSettings", "BundleVerificationSettings", "DecisionCacheSettings", "OpaSettings",
           "OpaTlsSettings", "PolicyEngineKind", "PolicySettings"]


class PolicyEngineKind(StrEnum):
    EMBEDDED = "embedded"
    OPA = "opa"


class OpaTlsSettings(Section):
    """Trust and client certificate for an ``https`` OPA; each file must exist at start."""

    ca_file: FilePath | None = None
    cert_file: FilePath | None = None
    key_file: FilePath | None = None

    @model_validator(mode="after")
    def _key_needs_cert(self) -> OpaTlsSettings:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("'key_file' needs 'cert_file'")
        return self


class OpaSettings(Section):
    """An OPA server evaluating the policies over its REST API."""

    url: str
    token: SecretStr | None = None
    tls: OpaTlsSettings | None = None
    timeout_seconds: float = Field(default=0.5, gt=0)
    upload_policies: bool = True

    @field_validator("url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.port == 0:
            raise ValueError(f"{value!r}: expected http(s)://HOST[:PORT]")
        if parts.path.strip("/") or parts.query or parts.fragment:
            raise ValueError(f"{value!r}: the URL of the server only, without a path (the engine adds /v1/...)")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _tls_needs_https(self) -> OpaSettings:
        if self.tls is not None and not self.url.startswith("https:"):
            raise ValueError("'tls' needs an https:// url")
        return self


class DecisionCacheSettings(Section):
    """Recent decisions answered from memory (``sidecar.policy.cache``)."""

    enabled: bool = True
    ttl_seconds: float = Field(default=5.0, gt=0)
    max_entries: int = Field(default=10_000, gt=0)


class BundleKeySettings(KeySource):
    """A key trusted to sign bundles: a PEM public key (RS*, PS*, ES*) or an HMAC secret (HS*)."""

    algorithm: str = Field(default="RS256", pattern="^(RS|PS|ES|HS)(256|384|512)$")


class BundleVerificationSettings(Section):
    """Signature verification of bundles, as OPA's ``keys`` and ``bundles.*.signing``."""

    keys: dict[str, BundleKeySettings] = Field(min_length=1)
    keyid: str | None = None  # verify with this key whatever the signature names
    scope: str | None = None
    required: bool = True  # refuse unsigned bundles

    @model_validator(mode="after")
    def _keyid_is_a_key(self) -> BundleVerificationSettings:
        if self.keyid is not None and self.keyid not in self.keys:
            raise ValueError(f"keyid {self.keyid!r} is not one of the keys ({', '.join(sorted(self.keys))})")
        return self


class BundleSettings(Section):
    """An OPA bundle as the policy source, instead of ``policy.path``: a file, or a URL polled with ETag."""

    url: str | None = Field(default=None, pattern="^https?://[^/]")
    file: Path | None = None
    polling_seconds: float = Field(default=60.0, gt=0)
    timeout_seconds: float = Field(default=10.0, gt=0)
    headers: dict[str, str] = Field(default_factory=dict)  # e.g. Authorization for a private bundle server
    verification: BundleVerificationSettings | None = None

    @model_validator(mode="after")
    def _one_location(self) -> BundleSettings:
        if (self.url is None) == (self.file is None):
            raise ValueError("exactly one of 'url' or 'file' must be set")
        return self


class PolicySettings(Section):
    engine: PolicyEngineKind = PolicyEngineKind.EMBEDDED
    path: Path = Field(default_factory=bundled_policy_dir)
    opa: OpaSettings | None = None
    bundle: BundleSettings | None = None
    reload_interval_seconds: float = Field(default=2.0, ge=0)  # 0: never reload
    reload_requires_tests: bool = False
    cache: DecisionCacheSettings = Field(default_factory=DecisionCacheSettings)

    @model_validator(mode="after")
    def _bundle_fits(self) -> PolicySettings:
        if self.bundle is not None and self.engine is PolicyEngineKind.OPA:
            raise ValueError("'bundle' is for the embedded engine; let OPA load bundles itself "
                             "(opa.upload_policies: false)")
        if self.bundle is not None and self.reload_requires_tests:
            raise ValueError("'reload_requires_tests' runs the tests of policy.path; a bundle carries no tests "
                             "(run `toolbooth policy test` before `toolbooth policy bundle build`)")
        return self

    @model_validator(mode="after")
    def _opa_needs_server(self) -> PolicySettings:
        if self.engine is PolicyEngineKind.OPA and self.opa is None:
            raise ValueError("engine 'opa' needs a 'policy.opa' section with the server's url")
        return self
