"""OPA bundle signatures: ``.signatures.json`` holds one JWT whose payload lists every file's hash.

What OPA documents (management-bundles, "Signing") and implements (``bundle/verify.go``,
``bundle/hash.go``), and what this module does:

* ``.signatures.json`` is ``{"signatures": ["<JWT>"]}``, exactly one JWT.
* Its payload is ``{"files": [{"name", "hash", "algorithm"}, ...], "keyid"?, "scope"?}``. A name is
  the file's bundle path without a leading ``/``; ``hash`` is hex.
* A file is hashed over its bytes, except structured documents (``data.json`` and ``.manifest``),
  which OPA hashes over a normal form so that whitespace and key order do not matter: parsed
  (numbers kept exactly as written, like Go's ``json.Number``) and written back compact, object
  keys sorted, strings escaped as Go's encoder does with HTML escaping off (U+2028 and U+2029
  escaped, a lone surrogate becomes U+FFFD). ``opa_normal_json`` produces that form.
* The verifying key: the configured ``keyid`` when set, else the JWT header's ``kid``, else the
  payload's deprecated ``keyid``; the JWT must verify with that key's algorithm.
* The payload's ``scope`` must equal the configured one (absent on both sides is equal).
* Every file but ``.signatures.json`` must be listed with a matching hash; every listed file must exist.

As in OPA, only the JWS signature is checked, not time claims (``iat``, ``exp``, ``nbf``).
Deviation: OPA also accepts the MD5 and SHA-1 file hashes; they are refused here as broken.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sidecar.errors import BundleFormatError, BundleSignatureError, ConfigError

if TYPE_CHECKING:
    from sidecar.config import BundleVerificationSettings

__all__ = ["DEFAULT_HASH", "MANIFEST_FILE", "SIGNATURES_FILE", "SIGNING_ALGORITHMS", "VerificationConfig",
           "VerificationKey", "file_hash", "opa_normal_json", "reject_constant", "sign_bundle", "signature_header",
           "verify_bundle"]

SIGNATURES_FILE = ".signatures.json"
MANIFEST_FILE = ".manifest"
SIGNING_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                      "ES256", "ES384", "ES512", "HS256", "HS384", "HS512")
DEFAULT_HASH = "SHA-256"
_HASHES = {"SHA-224": "sha224", "SHA-256": "sha256", "SHA-384": "sha384", "SHA-512": "sha512",
           "SHA-512-224": "sha512_224", "SHA-512-256": "sha512_256"}
_STRUCTURED = frozenset({"data.json", MANIFEST_FILE})
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_SETTINGS_KEY = "policy.bundle.verification.keys"


# --- file hashes --------------------------------------------------------------------------------------


class _Number(str):
    """A JSON number kept as written, as Go's ``json.Number`` keeps it."""


