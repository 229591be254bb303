"""OPA bundles: build -> load round trip, revision, data placement, manifest roots, unsafe archives."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import re
import tarfile
from pathlib import Path

import pytest

from sidecar.config import bundled_policy_dir
from sidecar.errors import BundleFetchError, BundleFormatError, PolicyLoadError
from sidecar.policy import CALL_STAGES, Decision
from sidecar.policy.bundle import Manifest, build_bundle, load_bundle
from sidecar.policy.bundle import archive as archive_module
from sidecar.policy.bundle.archive import read_archive, write_archive
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.files import check_files, checked_files
from sidecar.policy.input import PolicyInput

POLICY_DIR = bundled_policy_dir()
TOOLS = [("calculate", "none", ()), ("admin_console", "none", ("admin:console",)),
         ("write_file", "internal_reversible", ("files:write",)),
         ("send_email", "external_irreversible", ("email:send",))]
ROLES = [(), ("reader",), ("developer",), ("admin",)]


def inputs() -> list[PolicyInput]:
    """Calls of several tools by several roles, in the documented input shape."""
    return [PolicyInput.of({
        "principal": {"id": "u1", "tenant": "t1", "roles": list(roles), "permissions": []},
        "tool": {"name": name, "version": "1.0.0", "side_effect": side_effect, "permissions": list(requires),
                 "plugin": "toolbooth_example"},
        "call": {"arguments": {}, "conversation_id": "c1", "idempotency_key": "k"},
        "context": {"stage": "authz", "time": "2026-11-30T15:00:00Z", "conversation_id": "c1"},
    }) for roles in ROLES for name, side_effect, requires in TOOLS]


async def decisions(engine: EmbeddedEngine) -> list[Decision]:
    return [await engine.decide(stage, item) for stage in CALL_STAGES for item in inputs()]


def directory_files() -> dict[str, bytes]:
    """The files the embedded engine loads from the bundled policies."""
    return {path: text.encode() for path, text in checked_files(POLICY_DIR).files()}


def packed(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    """A gzipped tar of hand-made members (``write_archive`` only writes regular files)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, content in members:
            tar.addfile(info, None if content is None else io.BytesIO(content))
    return buffer.getvalue()


def member(name: str, content: bytes = b"package a\n", kind: bytes = tarfile.REGTYPE,
           link: str = "") -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    if kind != tarfile.REGTYPE:
        return info, None
    info.size = len(content)
    return info, content


# --- round trip ---------------------------------------------------------------------------------------


async def test_a_built_bundle_decides_as_its_directory() -> None:
    expected = await decisions(EmbeddedEngine.load(POLICY_DIR))
    assert {decision.allow for decision in expected} == {True, False}  # the inputs exercise both outcomes
    assert await decisions(EmbeddedEngine.from_bundle(load_bundle(build_bundle(POLICY_DIR)))) == expected


async def test_a_bundle_loads_off_the_event_loop() -> None:
    archive = build_bundle(POLICY_DIR)
    files = await asyncio.to_thread(lambda: check_files(load_bundle(archive).policy_files()))
    assert await decisions(EmbeddedEngine(files)) == await decisions(EmbeddedEngine.load(POLICY_DIR))


def test_round_trip_keeps_modules_data_and_revision() -> None:
    directory = checked_files(POLICY_DIR)
    bundle = load_bundle(build_bundle(POLICY_DIR))
    assert bundle.revision == directory.revision() == EmbeddedEngine.from_bundle(bundle).revision
    assert bundle.manifest == Manifest(revision=directory.revision(), roots=("toolbooth",))
    assert bundle.modules == tuple((path, text) for path, text in directory.files() if path.endswith(".rego"))
    assert bundle.data == json.loads((POLICY_DIR / "data.json").read_text())
    assert set(bundle.files) == {".manifest", *dict(directory.files())}
    assert not bundle.signed and bundle.keyid is None


def test_a_given_revision_is_the_manifest_revision() -> None:
    bundle = load_bundle(build_bundle(POLICY_DIR, revision="2026-11-30.1"))
    assert bundle.revision == bundle.manifest.revision == "2026-11-30.1"
    assert EmbeddedEngine.from_bundle(bundle).revision == "2026-11-30.1"


def test_building_is_reproducible() -> None:
    assert build_bundle(POLICY_DIR) == build_bundle(POLICY_DIR)


