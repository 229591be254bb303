"""``toolbooth policy bundle build | inspect | verify`` on good and broken inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.config import bundled_policy_dir
from sidecar.policy.bundle import load_bundle
from sidecar.policy.bundle.archive import read_archive, write_archive
from sidecar.policy.embedded import EmbeddedEngine
from tests.support.signing_keys import key_pair

POLICY_DIR = bundled_policy_dir()


def bundle_cli(*argv: str | Path) -> int:
    return main(["policy", "bundle", *map(str, argv)])


def key_file(tmp_path: Path, algorithm: str, part: str, which: int = 0) -> Path:
    file = tmp_path / f"{algorithm}-{part}-{which}.pem"
    file.write_text(getattr(key_pair(algorithm, which), part))
    return file


@pytest.fixture
def signed(tmp_path: Path) -> Path:
    """The bundled policies, built and signed with RS256 key 0 under key id ``k1``."""
    out = tmp_path / "signed.tar.gz"
    assert bundle_cli("build", POLICY_DIR, "-o", out, "--signing-key", key_file(tmp_path, "RS256", "private"),
                      "--keyid", "k1") == 0
    return out


# --- build --------------------------------------------------------------------------------------------


def test_build_writes_a_bundle_with_the_directory_revision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b.tar.gz"
    assert bundle_cli("build", POLICY_DIR, "-o", out) == 0
    revision = EmbeddedEngine.load(POLICY_DIR).revision
    assert load_bundle(out).revision == revision
    assert capsys.readouterr().out == f"wrote {out}: revision {revision}, 5 files, unsigned\n"


def test_build_with_a_revision_and_a_signature(signed: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.tar.gz"
    key = key_file(tmp_path, "ES256", "private")
    assert bundle_cli("build", POLICY_DIR, "-o", out, "--revision", "v7", "--signing-key", key,
                      "--signing-alg", "ES256") == 0
    assert capsys.readouterr().out.endswith("revision v7, 6 files, signed (ES256)\n")
    assert bundle_cli("verify", out, "--key", key_file(tmp_path, "ES256", "public"), "--alg", "ES256") == 0


@pytest.mark.parametrize(("extra", "code", "message"), [
    (["--keyid", "k1"], 2, "--keyid and --signing-alg need --signing-key"),
    (["--signing-key", "/nonexistent/key.pem"], 2, "cannot read --signing-key /nonexistent/key.pem"),
    (["--signing-key", "PUBLIC"], 1, "cannot sign with this RS256 key"),
])
def test_build_refuses_bad_signing_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
                                         code: int, message: str) -> None:
    public = str(key_file(tmp_path, "RS256", "public"))
    extra = [public if flag == "PUBLIC" else flag for flag in extra]
    assert bundle_cli("build", POLICY_DIR, "-o", tmp_path / "b.tar.gz", *extra) == code
    assert message in capsys.readouterr().err
    assert not (tmp_path / "b.tar.gz").exists()


def test_build_refuses_policies_that_do_not_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "authz.rego").write_text("package toolbooth.authz\n\ndecision := {\n")
    assert bundle_cli("build", tmp_path, "-o", tmp_path / "b.tar.gz") == 1
    assert "authz.rego" in capsys.readouterr().err


# --- inspect ------------------------------------------------------------------------------------------


def test_inspect_prints_revision_roots_files_and_signature(signed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert bundle_cli("inspect", signed) == 0
    text = capsys.readouterr().out
    assert f"revision  {EmbeddedEngine.load(POLICY_DIR).revision} (from the manifest)" in text
    assert "roots     'toolbooth'" in text
    assert "signed    yes (RS256, key id k1; not verified here)" in text
    for path, content in read_archive(signed.read_bytes()).items():
        assert any(line.endswith(f"  {path}") and line.split()[0] == str(len(content)) for line in text.splitlines())


def test_inspect_as_json(signed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert bundle_cli("inspect", signed, "--output", "json") == 0
    document = json.loads(capsys.readouterr().out)
    assert document["roots"] == ["toolbooth"] and document["revision_from"] == "manifest"
    assert document["signed"] and document["signature"] == {"algorithm": "RS256", "keyid": "k1", "error": None}
    sizes = {path: len(content) for path, content in read_archive(signed.read_bytes()).items()}
    assert {file["path"]: file["size"] for file in document["files"]} == sizes
    assert all(len(file["sha256"]) == 64 for file in document["files"])


def test_inspect_an_unsigned_bundle_without_a_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "plain.tar.gz"
    file.write_bytes(write_archive({"p.rego": b"package a\n"}))
    assert bundle_cli("inspect", file) == 0
    text = capsys.readouterr().out
    assert "(from the content)" in text and "roots     ''" in text and "signed    no" in text


def test_inspect_shows_an_unreadable_signature(signed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = read_archive(signed.read_bytes())
    files[".signatures.json"] = b'{"signatures": ["not-a-jwt"]}'
    signed.write_bytes(write_archive(files))
    capsys.readouterr()
    assert bundle_cli("inspect", signed) == 0
    assert "signed    yes, unreadable: .signatures.json: malformed JWT" in capsys.readouterr().out


@pytest.mark.parametrize(("content", "message"), [(b"not a bundle", "not a gzip file"), (None, "cannot read")])
def test_inspect_a_broken_file_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None,
                                     message: str) -> None:
    file = tmp_path / "broken.tar.gz"
    if content is not None:
        file.write_bytes(content)
    assert bundle_cli("inspect", file) == 1
    assert message in capsys.readouterr().err


# --- verify -------------------------------------------------------------------------------------------


def test_verify_with_the_right_key(signed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert bundle_cli("verify", signed, "--key", key_file(tmp_path, "RS256", "public")) == 0
    assert capsys.readouterr().out.startswith("verified: revision sha256:")
    assert bundle_cli("verify", signed, "--key", key_file(tmp_path, "RS256", "public"), "--keyid", "k1") == 0


def test_verify_hmac(tmp_path: Path) -> None:
    out, secret = tmp_path / "h.tar.gz", key_file(tmp_path, "HS256", "private")
    assert bundle_cli("build", POLICY_DIR, "-o", out, "--signing-key", secret, "--signing-alg", "HS256") == 0
    assert bundle_cli("verify", out, "--key", secret, "--alg", "HS256") == 0


def tampered(signed: Path) -> Path:
    files = read_archive(signed.read_bytes())
    files["authz.rego"] += b"\n# changed\n"
    signed.write_bytes(write_archive(files))
    return signed


@pytest.mark.parametrize(("case", "message"), [
    ("wrong key", "the signature does not verify with key '"),
    ("other keyid", "the signature names key 'k1', which is not configured"),
    ("tampered", "authz.rego: digest mismatch"),
    ("unsigned", "the bundle is not signed"),
])
def test_verify_fails(signed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str,
                      message: str) -> None:
    key, extra, target = key_file(tmp_path, "RS256", "public"), [], signed
    if case == "wrong key":
        key = key_file(tmp_path, "RS256", "public", which=1)
    elif case == "other keyid":
        extra = ["--keyid", "k2"]
    elif case == "tampered":
        target = tampered(signed)
    else:
        target = tmp_path / "unsigned.tar.gz"
        assert bundle_cli("build", POLICY_DIR, "-o", target) == 0
    assert bundle_cli("verify", target, "--key", key, *extra) == 1
    assert "toolbooth: error: not verified: " in capsys.readouterr().err
    assert bundle_cli("verify", target, "--key", key, *extra, "--output", "json") == 1
    document = json.loads(capsys.readouterr().out)
    assert document["verified"] is False and message in document["error"]


@pytest.mark.parametrize(("flags", "message"), [
    (["--key", "/nonexistent/key.pem"], "cannot read --key /nonexistent/key.pem"),
    (["--key", "PUBLIC", "--alg", "HS256"], "not a usable HS256 key"),
])
def test_verify_usage_errors(signed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
                             message: str) -> None:
    flags = [str(key_file(tmp_path, "RS256", "public")) if flag == "PUBLIC" else flag for flag in flags]
    assert bundle_cli("verify", signed, *flags) == 2
    assert message in capsys.readouterr().err