def reject_constant(name: str) -> None:
    """``json.loads``' ``parse_constant``: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not JSON")


def opa_normal_json(content: bytes) -> bytes:
    """JSON ``content`` in OPA's signing form; ``ValueError`` if it is not JSON."""
    try:
        value = json.loads(content.decode("utf-8-sig"), parse_int=_Number, parse_float=_Number,
                           parse_constant=reject_constant)
        return _encode(value).encode()
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _encode(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ",".join(f"{_string(key)}:{_encode(value[key])}" for key in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_encode(item) for item in value) + "]"
    if isinstance(value, _Number):
        return str(value)
    if isinstance(value, str):
        return _string(value)
    return json.dumps(value)  # true, false, null


def _string(text: str) -> str:
    escaped = json.dumps(_LONE_SURROGATE.sub("\ufffd", text), ensure_ascii=False)
    return escaped.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def file_hash(name: str, content: bytes, algorithm: str = DEFAULT_HASH) -> str:
    """The hex digest OPA signs for the bundle file ``name`` (see the module docstring)."""
    if posixpath.basename(name) in _STRUCTURED:
        try:
            content = opa_normal_json(content)
        except ValueError as exc:
            raise BundleFormatError(f"{name}: not valid JSON: {exc}") from None
    return hashlib.new(_HASHES[algorithm], content).hexdigest()


# --- signing ------------------------------------------------------------------------------------------


def sign_bundle(files: Mapping[str, bytes], key: str | bytes, algorithm: str = "RS256",
                keyid: str | None = None, *, scope: str | None = None) -> bytes:
    """The ``.signatures.json`` signing every file in ``files`` (bundle path -> bytes) as ``opa sign`` does.

    ``key`` is a PEM private key, or the secret for HS*. Like OPA, ``keyid`` goes into the
    JWT header (``kid``) and into the deprecated ``keyid`` claim.
    """
    if algorithm not in SIGNING_ALGORITHMS:
        raise BundleSignatureError(f"unsupported signing algorithm {algorithm!r}; use one of "
                                   f"{', '.join(SIGNING_ALGORITHMS)}")
    listed = [{"name": name, "hash": file_hash(name, content), "algorithm": DEFAULT_HASH}
              for name, content in sorted(files.items()) if name != SIGNATURES_FILE]
    import jwt  # PyJWT (and cryptography) load only to sign or verify a bundle

    claims = {"keyid": keyid, "scope": scope}
    payload = {"files": listed, **{name: value for name, value in claims.items() if value}}
    try:
        token = jwt.encode(payload, key, algorithm=algorithm, headers={"kid": keyid} if keyid else None)
    except (jwt.PyJWTError, ValueError, TypeError, AttributeError) as exc:  # AttributeError: a public key
        raise BundleSignatureError(f"cannot sign with this {algorithm} key: {exc}") from None
    return json.dumps({"signatures": [token]}, indent=1).encode()


# --- verification -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerificationKey:
    """A key that verifies signatures of one algorithm (build it with ``parse``)."""

    algorithm: str
    key: Any

    @classmethod
    def parse(cls, algorithm: str, material: str | bytes) -> VerificationKey:
        """A PEM public or private key (RS*, PS*, ES*) or a secret (HS*); ``ValueError`` saying what is wrong."""
        if algorithm not in SIGNING_ALGORITHMS:
            raise ValueError(f"unsupported algorithm {algorithm!r}; use one of {', '.join(SIGNING_ALGORITHMS)}")
        import jwt

        try:
            prepared = jwt.get_algorithm_by_name(algorithm).prepare_key(material)
        except (jwt.PyJWTError, ValueError, TypeError) as exc:
            raise ValueError(f"not a usable {algorithm} key: {exc}") from None
        public = getattr(prepared, "public_key", None)  # a private key verifies through its public half
        return cls(algorithm, public() if callable(public) else prepared)


@dataclass(frozen=True)
class VerificationConfig:
    """Trusted keys by key id, and what a signature must satisfy (OPA's ``keys`` and ``signing``)."""

    keys: Mapping[str, VerificationKey]
    keyid: str | None = None  # verify with this key whatever the JWT names (OPA's ``signing.keyid``)
    scope: str | None = None
    required: bool = True  # refuse unsigned bundles

    def __post_init__(self) -> None:
        if self.keyid is not None and self.keyid not in self.keys:
            raise ValueError(f"keyid {self.keyid!r} is not one of the keys ({', '.join(sorted(self.keys))})")

    @classmethod
    def from_settings(cls, settings: BundleVerificationSettings) -> VerificationConfig:
        """Read and check the configured keys; ``ConfigError`` names the key at fault."""
        keys = {}
        for keyid, key in settings.keys.items():
            where = f"{_SETTINGS_KEY}.{keyid}"
            material = key.read_key(where)
            try:
                keys[keyid] = VerificationKey.parse(key.algorithm, material)
            except ValueError as exc:
                raise ConfigError(f"config error at {where}: {exc}") from None
        return cls(keys, keyid=settings.keyid, scope=settings.scope, required=settings.required)


def verify_bundle(files: Mapping[str, bytes], config: VerificationConfig) -> str:
    """Check the signature of ``files`` (bundle path -> bytes); return the key id that verified it."""
    token = _token(files)
    keyid = config.keyid or _named_key(token)
    key = config.keys.get(keyid)
    if key is None:
        raise BundleSignatureError(f"the signature names key {keyid!r}, which is not configured")
    payload = _verified_payload(token, keyid, key)
    if (payload.get("scope") or None) != (config.scope or None):
        raise BundleSignatureError(f"signature scope {payload.get('scope')!r} does not match {config.scope!r}")
    _check_files(files, _listed(payload))
    return keyid


def signature_header(files: Mapping[str, bytes]) -> dict[str, Any] | None:
    """The unverified JWT header of a signed bundle, for display (``None`` when unsigned)."""
    if SIGNATURES_FILE not in files:
        return None
    return _unverified(_token(files))[0]


def _token(files: Mapping[str, bytes]) -> str:
    try:
        document = json.loads(files[SIGNATURES_FILE])
    except KeyError:
        raise BundleSignatureError(f"the bundle is not signed (no {SIGNATURES_FILE})") from None
    except ValueError:
        raise BundleSignatureError(f"{SIGNATURES_FILE} is not valid JSON") from None
    tokens = document.get("signatures") if isinstance(document, dict) else None
    if not isinstance(tokens, list) or len(tokens) != 1 or not isinstance(tokens[0], str):
        raise BundleSignatureError(f'{SIGNATURES_FILE} must be {{"signatures": ["<JWT>"]}} with exactly one JWT')
    return tokens[0]


def _unverified(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Header and payload, signature not checked: only to pick the key."""
    import jwt

    try:
        decoded = jwt.PyJWS().decode_complete(token, options={"verify_signature": False})
        payload = json.loads(decoded["payload"])
    except (jwt.PyJWTError, ValueError) as exc:
        raise BundleSignatureError(f"{SIGNATURES_FILE}: malformed JWT: {exc}") from None
    return decoded["header"], payload if isinstance(payload, dict) else {}


def _named_key(token: str) -> str:
    header, payload = _unverified(token)
    keyid = header.get("kid") or payload.get("keyid")
    if not isinstance(keyid, str) or not keyid:
        raise BundleSignatureError("the signature names no key (no JWT kid or keyid claim) and no keyid is configured")
    return keyid


def _verified_payload(token: str, keyid: str, key: VerificationKey) -> dict[str, Any]:
    import jwt

    try:
        payload = json.loads(jwt.PyJWS().decode_complete(token, key.key, algorithms=[key.algorithm])["payload"])
    except (jwt.PyJWTError, ValueError) as exc:
        raise BundleSignatureError(f"the signature does not verify with key {keyid!r} ({key.algorithm}): {exc}") \
            from None
    if not isinstance(payload, dict):
        raise BundleSignatureError("the signed payload is not a JSON object")
    return payload


def _listed(payload: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """``name -> (hash, algorithm)`` of the payload's ``files``."""
    entries = payload.get("files")
    if not isinstance(entries, list):
        raise BundleSignatureError("the signed payload has no files list")
    listed: dict[str, tuple[str, str]] = {}
    for entry in entries:
        name, digest, algorithm = (entry.get(field) if isinstance(entry, dict) else None
                                   for field in ("name", "hash", "algorithm"))
        if not (isinstance(name, str) and isinstance(digest, str) and isinstance(algorithm, str)):
            raise BundleSignatureError(f"malformed files entry in the signed payload: {entry!r}")
        if algorithm not in _HASHES:
            raise BundleSignatureError(f"{name}: unsupported hash algorithm {algorithm!r}")
        if listed.setdefault(name, (digest, algorithm)) != (digest, algorithm):
            raise BundleSignatureError(f"{name} is listed twice in the signed payload")
    return listed


def _check_files(files: Mapping[str, bytes], listed: dict[str, tuple[str, str]]) -> None:
    present = set(files) - {SIGNATURES_FILE}
    if unsigned := sorted(present - set(listed)):
        raise BundleSignatureError(f"file(s) not covered by the signature: {', '.join(unsigned)}")
    if missing := sorted(set(listed) - present):
        raise BundleSignatureError(f"file(s) listed in the signature but missing from the bundle: {', '.join(missing)}")
    for name, (digest, algorithm) in sorted(listed.items()):
        if file_hash(name, files[name], algorithm) != digest.lower():
            raise BundleSignatureError(f"{name}: digest mismatch (the file changed after signing)")