def test_without_a_manifest_revision_the_revision_is_the_content_hash() -> None:
    files = directory_files()
    assert load_bundle(write_archive(files)).revision == EmbeddedEngine.load(POLICY_DIR).revision
    files["authz.rego"] += b"\n"
    changed = load_bundle(write_archive(files)).revision
    assert changed.startswith("sha256:") and changed != EmbeddedEngine.load(POLICY_DIR).revision


def test_policies_that_do_not_load_are_not_packed(tmp_path: Path) -> None:
    (tmp_path / "authz.rego").write_text("package toolbooth.authz\n\ndecision := {\n")
    with pytest.raises(PolicyLoadError, match=r"authz\.rego"):
        build_bundle(tmp_path)


def test_loads_from_a_file(tmp_path: Path) -> None:
    file = tmp_path / "bundle.tar.gz"
    file.write_bytes(build_bundle(POLICY_DIR))
    assert load_bundle(file).source == str(file)
    with pytest.raises(BundleFetchError, match="cannot read"):
        load_bundle(tmp_path / "missing.tar.gz")


def test_a_bundle_without_the_toolbooth_packages_does_not_make_an_engine() -> None:
    bundle = load_bundle(write_archive({"p.rego": b"package other\n\nx := 1\n"}))
    with pytest.raises(PolicyLoadError, match="does not define package"):
        EmbeddedEngine.from_bundle(bundle)


# --- data placement -----------------------------------------------------------------------------------


def test_each_data_json_lands_at_its_directory() -> None:
    files = {"data.json": b'{"a": {"x": 1}}', "a/b/data.json": b'{"y": 2}', "/c/data.json": b"[1, 2]",
             "p.rego": b"package a\n"}
    assert load_bundle(write_archive(files)).data == {"a": {"x": 1, "b": {"y": 2}}, "c": [1, 2]}


async def test_data_under_its_package_directory_decides_like_root_data() -> None:
    files = {path: content for path, content in directory_files().items() if path != "data.json"}
    files["toolbooth/data.json"] = json.dumps(json.loads((POLICY_DIR / "data.json").read_text())["toolbooth"]).encode()
    bundle = load_bundle(write_archive(files))
    assert await decisions(EmbeddedEngine.from_bundle(bundle)) == await decisions(EmbeddedEngine.load(POLICY_DIR))


@pytest.mark.parametrize(("files", "message"), [
    ({"data.json": b'{"a": 1}', "a/data.json": b'{"b": 2}'}, "a/data.json: data at /a conflicts"),
    ({"data.json": b"[1]"}, "data.json: a data.json at the bundle root must hold a JSON object"),
    ({"x/data.json": b"{"}, "x/data.json: not valid JSON"),
    ({"data.json": b'{"a": NaN}'}, "data.json: not valid JSON"),
])
def test_bad_data_is_refused_naming_the_file(files: dict[str, bytes], message: str) -> None:
    with pytest.raises(BundleFormatError, match=re.escape(message)):
        load_bundle(write_archive(files))


# --- manifest -----------------------------------------------------------------------------------------


def with_manifest(manifest: object) -> bytes:
    return write_archive({".manifest": json.dumps(manifest).encode(), "a/p.rego": b"package a.b\n",
                          "data.json": b'{"a": {"x": 1}}'})


def test_manifest_fields_are_read() -> None:
    bundle = load_bundle(with_manifest({"revision": "r1", "roots": ["/a/"], "metadata": {"team": "sec"}}))
    assert bundle.manifest == Manifest("r1", ("a",), {"team": "sec"})
    assert bundle.revision == "r1"


@pytest.mark.parametrize(("manifest", "message"), [
    ({"roots": ["z"]}, "a/p.rego: package a.b is outside the manifest roots ['z']"),
    ({"roots": ["a/b"]}, "data at /a/x is outside the manifest roots ['a/b']"),
    ({"roots": ["a", "a/b"]}, ".manifest: roots 'a' and 'a/b' overlap"),
    ({"revision": 7}, ".manifest: revision must be a string"),
    ({"roots": "a"}, ".manifest: roots must be a list of strings"),
    ({"metadata": []}, ".manifest: metadata must be an object"),
    ({"rego_version": 0}, ".manifest: only Rego v1 is supported"),
    ({"file_rego_versions": {"*.rego": 0}}, ".manifest: only Rego v1 is supported"),
    (["revision"], ".manifest: must be a JSON object"),
])
def test_bad_manifests_are_refused(manifest: object, message: str) -> None:
    with pytest.raises(BundleFormatError, match=re.escape(message)):
        load_bundle(with_manifest(manifest))


