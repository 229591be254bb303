"""Request and decision ids: random version 4 UUIDs, never repeated, in a forked child too."""

from __future__ import annotations

import os
import uuid

from sidecar.ids import random_uuid, random_uuid_hex


def test_ids_are_version_4_uuids_written_as_uuid_writes_them() -> None:
    texts = [random_uuid() for _ in range(2000)]
    hexes = [random_uuid_hex() for _ in range(2000)]
    for text in texts:
        one = uuid.UUID(text)
        assert str(one) == text and one.version == 4 and one.variant == uuid.RFC_4122
    for text in hexes:
        one = uuid.UUID(hex=text)
        assert one.hex == text and one.version == 4 and one.variant == uuid.RFC_4122
    assert {text[19] for text in texts} == set("89ab")  # every variant nibble occurs: the bits are random
    assert len(set(texts)) == len(texts) and len(set(hexes)) == len(hexes)


def test_ids_span_many_blocks_without_a_repeat() -> None:
    ids = [random_uuid_hex() for _ in range(3 * 4096 // 16 + 7)]
    assert len(set(ids)) == len(ids)


def test_a_forked_child_does_not_hand_out_its_parents_next_ids() -> None:
    random_uuid()  # a block is read ahead
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, "".join(random_uuid_hex() for _ in range(8)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    parent = "".join(random_uuid_hex() for _ in range(8))
    assert len(child) == len(parent) == 8 * 32 and child != parent
    assert not {child[i:i + 32] for i in range(0, len(child), 32)} & {parent[i:i + 32] for i in range(0, 256, 32)}
