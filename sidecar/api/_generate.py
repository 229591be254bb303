"""Regenerate the protobuf/gRPC modules of this package from ``proto/``.

Run ``python -m sidecar.api._generate`` after editing a ``.proto`` file (needs
grpcio-tools and mypy-protobuf, test dependencies). protoc writes ``*_pb2.py`` with its
``.pyi``, ``*_pb2_grpc.py``, and (through mypy-protobuf's ``protoc-gen-mypy_grpc``
plugin) the ``*_pb2_grpc.pyi`` that types the stubs and servicers. protoc writes
imports as ``from toolbooth.v1 import …``; they are rewritten to
``sidecar.api.toolbooth.v1`` so the generated code lives inside the ``sidecar``
package. ``tests/unit/test_proto_generated.py`` fails when the committed modules
differ from a fresh generation.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parents[2] / "proto"
PACKAGE_ROOT = Path(__file__).resolve().parent
_IMPORT = re.compile(r"^from toolbooth\.v1 import", re.MULTILINE)
GRPC_STUB_PLUGIN = "protoc-gen-mypy_grpc"


def generate(out_dir: Path, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Write the generated modules for every ``.proto`` under ``proto_root`` into ``out_dir``."""
    from grpc_tools import protoc  # imported here: a build-time dependency only

    protos = sorted(str(p.relative_to(proto_root)) for p in proto_root.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{proto_root}", f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}",
                f"--plugin={GRPC_STUB_PLUGIN}={grpc_stub_plugin()}", f"--mypy_grpc_out={tmp}"]
        if protoc.main([*args, *protos]) != 0:
            raise RuntimeError(f"protoc failed for {protos}")
        written = []
        for src in sorted(Path(tmp).rglob("*.py*")):
            dest = out_dir / src.relative_to(tmp)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(_IMPORT.sub("from sidecar.api.toolbooth.v1 import", src.read_text()))
            written.append(dest)
    for package in {p.parent for p in written} | {out_dir / "toolbooth"}:
        (package / "__init__.py").touch()
    return written


def grpc_stub_plugin() -> str:
    """The path of mypy-protobuf's gRPC stub plugin: beside this Python (its environment), else on ``PATH``."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which(GRPC_STUB_PLUGIN, path=search)
    if found is None:
        raise RuntimeError(f"{GRPC_STUB_PLUGIN} not found: install mypy-protobuf (the test extra)")
    return found


if __name__ == "__main__":
    for path in generate(PACKAGE_ROOT):
        print(path.relative_to(PACKAGE_ROOT.parents[1]), file=sys.stderr)
