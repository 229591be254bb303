"""Bundle signatures as OPA makes and checks them; the keys of ``policy.bundle.verification``."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import jwt
import pytest

from sidecar.config import bundled_policy_dir, parse_settings
from sidecar.errors import BundleFormatError, BundleSignatureError, ConfigError
from sidecar.policy.bundle import build_bundle, load_bundle
from sidecar.policy.bundle.archive import read_archive, write_archive
from sidecar.policy.bundle.signing import (
    VerificationConfig,
    VerificationKey,
    file_hash,
    opa_normal_json,
    sign_bundle,
)
from tests.support.signing_keys import ALGORITHMS, key_pair

POLICY_DIR = bundled_policy_dir()


def signed_files(algorithm: str = "RS256", keyid: str | None = "k1", scope: str | None = None) -> dict[str, bytes]:
    """The members of a bundle of the bundled policies, signed with key 0 of ``algorithm``."""
    files = read_archive(build_bundle(POLICY_DIR))
    return {**files, ".signatures.json": sign_bundle(files, key_pair(algorithm).private, algorithm, keyid, scope=scope)}


def trusting(algorithm: str = "RS256", which: int = 0, name: str = "k1", **options: Any) -> VerificationConfig:
    """A verification config holding one public key under the key id ``name``."""
    return VerificationConfig({name: VerificationKey.parse(algorithm, key_pair(algorithm, which).public)}, **options)


def refused(files: dict[str, bytes], config: VerificationConfig | None, message: str) -> None:
    with pytest.raises(BundleSignatureError, match=re.escape(message)):
        load_bundle(write_archive(files), config)


# --- accepted -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_valid_signature_verifies(algorithm: str) -> None:
    bundle = load_bundle(write_archive(signed_files(algorithm)), trusting(algorithm))
    assert bundle.signed and bundle.keyid == "k1"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_build_signs_with_the_given_key(algorithm: str) -> None:
    archive = build_bundle(POLICY_DIR, signing_key=key_pair(algorithm).private, signing_algorithm=algorithm,
                           keyid="k1")
    assert load_bundle(archive, trusting(algorithm)).keyid == "k1"


def test_a_private_key_verifies_through_its_public_half() -> None:
    config = VerificationConfig({"k1": VerificationKey.parse("RS256", key_pair("RS256").private)})
    assert load_bundle(write_archive(signed_files()), config).keyid == "k1"


def test_a_configured_keyid_verifies_a_signature_that_names_no_key() -> None:
    config = trusting(name="main", keyid="main")
    assert load_bundle(write_archive(signed_files(keyid=None)), config).keyid == "main"


def test_the_deprecated_keyid_claim_names_the_key() -> None:
    files = signed_files(keyid=None)
    payload = jwt.decode(json.loads(files[".signatures.json"])["signatures"][0], options={"verify_signature": False})
    token = jwt.encode({**payload, "keyid": "k1"}, key_pair("RS256").private, algorithm="RS256")
    files[".signatures.json"] = json.dumps({"signatures": [token]}).encode()
    assert load_bundle(write_archive(files), trusting()).keyid == "k1"


def test_json_files_are_signed_in_normal_form() -> None:
    files = signed_files()
    files["data.json"] = json.dumps(json.loads(files["data.json"]), indent=8, sort_keys=True).encode()
    assert load_bundle(write_archive(files), trusting()).keyid == "k1"


def test_an_unsigned_bundle_loads_when_verification_is_optional() -> None:
    bundle = load_bundle(build_bundle(POLICY_DIR), trusting(required=False))
    assert not bundle.signed and bundle.keyid is None


def test_a_matching_scope_verifies() -> None:
    assert load_bundle(write_archive(signed_files(scope="write")), trusting(scope="write")).keyid == "k1"


# --- refused ------------------------------------------------------------------------------------------


def test_an_unsigned_bundle_is_refused_when_verification_is_required() -> None:
    refused(read_archive(build_bundle(POLICY_DIR)), trusting(), "the bundle is not signed (no .signatures.json)")


def test_a_signed_bundle_is_refused_without_keys() -> None:
    refused(signed_files(), None, "the bundle is signed but no verification key is configured")


def test_skipping_verification_loads_a_signed_bundle() -> None:
    assert load_bundle(write_archive(signed_files()), skip_verification=True).keyid is None


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_wrong_key_is_refused(algorithm: str) -> None:
    refused(signed_files(algorithm), trusting(algorithm, which=1), "the signature does not verify with key 'k1'")


def test_a_key_of_another_algorithm_is_refused() -> None:
    refused(signed_files("ES256"), trusting("RS256"), "does not verify with key 'k1' (RS256)")


def test_a_key_that_is_not_configured_is_refused() -> None:
    refused(signed_files(), trusting(name="k2"), "the signature names key 'k1', which is not configured")


def test_a_signature_naming_no_key_is_refused_without_a_configured_keyid() -> None:
    refused(signed_files(keyid=None), trusting(), "the signature names no key")


def test_a_file_changed_after_signing_is_refused() -> None:
    files = signed_files()
    files["authz.rego"] += b"\n# allow everything\n"
    refused(files, trusting(), "authz.rego: digest mismatch")


def test_a_data_value_changed_after_signing_is_refused() -> None:
    files = signed_files()
    data = json.loads(files["data.json"])
    data["toolbooth"]["role_permissions"]["reader"].append("admin:console")
    files["data.json"] = json.dumps(data).encode()
    refused(files, trusting(), "data.json: digest mismatch")


def test_a_file_added_after_signing_is_refused() -> None:
    files = signed_files()
    files["toolbooth/override.rego"] = b"package toolbooth.override\n"
    refused(files, trusting(), "file(s) not covered by the signature: toolbooth/override.rego")


def test_a_listed_file_that_is_missing_is_refused() -> None:
    files = signed_files()
    del files["approval.rego"]
    refused(files, trusting(), "file(s) listed in the signature but missing from the bundle: approval.rego")


@pytest.mark.parametrize(("signed", "expected"), [("write", None), (None, "read"), ("write", "read")])
def test_a_scope_mismatch_is_refused(signed: str | None, expected: str | None) -> None:
    refused(signed_files(scope=signed), trusting(scope=expected), "signature scope")


@pytest.mark.parametrize(("document", "message"), [
    (b"{", ".signatures.json is not valid JSON"),
    (b"{}", "exactly one JWT"),
    (b'{"signatures": ["a.b.c", "d.e.f"]}', "exactly one JWT"),
    (b'{"signatures": ["not-a-jwt"]}', ".signatures.json: malformed JWT"),
])
def test_a_malformed_signatures_file_is_refused(document: bytes, message: str) -> None:
    files = signed_files()
    files[".signatures.json"] = document
    refused(files, trusting(), message)


@pytest.mark.parametrize(("listed", "message"), [
    ([{"name": "authz.rego", "hash": "00", "algorithm": "MD5"}], "authz.rego: unsupported hash algorithm 'MD5'"),
    ([{"name": "authz.rego"}], "malformed files entry"),
    ("authz.rego", "the signed payload has no files list"),
])
def test_a_malformed_payload_is_refused(listed: object, message: str) -> None:
    files = signed_files()
    token = jwt.encode({"files": listed}, key_pair("RS256").private, algorithm="RS256", headers={"kid": "k1"})
    files[".signatures.json"] = json.dumps({"signatures": [token]}).encode()
    refused(files, trusting(), message)


# --- hashes and keys ----------------------------------------------------------------------------------


def test_opa_normal_json_is_compact_sorted_and_keeps_numbers_as_written() -> None:
    text = '{"b": [1.0, 1e3, -0, 12345678901234567890.5], "a": {"y": null, "x": true}, "é": "<&>"}'
    expected = '{"a":{"x":true,"y":null},"b":[1.0,1e3,-0,12345678901234567890.5],"é":"<&>"}'
    assert opa_normal_json(text.encode()) == expected.encode()


def test_opa_normal_json_matches_opas_own_test_vector() -> None:
    # OPA's bundle/verify_test.go (TestVerifyBundleFile): MD5 of this .manifest in OPA's normal form.
    normal = opa_normal_json(b'{"revision": "quickbrownfaux"}')
    assert hashlib.md5(normal).hexdigest() == "a005c38a509dc2d5a7407b9494efb2ad"


def test_opa_normal_json_escapes_strings_as_go_does() -> None:
    assert opa_normal_json(b'"\\u2028\\u2029\\n\\u0001\\b\\f\\t\\"\\\\/\\ud800"') == \
        '"\\u2028\\u2029\\n\\u0001\\b\\f\\t\\"\\\\/\ufffd"'.encode()


def test_only_structured_files_are_hashed_in_normal_form() -> None:
    assert file_hash("x/data.json", b'{"b":1, "a":2}') == file_hash("x/data.json", b'{"a":2,"b":1}')
    assert file_hash("x.rego", b"package a\n") != file_hash("x.rego", b"package  a\n")
    with pytest.raises(BundleFormatError, match=r"data\.json: not valid JSON"):
        file_hash("data.json", b"{")


@pytest.mark.parametrize(("algorithm", "material", "message"), [
    ("HS256", key_pair("RS256").public, "not a usable HS256 key"),
    ("ES256", key_pair("RS256").public, "not a usable ES256 key"),
    ("RS256", "not a key", "not a usable RS256 key"),
    ("none", "secret", "unsupported algorithm 'none'"),
])
def test_unusable_verification_keys_are_refused(algorithm: str, material: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        VerificationKey.parse(algorithm, material)


def test_signing_with_a_public_key_is_refused() -> None:
    with pytest.raises(BundleSignatureError, match="cannot sign with this RS256 key"):
        sign_bundle({"p.rego": b"package a\n"}, key_pair("RS256").public)


# --- configuration ------------------------------------------------------------------------------------


def bundle_settings(**bundle: Any) -> Any:
    return parse_settings({"policy": {"bundle": bundle}}).policy.bundle


def test_configured_keys_verify(tmp_path: Path) -> None:
    (tmp_path / "k1.pem").write_text(key_pair("ES256").public)
    settings = bundle_settings(url="https://bundles.example/toolbooth.tar.gz", verification={
        "keys": {"k1": {"algorithm": "ES256", "key_file": str(tmp_path / "k1.pem")}}})
    config = VerificationConfig.from_settings(settings.verification)
    assert load_bundle(write_archive(signed_files("ES256")), config).keyid == "k1"
    assert settings.polling_seconds > 0 and config.required


@pytest.mark.parametrize(("bundle", "message"), [
    ({"url": "https://b.example/b.tar.gz", "file": "b.tar.gz"}, "config error at policy.bundle: exactly one of"),
    ({}, "config error at policy.bundle: exactly one of 'url' or 'file'"),
    ({"url": "ftp://b.example/b.tar.gz"}, "config error at policy.bundle.url"),
    ({"file": "b.tar.gz", "verification": {"keys": {"k1": {"algorithm": "none", "key": "x"}}}},
     "config error at policy.bundle.verification.keys.k1.algorithm"),
    ({"file": "b.tar.gz", "verification": {"keys": {"k1": {"key": "x", "key_file": "x"}}}},
     "config error at policy.bundle.verification.keys.k1: exactly one of 'key' or 'key_file'"),
    ({"file": "b.tar.gz", "verification": {"keys": {"k1": {"key": "x"}}, "keyid": "k2"}},
     "config error at policy.bundle.verification: keyid 'k2' is not one of the keys (k1)"),
    ({"file": "b.tar.gz", "verification": {"keys": {}}}, "config error at policy.bundle.verification.keys"),
])
def test_bundle_settings_errors_name_the_key(bundle: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        bundle_settings(**bundle)


@pytest.mark.parametrize(("key", "message"), [
    ({"key_file": "/nonexistent/k1.pem"}, "config error at policy.bundle.verification.keys.k1.key_file: cannot read"),
    ({"key": "not a key"}, "config error at policy.bundle.verification.keys.k1: not a usable RS256 key"),
])
def test_unusable_configured_keys_are_named(key: dict[str, str], message: str) -> None:
    settings = bundle_settings(file="b.tar.gz", verification={"keys": {"k1": key}})
    with pytest.raises(ConfigError, match=re.escape(message)):
        VerificationConfig.from_settings(settings.verification)
