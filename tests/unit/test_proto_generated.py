"""The committed generated modules equal a fresh generation from ``proto/``."""

from __future__ import annotations

from pathlib import Path

from sidecar.api import _generate

GENERATED = {"tool_service_pb2.py", "tool_service_pb2.pyi", "tool_service_pb2_grpc.py", "tool_service_pb2_grpc.pyi"}


def test_generated_modules_are_up_to_date(tmp_path: Path) -> None:
    written = _generate.generate(tmp_path)
    assert written, "no .proto files found"
    for fresh in written:
        committed = _generate.PACKAGE_ROOT / fresh.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is missing: run python -m sidecar.api._generate"
        assert committed.read_text() == fresh.read_text(), (
            f"{committed.name} is stale: run python -m sidecar.api._generate and commit the result")


def test_the_grpc_module_has_its_type_stub_too(tmp_path: Path) -> None:
    written = _generate.generate(tmp_path)
    assert {path.name for path in written} == GENERATED
    assert "class ToolServiceServicer" in (tmp_path / "toolbooth/v1/tool_service_pb2_grpc.pyi").read_text()
