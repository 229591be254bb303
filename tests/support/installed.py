"""Plugins installed for a test: a minimal distribution (dist-info with ``toolbooth.tools`` entry points, and its
module) written into a directory on ``sys.path`` (the ``site`` fixture); and the plugins this repository ships
(``BUNDLED_PLUGINS``), which every test that serves installed plugins allows, and only them: a plugin installed
besides them (``pip install -e examples/demo_tools``) changes no test's tools."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

__all__ = ["BUNDLED_PLUGINS", "ONLY_BUNDLED", "install", "site"]

BUNDLED_PLUGINS = ("calculator", "documents", "email", "tasks")  # entry-point names (plugins/*)
# ``plugins.allow`` as a variable (its value is YAML), for a sidecar whose command line a test does not choose
ONLY_BUNDLED = {"TOOLBOOTH_PLUGINS__ALLOW": f"[{', '.join(BUNDLED_PLUGINS)}]"}


def install(site: Path, dist: str, module: str, entry_points: dict[str, str], source: str) -> None:
    """Write a minimal installed distribution (dist-info + module) under ``site``."""
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "\n".join(f"{name} = {target}" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[toolbooth.tools]\n{lines}\n")
    (site / f"{module}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory on ``sys.path`` for ``install``."""
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path
