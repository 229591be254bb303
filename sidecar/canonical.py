"""Canonical JSON and the hashes over it: RFC 8785 (JCS), so that any language can recompute them.

Every hash Toolbooth computes over JSON (request hashes, preview hashes, the audit chain, the
audit masks) is over ``canonical_bytes``: the JSON Canonicalization Scheme of RFC 8785 (keys
sorted by UTF-16 code units, ECMAScript number formatting, UTF-8, no spaces). JCS has no form for
``NaN``, infinities, integers beyond ±(2^53 - 1) or lone surrogates: those raise
``CanonicalizationError`` (a ``ValueError``), which is why request validation refuses them first.

Hashes written before JCS were over Python's sorted, compact ``json.dumps`` (``sorted_json``, which is
also how the audit log records arguments: text to read, not a hash).
For strings, ``None``, booleans and integers within the safe range, keys all below U+10000 or all
above it, both give the same bytes — so the audit chain, whose events hold only such values under
ASCII keys, hashes exactly as before. Request and preview hashes may differ (floats, mixed keys):
``hash_matches`` accepts either form when comparing with a stored hash.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import rfc8785
from rfc8785 import CanonicalizationError

__all__ = [
    "MAX_SAFE_INTEGER",
    "CanonicalizationError",
    "canonical_bytes",
    "canonical_json",
    "hash_matches",
    "legacy_sha256_hex",
    "sha256_hex",
    "sorted_json",
]

MAX_SAFE_INTEGER = 2**53 - 1  # the largest integer JCS (an IEEE 754 double) represents exactly
# Made once: ``json.dumps`` with any non-default option builds a new ``JSONEncoder`` on every call.
_encode_sorted = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def canonical_bytes(value: Any) -> bytes:
    """The RFC 8785 canonical JSON of ``value``, UTF-8; ``CanonicalizationError`` if it has none.

    Most values (every audit event, most arguments) take Python's C encoder, which writes exactly the
    JCS bytes for them, at a fraction of the cost (``_python_form``); the rest take the full JCS
    encoder. ``tests/unit/test_canonical.py`` checks that both agree.
    """
    try:
        try:
            fast = _python_form(value)
        except _NeedsJcs:
            return rfc8785.dumps(value)
        return _encode_sorted(fast).encode()  # ``_python_form`` lets no NaN or infinity through
    except UnicodeEncodeError as exc:  # a lone surrogate, met while sorting or encoding
        raise CanonicalizationError(f"input contains non-UTF-8 codepoints: {exc.reason}") from None


class _NeedsJcs(Exception):
    """``value`` has something Python's encoder would write differently from JCS."""


def _python_form(value: Any) -> Any:
    """``value`` as Python's encoder writes in JCS bytes: strings, booleans, ``None``, safe integers, lists and
    objects with ASCII keys (sorting by code point is then sorting by UTF-16 unit, and Python escapes strings
    as ECMAScript does); integral floats up to 2^53 become integers (JCS writes ``2.0`` as ``2``) and other
    floats stay where Python and ECMAScript both write them positionally with the same shortest digits
    (1e-4 <= |x| < 1e16). Anything else raises ``_NeedsJcs``."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return value
        raise _NeedsJcs
    if kind is float:
        if value.is_integer():
            if abs(value) <= MAX_SAFE_INTEGER:
                return int(value)
        elif 1e-4 <= abs(value) < 1e16:
            return value
        raise _NeedsJcs
    if kind is dict:
        if not all(type(key) is str and key.isascii() for key in value):
            raise _NeedsJcs
        return {key: _python_form(child) for key, child in value.items()}
    if kind is list or kind is tuple:
        return [_python_form(child) for child in value]
    raise _NeedsJcs


def canonical_json(value: Any) -> str:
    """``canonical_bytes`` as text."""
    return canonical_bytes(value).decode()


def sha256_hex(value: Any) -> str:
    """``sha256:`` + hex digest of the canonical JSON of ``value``."""
    return "sha256:" + hashlib.sha256(canonical_bytes(value)).hexdigest()


def sorted_json(value: Any) -> str:
    """Sorted, compact JSON as Python writes it: what the audit log records (text, not a hash), and the form
    hashes were computed over before JCS (sorted keys by code point, Python number formatting)."""
    return _encode_sorted(value)


def legacy_sha256_hex(value: Any) -> str | None:
    """``sha256:`` over ``sorted_json``, or ``None`` where that form could never have been hashed."""
    try:
        return "sha256:" + hashlib.sha256(sorted_json(value).encode()).hexdigest()
    except (ValueError, TypeError):  # NaN, a lone surrogate (UnicodeEncodeError), an unserializable value
        return None


def hash_matches(value: Any, stored: str) -> bool:
    """Whether ``stored`` is the hash of ``value``, in the JCS form or the form written before it."""
    if hmac.compare_digest(sha256_hex(value).encode(), stored.encode()):
        return True
    legacy = legacy_sha256_hex(value)
    return legacy is not None and hmac.compare_digest(legacy.encode(), stored.encode())
