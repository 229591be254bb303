"""``toolbooth policy bundle build | inspect | verify``: OPA bundles from the command line.

A thin shell over ``sidecar.policy.bundle``: it parses flags, prints text or JSON and
turns the outcome into an exit code. Key files are read as they are (an HMAC secret
includes any trailing newline), the same way ``policy.bundle.verification`` reads them.

Exit codes:
  build    0 the bundle was written; 1 the policies do not load or cannot be signed; 2 usage error
  inspect  0 printed; 1 not a bundle that loads
  verify   0 verified; 1 not verified (unsigned, another key, a file changed, added or missing,
           or not a bundle that loads); 2 usage error (e.g. an unreadable or unusable --key)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sidecar.cli.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CommandError, Subparsers, config_flag, dump_json
from sidecar.cli.flags import given_policies, policies_flag
from sidecar.cli.output import json_output, output_flag
from sidecar.config import load_settings
from sidecar.errors import BundleError, PolicyLoadError
from sidecar.policy.bundle import Bundle, build_bundle, load_bundle
from sidecar.policy.bundle.signing import (
    SIGNING_ALGORITHMS,
    VerificationConfig,
    VerificationKey,
    file_hash,
    signature_header,
)

__all__ = ["DEFAULT_ALGORITHM", "add_bundle_commands", "cmd_build", "cmd_inspect", "cmd_verify",
           "format_inspection", "inspect_document", "read_key"]

DEFAULT_ALGORITHM = "RS256"


def add_bundle_commands(policy_actions: Subparsers) -> None:
    """Add ``bundle`` and its subcommands under ``toolbooth policy``."""
    bundle = policy_actions.add_parser("bundle", help="build, inspect and verify OPA bundles")
    actions = bundle.add_subparsers(dest="bundle_action", required=True, metavar="ACTION")
    build = actions.add_parser("build", help="pack a policy directory into a bundle (.tar.gz)")
    policies_flag(build)
    config_flag(build, "YAML config: its policy.path is built without --policies")
    build.add_argument("-o", "--out", type=Path, required=True, metavar="FILE", help="bundle file to write")
    build.add_argument("--revision", metavar="R", help="manifest revision (default: the directory's content hash)")
    build.add_argument("--signing-key", type=Path, metavar="FILE", help="PEM private key, or HMAC secret, to sign with")
    _algorithm_flag(build, "--signing-alg", "signing")
    build.add_argument("--keyid", metavar="K", help="key id written into the signature (JWT kid)")
    output_flag(build)
    build.set_defaults(handler=cmd_build)
    inspect = actions.add_parser("inspect", help="print a bundle's revision, roots, files and signature")
    inspect.add_argument("file", type=Path, metavar="FILE")
    output_flag(inspect)
    inspect.set_defaults(handler=cmd_inspect)
    verify = actions.add_parser("verify", help="verify a bundle's signature with a key (exit 0 verified, 1 not)")
    verify.add_argument("file", type=Path, metavar="FILE")
    verify.add_argument("--key", type=Path, required=True, metavar="FILE", help="PEM public key, or HMAC secret")
    _algorithm_flag(verify, "--alg", "verification")
    verify.add_argument("--keyid", metavar="K",
                        help="the key's id: the signature must name it (default: accept the key id it names)")
    output_flag(verify)
    verify.set_defaults(handler=cmd_verify)


def _algorithm_flag(parser: argparse.ArgumentParser, flag: str, purpose: str) -> None:
    parser.add_argument(flag, dest="algorithm", choices=SIGNING_ALGORITHMS, metavar="ALG",
                        help=f"{purpose} algorithm: {', '.join(SIGNING_ALGORITHMS)} (default: {DEFAULT_ALGORITHM})")


def cmd_build(args: argparse.Namespace) -> int:
    """``toolbooth policy bundle build``: write the bundle of a policy directory."""
    if args.signing_key is None and (args.keyid or args.algorithm):
        raise CommandError("--keyid and --signing-alg need --signing-key", EXIT_USAGE)
    key = None if args.signing_key is None else read_key(args.signing_key, "--signing-key")
    root = given_policies(args) or load_settings(args.config).policy.path
    try:
        archive = build_bundle(root, revision=args.revision, signing_key=key,
                               signing_algorithm=args.algorithm or DEFAULT_ALGORITHM, keyid=args.keyid)
        bundle = load_bundle(archive, skip_verification=True)
        args.out.write_bytes(archive)
    except (PolicyLoadError, OSError) as exc:
        raise CommandError(str(exc), EXIT_FAILURE) from None
    algorithm = args.algorithm or DEFAULT_ALGORITHM
    if json_output(args):
        print(dump_json({"file": str(args.out), "revision": bundle.revision, "files": len(bundle.files),
                         "signed": key is not None, "algorithm": algorithm if key else None, "keyid": args.keyid}))
        return EXIT_OK
    signed = f"signed ({algorithm}{f', key id {args.keyid}' if args.keyid else ''})"
    print(f"wrote {args.out}: revision {bundle.revision}, {len(bundle.files)} files, {signed if key else 'unsigned'}")
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    """``toolbooth policy bundle inspect``: describe a bundle without verifying it."""
    bundle = _loading(args.file)
    document = inspect_document(bundle)
    print(dump_json(document) if json_output(args) else format_inspection(document))
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    """``toolbooth policy bundle verify``: 0 when the signature verifies with ``--key``, else 1."""
    algorithm = args.algorithm or DEFAULT_ALGORITHM
    try:
        key = VerificationKey.parse(algorithm, read_key(args.key, "--key"))
    except ValueError as exc:
        raise CommandError(f"--key {args.key}: {exc}", EXIT_USAGE) from None
    # Without --keyid the one key verifies whatever key id the signature names; messages call it by its file.
    name = args.keyid or str(args.key)
    config = VerificationConfig({name: key}, keyid=None if args.keyid else name)
    try:
        bundle = load_bundle(args.file, config)
    except BundleError as exc:
        return _verdict(json_output(args), {"verified": False, "error": str(exc)})
    return _verdict(json_output(args), {"verified": True, "revision": bundle.revision, "files": len(bundle.files) - 1,
                                  "algorithm": algorithm, "keyid": args.keyid})


def _verdict(as_json: bool, document: dict[str, Any]) -> int:
    if as_json:
        print(dump_json(document))
    elif not document["verified"]:
        raise CommandError(f"not verified: {document['error']}", EXIT_FAILURE)
    else:
        print(f"verified: revision {document['revision']}, {document['files']} files signed ({document['algorithm']})")
    return EXIT_OK if document["verified"] else EXIT_FAILURE


def read_key(path: Path, flag: str) -> str:
    """The text of a key file; a usage error naming ``flag`` when it cannot be read."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"cannot read {flag} {path}: {exc}", EXIT_USAGE) from None


