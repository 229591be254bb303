"""Policies and arguments for approval tests: ``file_note`` needs approval."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from sidecar.config import bundled_policy_dir
from sidecar.policy.embedded import EmbeddedEngine
from tests.support.cli import Sidecar, short_dir, start_sidecar

NOTE = {"title": "launch", "body": "at noon"}


def policy_dir(root: Path, *, mask: Sequence[str] = (), **approval: Any) -> Path:
    """``root``, holding the default policies with ``file_note`` requiring approval, ``approval`` merged into
    the data and the audit ``mask`` pointers of ``file_note``, and no meters (the tests of approvals make more
    writes than the default limit of writes per principal allows)."""
    shutil.copytree(bundled_policy_dir(), root)
    data = json.loads((root / "data.json").read_text())
    data["toolbooth"]["history"]["meters"] = {}
    data["toolbooth"]["approval"].update({"tools": ["file_note"], **approval})
    data["toolbooth"]["audit"] = {"mask": {"file_note": list(mask)}}
    (root / "data.json").write_text(json.dumps(data))
    return root


def policies(root: Path, *, mask: Sequence[str] = (), **approval: Any) -> EmbeddedEngine:
    """The engine over ``policy_dir(root, mask=mask, **approval)``."""
    return EmbeddedEngine.load(policy_dir(root, mask=mask, **approval))


@contextlib.contextmanager
def approvals_sidecar(rsa_key: rsa.RSAPrivateKey) -> Iterator[tuple[Sidecar, Path]]:
    """A real ``toolbooth serve`` on a Unix socket in a new short directory: JWT auth verifying ``rsa_key``'s
    tokens, the bundled policies holding ``calculate`` for approval (``policy_dir``); the sidecar and its home,
    stopped and removed afterwards."""
    from tests.integration.conftest import AUDIENCE, ISSUER

    home = short_dir()
    public = rsa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    config = {"server": {"listen": [f"unix://{home}/tb.sock"]}, "store": {"sqlite_path": f"{home}/tb.db"},
              "policy": {"path": str(policy_dir(home / "policies", tools=["calculate"]))},
              "auth": {"mode": "jwt", "jwt": {"algorithms": ["RS256"], "issuer": ISSUER, "audience": AUDIENCE,
                                              "key": public}}}
    (home / "toolbooth.yaml").write_text(json.dumps(config))
    sidecar = start_sidecar(home, home / "tb.sock", "--config", str(home / "toolbooth.yaml"))
    try:
        yield sidecar, home
    finally:
        sidecar.stop()
        shutil.rmtree(home, ignore_errors=True)
