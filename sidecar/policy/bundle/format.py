"""The OPA bundle format: load a bundle (bytes or a file), verify its signature, build one from a policy directory.

The format, as OPA documents it ("Bundle File Format"): a gzipped tarball holding

* ``.manifest`` (optional): ``{"revision": str, "roots": [str], "metadata": {...}}``; roots
  default to ``[""]`` (everything);
* ``*.rego`` files at any path: the policy modules;
* ``data.json`` files, each placed in ``data`` by its directory: ``/data.json`` is ``data``
  itself (an object), ``/toolbooth/data.json`` is ``data.toolbooth``; they are merged, and a
  conflict between two of them is an error;
* ``.signatures.json`` (optional): see ``sidecar.policy.bundle.signing``.

As in OPA, roots may not overlap and every module's package and every data path must lie
under a root. Other files are kept (and must be signed) but not loaded. What the embedded
engine cannot honour is refused rather than ignored: YAML data files, Wasm and plan
modules, delta bundles (``patch.json``) and Rego v0 (``rego_version: 0``).

The revision is the manifest's ``revision``; without one, ``sha256:`` and 16 hex digits over
every file's path and bytes but the signature, hashed as the embedded engine hashes a policy
directory (a bundle holding exactly a directory's files has the directory's revision).

``build_bundle`` maps a policy directory one to one: the files the embedded engine loads keep
their relative paths (its root ``data.json``, ``{"toolbooth": ...}``, stays at the root and is
``data``), the manifest's revision defaults to the directory's revision and its roots are the
top-level names its packages and data use. Loading the result therefore gives the same
modules, data, revision and decisions as loading the directory.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.errors import BundleFetchError, BundleFormatError, BundleSignatureError
from sidecar.policy._regorus import regorus
from sidecar.policy.bundle.archive import MAX_BUNDLE_BYTES, read_archive, write_archive
from sidecar.policy.bundle.signing import (
    MANIFEST_FILE,
    SIGNATURES_FILE,
    VerificationConfig,
    reject_constant,
    sign_bundle,
    verify_bundle,
)
from sidecar.policy.files import DATA_FILE, PolicyFiles, checked_files, clean_regorus_error, content_revision

__all__ = ["Bundle", "Manifest", "build_bundle", "load_bundle"]

_MANIFEST_DEFAULTS: tuple[tuple[str, object], ...] = (("revision", ""), ("roots", [""]), ("metadata", {}))
_UNSUPPORTED = {"data.yaml": "YAML data files", "data.yml": "YAML data files", "policy.wasm": "Wasm modules",
                "plan.json": "plan modules", "patch.json": "delta bundles (patch.json)"}


@dataclass(frozen=True)
class Manifest:
    """The bundle's ``.manifest`` (defaults when it has none)."""

    revision: str = ""
    roots: tuple[str, ...] = ("",)
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Bundle:
    """A loaded bundle. ``keyid`` names the key that verified its signature (``None``: not verified)."""

    source: str
    files: Mapping[str, bytes]
    manifest: Manifest
    modules: tuple[tuple[str, str], ...]
    data: Mapping[str, Any]
    revision: str
    keyid: str | None = None

    @property
    def signed(self) -> bool:
        """Whether the bundle carries a ``.signatures.json``."""
        return SIGNATURES_FILE in self.files

    def policy_files(self) -> PolicyFiles:
        """The bundle's modules and merged data as a policy set, with the bundle's revision.

        Check them off the event loop with ``check_files``, as ``checked_files`` does a directory.
        """
        data = json.dumps(self.data) if self.data else None
        return PolicyFiles(Path(self.source), self.modules, data, self.revision)


