"""The committed generated modules equal a fresh generation from ``proto/``."""

from __future__ import annotations

from pathlib import Path

from sidecar.api import _generate


def test_generated_modules_are_up_to_date(tmp_path: Path) -> None:
    written = _generate.generate(tmp_path)
    assert written, "no .proto files found"
    for fresh in written:
        committed = _generate.PACKAGE_ROOT / fresh.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is missing: run python -m sidecar.api._generate"
        assert committed.read_text() == fresh.read_text(), (
            f"{committed.name} is stale: run python -m sidecar.api._generate and commit the result")
