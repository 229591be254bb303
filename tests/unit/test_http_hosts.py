"""The DNS-rebinding rule of the loopback HTTP listeners (``sidecar.server.http_hosts``)."""

from __future__ import annotations

import pytest

from sidecar.server.http_hosts import foreign_origin, misdirected


@pytest.mark.parametrize(("origin", "refused"), [
    (None, False), ("http://127.0.0.1:8790", False), ("http://localhost", False), ("https://[::1]:9", False),
    ("http://attacker.example:8790", True), ("http://127.0.0.1.attacker.example", True), ("null", True),
    ("file://", True), ("http://127.0.0.1:x", True), ("http://user@127.0.0.1", True), ("", True),
])
def test_an_origin_is_refused_unless_absent_or_loopback(origin: str | None, refused: bool) -> None:
    assert foreign_origin(origin) is refused


@pytest.mark.parametrize(("host", "refused"), [
    ("127.0.0.1:8790", False), ("[::1]:1", False), ("localhost", False), (None, True), ("", True),
    ("attacker.example:8790", True), ("127.0.0.1.attacker.example", True),
])
def test_a_host_is_refused_unless_loopback(host: str | None, refused: bool) -> None:
    assert misdirected(host) is refused