def load_bundle(source: bytes | Path, verification: VerificationConfig | None = None, *,
                skip_verification: bool = False, name: str | None = None) -> Bundle:
    """Read, check and (unless ``skip_verification``) verify a bundle.

    Signatures as OPA treats them: with ``verification``, a signed bundle must verify and an
    unsigned one is refused when ``verification.required``; without it, an unsigned bundle
    loads and a signed one is refused (there is no key to check it with). ``name`` labels the
    bundle in messages (default: the file's path, or ``bundle``).
    """
    label, archive = _read_source(source)
    files = read_archive(archive)
    _refuse_unsupported(files)
    keyid = None if skip_verification else _check_signature(files, verification)
    manifest = _manifest(files)
    modules = tuple((path, _text(path, files[path])) for path in sorted(files) if path.endswith(".rego"))
    data = _data(files)
    _check_roots(manifest.roots, _packages(modules), data)
    revision = manifest.revision or content_revision(sorted(i for i in files.items() if i[0] != SIGNATURES_FILE))
    return Bundle(name or label, files, manifest, modules, data, revision, keyid)


def build_bundle(directory: Path, *, revision: str | None = None, signing_key: str | bytes | None = None,
                 signing_algorithm: str = "RS256", keyid: str | None = None) -> bytes:
    """A bundle of the policy directory (see the module docstring), signed when ``signing_key`` is given.

    The directory is compiled and checked as the embedded engine loads it, so a set that does
    not compile is never packed; the result is loaded back before it is returned.
    """
    policy = checked_files(directory)
    content = {path: text.encode() for path, text in policy.files()}
    manifest = {"revision": revision or policy.revision(), "roots": _top_level_names(content)}
    files = {MANIFEST_FILE: json.dumps(manifest, indent=2).encode() + b"\n", **content}
    if signing_key is not None:
        files[SIGNATURES_FILE] = sign_bundle(files, signing_key, signing_algorithm, keyid)
    archive = write_archive(files)
    load_bundle(archive, skip_verification=True)
    return archive


def _read_source(source: bytes | Path) -> tuple[str, bytes]:
    if isinstance(source, bytes):
        return "bundle", source
    try:
        if source.stat().st_size > MAX_BUNDLE_BYTES:
            raise BundleFormatError(f"{source} is larger than {MAX_BUNDLE_BYTES} bytes")
        return str(source), source.read_bytes()
    except OSError as exc:
        raise BundleFetchError(f"cannot read {source}: {exc.strerror or exc}") from None


def _refuse_unsupported(files: Mapping[str, bytes]) -> None:
    for path in files:
        base = posixpath.basename(path)
        if base in _UNSUPPORTED:
            raise BundleFormatError(f"{path}: {_UNSUPPORTED[base]} are not supported by the embedded engine")
        if base in (MANIFEST_FILE, SIGNATURES_FILE) and path != base:
            raise BundleFormatError(f"{path}: {base} is only allowed at the bundle root")


def _check_signature(files: Mapping[str, bytes], verification: VerificationConfig | None) -> str | None:
    if SIGNATURES_FILE in files:
        if verification is None:
            raise BundleSignatureError("the bundle is signed but no verification key is configured")
        return verify_bundle(files, verification)
    if verification is not None and verification.required:
        raise BundleSignatureError(f"the bundle is not signed (no {SIGNATURES_FILE}) and verification is required")
    return None


def _text(path: str, content: bytes) -> str:
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BundleFormatError(f"{path}: not UTF-8 text: {exc}") from None


def _json(path: str, content: bytes) -> Any:
    try:
        return json.loads(content.decode("utf-8-sig"), parse_constant=reject_constant)
    except (ValueError, RecursionError) as exc:
        raise BundleFormatError(f"{path}: not valid JSON: {exc}") from None


def _manifest(files: Mapping[str, bytes]) -> Manifest:
    if MANIFEST_FILE not in files:
        return Manifest()
    document = _json(MANIFEST_FILE, files[MANIFEST_FILE])
    if not isinstance(document, dict):
        raise BundleFormatError(f"{MANIFEST_FILE}: must be a JSON object")
    revision, roots, metadata = (document.get(key, default) for key, default in _MANIFEST_DEFAULTS)
    if not isinstance(revision, str):
        raise BundleFormatError(f"{MANIFEST_FILE}: revision must be a string, got {revision!r}")
    if not isinstance(roots, list) or not all(isinstance(root, str) for root in roots):
        raise BundleFormatError(f"{MANIFEST_FILE}: roots must be a list of strings, got {roots!r}")
    if not isinstance(metadata, dict):
        raise BundleFormatError(f"{MANIFEST_FILE}: metadata must be an object, got {metadata!r}")
    _check_rego_v1(document)
    return Manifest(revision, _distinct_roots([root.strip("/") for root in roots]), metadata)


