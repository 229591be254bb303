"""RFC 8785 hashing: known vectors, refusals, stored hashes from before JCS, and the batcher's row isolation."""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import random
import struct
from dataclasses import astuple, fields, replace

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.canonical import (
    CanonicalizationError,
    canonical_bytes,
    canonical_json,
    hash_matches,
    legacy_sha256_hex,
    sha256_hex,
    sorted_json,
)
from sidecar.state.audit import AuditBatcher
from sidecar.state.chain import GENESIS_HASH, KEYED_PREFIX, LATER_COLUMNS, ChainVerifier, event_hash
from sidecar.state.records import AuditEvent, AuditRecord
from sidecar.state.rows import audit_row

_EVENT = AuditEvent(request_id="r1", time="2026-01-01T00:00:00.000+00:00", principal_id="p", tenant="t",
                    tool="calculate", tool_version="1.0.0", input_hash="sha256:00", decisions_json="{}",
                    policy_revision="sha256:01", idempotency_key=None, call_id=None, conversation_id=None,
                    status="success", error_code=None, duration_ms=3, arguments_json='{"a":1}',
                    decision_ids=None, decision_input='{"x":"y"}')

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=20)


@given(JSON)
@settings(max_examples=2000, deadline=None)
def test_the_fast_path_writes_exactly_what_rfc8785_writes(value: object) -> None:
    try:
        expected: bytes | type[Exception] = rfc8785.dumps(value)
    except (CanonicalizationError, UnicodeEncodeError):
        expected = CanonicalizationError
    if expected is CanonicalizationError:
        with pytest.raises(CanonicalizationError):
            canonical_bytes(value)
    else:
        assert canonical_bytes(value) == expected


BOUNDARY_FLOATS = [1e-4, 9.999999999999999e-05, 1e16, 9999999999999998.0, 2.0**53, 2.0**53 + 2, -0.0, 0.5, 1e-7,
                   123.456, 5e-324, 1.7976931348623157e308, 0.1 + 0.2, 1e15 + 0.5, 1e21, 1e20]


@pytest.mark.parametrize("number", BOUNDARY_FLOATS)
def test_floats_at_the_edges_of_the_fast_path_are_written_as_jcs_writes_them(number: float) -> None:
    assert canonical_bytes({"x": [number, -number]}) == rfc8785.dumps({"x": [number, -number]})


def test_random_doubles_are_written_as_jcs_writes_them() -> None:
    rng = random.Random(8785)
    for _ in range(20_000):
        number = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(number):
            assert canonical_bytes([number]) == rfc8785.dumps([number]), repr(number)


def test_jcs_vectors() -> None:
    assert canonical_json({"b": 1.0, "a": [1e-7, 1e21, "é\n"]}) == '{"a":[1e-7,1e+21,"é\\n"],"b":1}'
    assert canonical_json({"\U0001F600": 1, "\uff00": 2}) == '{"\U0001F600":1,"\uff00":2}'  # UTF-16 order
    assert sha256_hex({}) == "sha256:" + hashlib.sha256(b"{}").hexdigest()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2**53, "\ud800", {"\udc00": 1}])
def test_values_without_a_canonical_form_are_refused(value: object) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_json(value)


def test_a_stored_hash_from_before_jcs_still_matches() -> None:
    value = {"tool": "t", "version": "1", "arguments": {"amount": 10.0, "ratio": 1e-7}}
    old = legacy_sha256_hex(value)
    assert old is not None and old != sha256_hex(value)
    assert hash_matches(value, old) and hash_matches(value, sha256_hex(value))
    assert not hash_matches({**value, "tool": "u"}, old)


_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
_events = st.builds(AuditEvent, **{f.name: (st.integers(0, 2**53 - 1) if f.name == "duration_ms" else
                                             st.one_of(st.none(), _text) if "None" in str(f.type) else _text)
                                   for f in fields(AuditEvent)})


