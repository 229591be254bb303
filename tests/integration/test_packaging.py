"""The ``toolbooth`` wheel as ``pip`` builds it: what an installation gets, and what stays in the repository."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(REPO)],
                   check=True, timeout=300)
    (path,) = out.glob("toolbooth-*.whl")
    with zipfile.ZipFile(path) as archive:
        yield archive


def test_the_wheel_is_typed_and_licensed(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert "sidecar/py.typed" in names  # mypy reads sidecar.plugin and sidecar.client's types in users' code
    (license_file,) = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
    assert wheel.read(license_file) == (REPO / "LICENSE").read_bytes()
    (metadata,) = [name for name in names if name.endswith(".dist-info/METADATA")]
    assert "License-Expression: Apache-2.0" in wheel.read(metadata).decode().splitlines()


def test_the_wheel_carries_the_default_policies_and_no_development_modules(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    shipped = {f"sidecar/_bundled_policies/{path.relative_to(REPO / 'policies')}"
               for path in (REPO / "policies").rglob("*") if path.is_file()}
    assert shipped <= names
    assert "sidecar/api/_generate.py" not in names  # needs grpcio-tools: regenerates sidecar/api/toolbooth
    assert not [name for name in names if name.startswith(("tests/", "benchmarks/", "plugins/"))]