def _check_rego_v1(manifest: dict[str, Any]) -> None:
    per_file = manifest.get("file_rego_versions") or {}
    versions = [manifest.get("rego_version", 1), *(per_file.values() if isinstance(per_file, dict) else [per_file])]
    if any(version != 1 for version in versions):
        raise BundleFormatError(f"{MANIFEST_FILE}: only Rego v1 is supported (rego_version 1), got {versions}")


def _distinct_roots(roots: list[str]) -> tuple[str, ...]:
    for index, root in enumerate(roots):
        for other in roots[index + 1:]:
            if _contains((root,), other) or _contains((other,), root):
                raise BundleFormatError(f"{MANIFEST_FILE}: roots {root!r} and {other!r} overlap")
    return tuple(roots)


def _data(files: Mapping[str, bytes]) -> dict[str, Any]:
    """Every ``data.json`` placed by its directory and merged, shallowest first (a conflict names the deeper file)."""
    data: dict[str, Any] = {}
    for path in sorted((p for p in files if posixpath.basename(p) == DATA_FILE), key=lambda p: (p.count("/"), p)):
        value = _json(path, files[path])
        for key in reversed([part for part in posixpath.dirname(path).split("/") if part]):
            value = {key: value}
        if not isinstance(value, dict):
            raise BundleFormatError(f"{path}: a data.json at the bundle root must hold a JSON object")
        _merge(data, value, path, ())
    return data


def _merge(target: dict[str, Any], source: dict[str, Any], path: str, at: tuple[str, ...]) -> None:
    for key, value in source.items():
        if key not in target:
            target[key] = value
        elif isinstance(target[key], dict) and isinstance(value, dict):
            _merge(target[key], value, path, (*at, key))
        else:
            raise BundleFormatError(f"{path}: data at /{'/'.join((*at, key))} conflicts with another data file")


def _packages(modules: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """``module path -> package path`` (``toolbooth/authz``), parsed by regorus.

    The throwaway engine is dropped before any error is raised: a regorus engine must be
    released by the thread that made it, so no traceback may keep it alive.
    """
    engine, packages, problem = regorus.Engine(), {}, None
    for path, text in modules:
        try:
            packages[path] = engine.add_policy(path, text).removeprefix("data.").replace(".", "/")
        except Exception as exc:  # noqa: BLE001 - regorus raises plain RuntimeError/ValueError
            problem = f"{path}: {clean_regorus_error(exc)}"
            break
    del engine
    if problem is not None:
        raise BundleFormatError(problem)
    return packages


def _contains(roots: tuple[str, ...] | list[str], path: str) -> bool:
    """OPA's ``RootPathsContain``: some root is ``""`` or a leading run of ``path``'s segments."""
    segments = path.split("/")
    return any(root == "" or segments[:len(parts := root.split("/"))] == parts for root in roots)


def _check_roots(roots: tuple[str, ...], packages: dict[str, str], data: dict[str, Any]) -> None:
    for path, package in packages.items():
        if not _contains(roots, package):
            raise BundleFormatError(f"{path}: package {package.replace('/', '.')} is outside the manifest roots "
                                    f"{list(roots)}")
    _check_data_roots(roots, data, ())


def _check_data_roots(roots: tuple[str, ...], node: Any, at: tuple[str, ...]) -> None:
    path = "/".join(at)
    if _contains(roots, path):
        return
    if not isinstance(node, dict) or not any(_contains((path,), root) for root in roots):
        raise BundleFormatError(f"data at /{path} is outside the manifest roots {list(roots)}")
    for key, child in node.items():
        _check_data_roots(roots, child, (*at, key))


def _top_level_names(content: Mapping[str, bytes]) -> list[str]:
    """The first segment of every package and the top-level keys of the root data: the bundle's roots."""
    modules = tuple((path, text.decode()) for path, text in content.items() if path.endswith(".rego"))
    names = {package.split("/")[0] for package in _packages(modules).values()}
    if DATA_FILE in content:
        names |= set(_json(DATA_FILE, content[DATA_FILE]))
    return sorted(names)
