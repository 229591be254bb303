"""Policy sets for tests of the call history: the bundled ones with other meters."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from sidecar.config import bundled_policy_dir

__all__ = ["with_meters"]


def with_meters(root: Path, meters: dict[str, Any] | None = None) -> Path:
    """The bundled policies copied to ``root`` (a new directory), their meters (``data.toolbooth.history.meters``)
    replaced by ``meters`` (none by default: a write's decisions then read no count, which changes every call)."""
    copy = Path(shutil.copytree(bundled_policy_dir(), root))
    data = json.loads((copy / "data.json").read_text())
    data["toolbooth"]["history"]["meters"] = meters or {}
    (copy / "data.json").write_text(json.dumps(data))
    return copy