@pytest.mark.parametrize(("path", "message"), [
    ("data.yaml", "data.yaml: YAML data files are not supported"),
    ("x/policy.wasm", "x/policy.wasm: Wasm modules are not supported"),
    ("patch.json", "patch.json: delta bundles (patch.json) are not supported"),
    ("x/.manifest", "x/.manifest: .manifest is only allowed at the bundle root"),
])
def test_what_the_embedded_engine_cannot_honour_is_refused(path: str, message: str) -> None:
    with pytest.raises(BundleFormatError, match=re.escape(message)):
        load_bundle(write_archive({path: b"{}", "p.rego": b"package a\n"}))


# --- archive safety -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../evil.rego", "a/../../evil.rego", "//etc/evil.rego", "a//b.rego",
                                  "a/./b.rego", "./../evil.rego"])
def test_unsafe_paths_are_refused(name: str) -> None:
    with pytest.raises(BundleFormatError, match=re.escape(f"bundle member {name!r} has an unsafe path")):
        load_bundle(packed(member(name)))


@pytest.mark.parametrize("name", ["/p.rego", "./p.rego"])
def test_a_root_prefix_is_the_bundle_root(name: str) -> None:
    assert load_bundle(packed(member("./", kind=tarfile.DIRTYPE), member(name))).modules == (("p.rego", "package a\n"),)


@pytest.mark.parametrize(("kind", "link", "what"), [
    (tarfile.SYMTYPE, "/etc/passwd", "a symbolic link"),
    (tarfile.LNKTYPE, "p.rego", "a hard link"),
    (tarfile.CHRTYPE, "", "a character device"),
    (tarfile.BLKTYPE, "", "a block device"),
    (tarfile.FIFOTYPE, "", "a FIFO"),
])
def test_links_and_devices_are_refused(kind: bytes, link: str, what: str) -> None:
    with pytest.raises(BundleFormatError, match=re.escape(f"bundle member 'x.rego' is {what}")):
        load_bundle(packed(member("p.rego"), member("x.rego", kind=kind, link=link)))


def test_a_member_twice_is_refused() -> None:
    with pytest.raises(BundleFormatError, match=r"'/p\.rego' appears twice"):
        load_bundle(packed(member("p.rego"), member("/p.rego")))


def test_an_oversized_member_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archive_module, "MAX_FILE_BYTES", 8)
    with pytest.raises(BundleFormatError, match=r"'p\.rego' is larger than 8 bytes"):
        load_bundle(packed(member("p.rego")))


def test_a_gzip_bomb_stops_at_the_bundle_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archive_module, "MAX_BUNDLE_BYTES", 64 * 1024)
    bomb = packed(member("p.rego", b"package a\n" + b" " * 1024 * 1024))
    assert len(bomb) < 64 * 1024
    with pytest.raises(BundleFormatError, match="larger than 65536 bytes uncompressed"):
        load_bundle(bomb)


def test_too_many_members_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archive_module, "MAX_FILES", 2)
    with pytest.raises(BundleFormatError, match="more than 2 members"):
        read_archive(write_archive({f"{n}.rego": b"package a\n" for n in "abc"}))


@pytest.mark.parametrize(("files", "message"), [
    ({"p.rego": b"package a\n# caf\xe9\n"}, "p.rego: not UTF-8 text"),
    ({"p.rego": b"package a\n\nx if {\n"}, "p.rego: "),
])
def test_rego_that_cannot_be_read_is_refused_naming_the_file(files: dict[str, bytes], message: str) -> None:
    with pytest.raises(BundleFormatError, match=re.escape(message)):
        load_bundle(write_archive(files))


@pytest.mark.parametrize(("archive", "message"), [
    (b"not a bundle", "not a gzip file"),
    (write_archive({"p.rego": b"package a\n"})[:-12], "not a single complete gzip stream"),
    (write_archive({"p.rego": b"package a\n"}) * 2, "not a single complete gzip stream"),
    (gzip.compress(b"plain text, not a tar archive"), "not a tar archive"),
])
def test_what_is_not_a_gzipped_tarball_is_refused(archive: bytes, message: str) -> None:
    with pytest.raises(BundleFormatError, match=message):
        load_bundle(archive)
