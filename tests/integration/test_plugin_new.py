"""``toolbooth plugin new``: the package it writes installs and passes its own tests as written; bad names and
existing directories are refused with exit 2, writing nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.cli import main

pytestmark = pytest.mark.integration


def test_the_written_plugin_installs_and_passes_its_tests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugin", "new", "acme-weather", "--directory", str(tmp_path)]) == 0
    root = tmp_path / "acme-weather"
    assert capsys.readouterr().out.splitlines()[-1] == f"next: pip install -e '{root}[test]' && pytest {root}"
    target = tmp_path / "installed"  # the distribution alone; its dependencies are this environment's
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    str(root)], check=True, timeout=300)
    assert (target / "acme_weather" / "__init__.py").is_file()
    elsewhere = tmp_path / "elsewhere"  # so that the package is imported from where it was installed
    elsewhere.mkdir()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "tests")],
                         cwd=elsewhere, env={**os.environ, "PYTHONPATH": str(target)}, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed" in run.stdout.splitlines()[-1]


def test_json_output_lists_what_was_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugin", "new", "notes_2", "--directory", str(tmp_path), "--output", "json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written == {"directory": str(tmp_path / "notes_2"), "package": "notes_2",
                       "files": ["pyproject.toml", "README.md", "notes_2/__init__.py", "notes_2/py.typed",
                                 "tests/conftest.py", "tests/test_notes_2.py"]}
    entry = 'notes_2 = "notes_2:TOOLS"'
    assert entry in (tmp_path / "notes_2" / "pyproject.toml").read_text().splitlines()


@pytest.mark.parametrize(("name", "problem"), [
    ("Weather", "expected at most 50 lowercase letters and digits"),
    ("2fast", "expected at most 50"),
    ("acme--weather", "expected at most 50"),
    ("a" * 51, "expected at most 50"),
    ("import", "'import' cannot be the plugin's package (a Python keyword)"),
    ("sidecar", "'sidecar' cannot be the plugin's package (a name Toolbooth uses)"),
])
def test_a_bad_name_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                                     problem: str) -> None:
    assert main(["plugin", "new", name, "--directory", str(tmp_path)]) == 2
    assert problem in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_existing_directory_is_never_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "weather").mkdir()
    (tmp_path / "weather" / "mine.txt").write_text("keep")
    assert main(["plugin", "new", "weather", "--directory", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert [path.name for path in (tmp_path / "weather").iterdir()] == ["mine.txt"]
