"""Bundle-signing keys for tests: PEM key pairs (made once per run) and HMAC secrets."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

ALGORITHMS = ("RS256", "ES256", "HS256")
_SECRETS = ("a-test-secret-of-at-least-32-bytes!!", "another-secret-of-at-least-32-bytes!")


@dataclass(frozen=True)
class KeyPair:
    """``private`` signs, ``public`` verifies (for HS256 both are the secret)."""

    algorithm: str
    private: str
    public: str


def key_pair(algorithm: str, which: int = 0) -> KeyPair:
    """Key number ``which`` (0 or 1) for RS256, ES256 or HS256; the same one for the whole run."""
    return _key_pair(algorithm, which)


@functools.cache
def _key_pair(algorithm: str, which: int) -> KeyPair:
    if algorithm == "HS256":
        return KeyPair(algorithm, _SECRETS[which], _SECRETS[which])
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048) if algorithm == "RS256" \
        else ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return KeyPair(algorithm, private, public)
