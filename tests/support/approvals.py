"""Policies and arguments for approval tests: ``file_note`` needs approval."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sidecar.config import bundled_policy_dir
from sidecar.policy.embedded import EmbeddedEngine

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