def _loading(path: Path) -> Bundle:
    try:
        return load_bundle(path, skip_verification=True)
    except BundleError as exc:
        raise CommandError(str(exc), EXIT_FAILURE) from None


def inspect_document(bundle: Bundle) -> dict[str, Any]:
    """What ``inspect`` shows, as JSON data. File hashes are the SHA-256 digests OPA signs."""
    return {
        "source": bundle.source,
        "revision": bundle.revision,
        "revision_from": "manifest" if bundle.manifest.revision else "content",
        "roots": list(bundle.manifest.roots),
        "metadata": dict(bundle.manifest.metadata),
        "signed": bundle.signed,
        "signature": _signature(bundle),
        "files": [{"path": path, "size": len(content), "sha256": file_hash(path, content)}
                  for path, content in sorted(bundle.files.items())],
    }


def _signature(bundle: Bundle) -> dict[str, Any] | None:
    """The signature's algorithm and key id as it states them (not verified), or why it cannot be read."""
    try:
        header = signature_header(bundle.files)
    except BundleError as exc:
        return {"algorithm": None, "keyid": None, "error": str(exc)}
    return None if header is None else {"algorithm": header.get("alg"), "keyid": header.get("kid"), "error": None}


def format_inspection(document: dict[str, Any]) -> str:
    """The ``inspect`` document as aligned text."""
    signature = document["signature"]
    if signature is None:
        signed = "no"
    elif signature["error"]:
        signed = f"yes, unreadable: {signature['error']}"
    else:
        signed = f"yes ({signature['algorithm']}, key id {signature['keyid'] or '-'}; not verified here)"
    lines = [f"bundle    {document['source']}",
             f"revision  {document['revision']} (from the {document['revision_from']})",
             f"roots     {', '.join(repr(root) for root in document['roots'])}",
             f"signed    {signed}",
             "files     (SHA-256 as OPA signs it: JSON files in normal form)"]
    width = max(len(str(file["size"])) for file in document["files"]) if document["files"] else 1
    lines += [f"  {file['size']:>{width}}  {file['sha256']}  {file['path']}" for file in document["files"]]
    return "\n".join(lines)
