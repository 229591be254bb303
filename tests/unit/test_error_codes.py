"""One set of error codes and recoveries in code, in the proto and in the docs."""

from __future__ import annotations

import re
from pathlib import Path

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.contract import ErrorCode, Recovery, SideEffect, guidance

ROOT = Path(__file__).resolve().parents[2]


def proto_names(enum: str, prefix: str) -> set[str]:
    values = pb.DESCRIPTOR.enum_types_by_name[enum].values_by_name
    return {name.removeprefix(prefix) for name in values if not name.endswith("_UNSPECIFIED")}


def docs_table() -> dict[str, tuple[str, str]]:
    text = (ROOT / "docs" / "errors.md").read_text()
    table = re.search(r"<!-- error-table:start -->(.*)<!-- error-table:end -->", text, re.DOTALL)
    assert table, "docs/errors.md lost its error table markers"
    rows = [line.strip("| ").split(" | ") for line in table.group(1).strip().splitlines()[2:]]
    return {code: (retryable, recovery) for code, retryable, recovery in rows}


def test_proto_and_code_have_the_same_codes() -> None:
    assert proto_names("ErrorCode", "ERROR_CODE_") == {c.value for c in ErrorCode}
    assert proto_names("Recovery", "RECOVERY_") == {r.value.upper() for r in Recovery}


def test_docs_table_matches_the_guidance_in_code() -> None:
    table = docs_table()
    assert set(table) == {c.value for c in ErrorCode}
    for code in ErrorCode:
        read = guidance(code, SideEffect.NONE)
        write = guidance(code, SideEffect.EXTERNAL_IRREVERSIBLE)
        expected = _cell(read, write)
        assert table[code.value] == expected, code


def _cell(read: tuple[bool, Recovery], write: tuple[bool, Recovery]) -> tuple[str, str]:
    yes = {True: "yes", False: "no"}
    if read == write:
        return yes[read[0]], read[1].value
    return (f"read: {yes[read[0]]} / write: {yes[write[0]]}",
            f"read: {read[1].value} / write: {write[1].value}")
