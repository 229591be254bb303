"""docs/plugins.md's code that can run, run as written: "Testing a plugin"'s blocks as a conftest and a test module
run by pytest in a fresh directory, and the complete minimal ``pyproject.toml`` is the one ``toolbooth plugin new``
writes (whose package installs and passes its tests: ``test_plugin_new.py``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from string import Template

import pytest

from sidecar.cli.plugin_new import PYPROJECT

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
CONFTEST = "# tests/conftest.py\n"


def section(title: str) -> str:
    """The text of the ``## title`` section of docs/plugins.md."""
    text = DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def blocks(text: str, kind: str) -> list[str]:
    return [body for fenced, body in FENCE.findall(text) if fenced == kind]


def test_the_testing_section_runs_as_written(tmp_path: Path) -> None:
    code = blocks(section("Testing a plugin"), "python")
    [conftest] = [block for block in code if block.startswith(CONFTEST)]
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_doc.py").write_text("\n\n".join(block for block in code if block is not conftest))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto",
                          "-o", "asyncio_default_fixture_loop_scope=function",
                          "-W", "error", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 passed" in run.stdout.splitlines()[-1]


def test_the_minimal_pyproject_is_the_one_plugin_new_writes() -> None:
    documented = [block for block in blocks(section("A tool"), "toml") if block.startswith("[build-system]")]
    assert documented == [Template(PYPROJECT).substitute(name="my-plugin", package="my_plugin")]