@settings(max_examples=300, deadline=None)
@given(_events, st.sampled_from([GENESIS_HASH, "sha256:" + "ab" * 32]))
def test_audit_chain_hashes_are_byte_identical_to_the_old_form(event: AuditEvent, prev: str) -> None:
    """Every value the chain hashes is a string, None or a safe integer under an ASCII key: the old chain verifies.
    The columns added after it (``LATER_COLUMNS``) are hashed only when set, so an event without them hashes as
    before they existed."""
    named = zip([f.name for f in fields(AuditEvent)], astuple(event), strict=True)
    columns = {**{name: value for name, value in named if value is not None or name not in LATER_COLUMNS},
               "prev_hash": prev}
    assert canonical_json(columns) == sorted_json(columns)
    old_hash = "sha256:" + hashlib.sha256(sorted_json(columns).encode()).hexdigest()
    assert event_hash(audit_row(event), prev) == old_hash
    record = AuditRecord(id=1, event=event, prev_hash=GENESIS_HASH,
                         hash=event_hash(audit_row(event), GENESIS_HASH))
    assert ChainVerifier().feed(record) is None


@pytest.mark.parametrize("value", [True, 2.5, 1e20, [1, None], {"b": 1, "a": None}, "\u2028\x00\x1f\"\\ \U0001f600"])
def test_an_event_hash_is_over_the_canonical_json_of_the_event_whatever_its_values(value: object) -> None:
    """The field-by-field encoder of ``event_hash`` takes strings, ``None`` and safe integers; anything else takes
    ``canonical_bytes``; both give the canonical JSON of the linked event."""
    row = (*astuple(_EVENT)[:-1], value)
    named = zip([f.name for f in fields(AuditEvent)], row, strict=True)
    columns = {**{name: value for name, value in named if value is not None or name not in LATER_COLUMNS},
               "prev_hash": GENESIS_HASH}
    assert event_hash(row, GENESIS_HASH) == "sha256:" + hashlib.sha256(canonical_bytes(columns)).hexdigest()
    keyed = event_hash(row, GENESIS_HASH, b"k" * 32)
    assert keyed == KEYED_PREFIX + hmac.new(b"k" * 32, canonical_bytes(columns), hashlib.sha256).hexdigest()


def test_a_stored_event_that_cannot_be_hashed_is_the_broken_link_and_says_why() -> None:
    changed = replace(_EVENT, duration_ms=2**53)
    record = AuditRecord(id=4, event=changed, prev_hash=GENESIS_HASH, hash=event_hash(audit_row(_EVENT), GENESIS_HASH))
    broken = ChainVerifier().feed(record)
    assert broken is not None and broken.id == 4
    assert broken.problem.startswith("the event holds a value no event is written with (")
    assert broken.problem.endswith("): the event was changed")


def test_an_event_that_cannot_be_hashed_says_why() -> None:
    with pytest.raises(CanonicalizationError, match="non-UTF-8"):
        event_hash((*astuple(_EVENT)[:-1], "\ud800"), GENESIS_HASH)
    with pytest.raises(ValueError, match=f"an event has {len(fields(AuditEvent))} fields, not 2"):
        event_hash(("a", "b"), GENESIS_HASH)


async def test_a_failing_row_is_retried_alone_and_the_others_are_written(caplog: pytest.LogCaptureFixture) -> None:
    written: list[str] = []

    async def write(rows: list[tuple[object, ...]]) -> None:
        if any("\x00" in str(row[0]) for row in rows):
            raise ValueError("text fields cannot contain NUL")
        written.extend(str(row[0]) for row in rows)

    batcher = AuditBatcher(write)
    names = [f"r{n}" for n in range(9)] + ["bad\x00"] + [f"s{n}" for n in range(10)]
    for name in names:
        batcher.put(AuditEvent(name, "t", "p", "acme", "echo", "1", "h", "{}", "rev", None, None, None, "success",
                               None, 1))
    with caplog.at_level(logging.ERROR, "toolbooth.store"):
        await batcher.flush()
    assert written == [name for name in names if "\x00" not in name]
    assert caplog.text.count("could not be written, dropped") == 1
