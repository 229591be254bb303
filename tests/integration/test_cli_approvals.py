"""``toolbooth previews list``, ``approve`` and ``deny`` as an approver runs them: real processes against a real
``toolbooth serve`` (JWT, a Unix socket) whose bundled policies hold every ``calculate`` call for approval.

The table shows ids and expiries whole at 80 and 100 columns, and what it shows is what ``approve`` takes; a
prefix names one preview or is refused; an approval that cannot be given says why (one's own call, already
decided, expired), and an id the sidecar does not know gets the same answer as a mistyped one.

Needs the calculator plugin installed (``pip install -e plugins/calculator --no-deps``).
"""

from __future__ import annotations

import json
import re
import secrets
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from sidecar.client import Client
from sidecar.contract import Preview, Status
from tests.support.approvals import approvals_sidecar
from tests.support.cli import Sidecar, cli_env, toolbooth

pytestmark = pytest.mark.integration

_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
Tokens = Callable[..., str]


@dataclass
class Desk:
    """The sidecar, where its store is, and tokens of the tenant ``acme``'s people."""

    sidecar: Sidecar
    home: Path
    tokens: Tokens

    def hold(self, a: int, sub: str = "alice") -> Preview:
        """A ``calculate`` call of ``sub`` (adding ``a`` and 1) held for approval: its preview."""
        token = self.tokens(sub=sub, roles=["developer", "approver"])
        with Client(self.sidecar.target, token=token, timeout=30) as client:
            result = client.execute("calculate", {"operation": "add", "operands": [a, 1]})
        assert result.status is Status.APPROVAL_REQUIRED and result.preview is not None, result
        return result.preview

    def run(self, *args: str, sub: str = "bob", roles: tuple[str, ...] = ("approver",),
            **env: str) -> subprocess.CompletedProcess[str]:
        """``toolbooth ARGS`` as ``sub`` (by default an approver who made no call)."""
        token = self.tokens(sub=sub, roles=list(roles))
        return toolbooth(*args, "--target", self.sidecar.target,
                         env=cli_env(self.home, TOOLBOOTH_TOKEN=token, **env))

    def expire(self, preview_id: str) -> None:
        """Move the preview's expiry into the past in the sidecar's store, as time would."""
        with sqlite3.connect(self.home / "tb.db", timeout=30) as db:
            db.execute("UPDATE previews SET expires_at = ? WHERE preview_id = ?", (time.time() - 1, preview_id))

    def copy(self, preview_id: str, twin: str) -> None:
        """Store a copy of the preview under the id ``twin``: two ids alike, which only a coincidence makes."""
        with sqlite3.connect(self.home / "tb.db", timeout=30) as db:
            rest = ", ".join(row[1] for row in db.execute("PRAGMA table_info(previews)") if row[1] != "preview_id")
            db.execute(f"INSERT INTO previews (preview_id, {rest}) SELECT ?, {rest} FROM previews "
                       "WHERE preview_id = ?", (twin, preview_id))


@pytest.fixture(scope="module")
def served(rsa_key: rsa.RSAPrivateKey) -> Iterator[tuple[Sidecar, Path]]:
    with approvals_sidecar(rsa_key) as running:
        yield running


@pytest.fixture
def desk(served: tuple[Sidecar, Path], make_token: Tokens) -> Desk:
    return Desk(*served, make_token)


def _rows(table: str) -> list[list[str]]:
    """The first line of each row of a ``previews list`` table (a line whose first column is not blank)."""
    return [line.split() for line in table.splitlines()[1:] if line and not line[0].isspace()]


@pytest.mark.parametrize("width", [80, 100])
def test_the_table_shows_ids_and_times_whole_and_an_id_as_shown_approves(desk: Desk, width: int) -> None:
    held = {p.preview_id: p for p in (desk.hold(width), desk.hold(width + 1))}
    listed = desk.run("previews", "list", COLUMNS=str(width))
    assert listed.returncode == 0, listed.stderr
    assert all(len(line) <= width for line in listed.stdout.splitlines()), listed.stdout
    shown = {}
    for row in _rows(listed.stdout):
        named = [i for i in held if i.startswith(row[0])]
        assert len(row[0]) >= 12 and len(named) <= 1, listed.stdout  # an id, or a prefix naming one
        assert _TIME.fullmatch(row[2]), listed.stdout  # the expiry, whole, on the id's line
        shown.update({named[0]: row[0]} if named else {})
    assert shown.keys() == held.keys(), listed.stdout
    first = next(iter(held))
    approved = desk.run("approve", shown[first], "--field", "preview.state")
    assert (approved.returncode, approved.stdout.strip()) == (0, "approved"), approved.stderr
    assert f"preview  {first}" in approved.stderr  # what it approved, in full


def test_a_piped_table_shows_whole_ids(desk: Desk) -> None:
    preview = desk.hold(7)
    listed = desk.run("previews", "list")
    assert listed.returncode == 0, listed.stderr
    assert preview.preview_id in [row[0] for row in _rows(listed.stdout)]


def test_a_prefix_names_one_preview_or_is_refused(desk: Desk) -> None:
    preview = desk.hold(20)
    twin = preview.preview_id[:10] + ("0" if preview.preview_id[10] != "0" else "1") + "f" * 37
    desk.copy(preview.preview_id, twin)  # its first 10 characters are the preview's

    ambiguous = desk.run("approve", preview.preview_id[:10])
    assert ambiguous.returncode == 2, ambiguous.stderr
    assert "begins the ids of 2 pending previews" in ambiguous.stderr
    assert preview.preview_id in ambiguous.stderr and twin in ambiguous.stderr

    short = desk.run("deny", preview.preview_id[:7], "--reason", "no")
    assert short.returncode == 2 and "too short to name a preview" in short.stderr, short.stderr

    denied = desk.run("deny", preview.preview_id[:11], "--reason", "not now", "--output", "json")
    assert denied.returncode == 0, denied.stderr
    result = json.loads(denied.stdout)
    assert (result["preview"]["preview_id"], result["preview"]["state"]) == (preview.preview_id, "denied")


def test_why_an_approval_cannot_be_given(desk: Desk) -> None:
    own = desk.hold(30)
    mine = desk.run("approve", own.preview_id, sub="alice", roles=("developer", "approver"))
    assert mine.returncode == 3, mine.stderr
    assert mine.stderr.strip() == (f"toolbooth: error: preview {own.preview_id!r} cannot be approved: nobody may "
                                   "approve their own call")

    no_role = desk.run("approve", own.preview_id, sub="carol", roles=("developer",))
    assert no_role.returncode == 3 and "needs one of its approver roles" in no_role.stderr, no_role.stderr

    assert desk.run("approve", own.preview_id).returncode == 0
    again = desk.run("approve", own.preview_id)
    assert again.returncode == 3, again.stderr
    assert again.stderr.strip() == f"toolbooth: error: preview {own.preview_id!r} is already approved"

    late = desk.hold(31)
    desk.expire(late.preview_id)
    expired = desk.run("approve", late.preview_id)
    assert expired.returncode == 3 and "cannot be approved: the preview expired" in expired.stderr, expired.stderr

    unknown = secrets.token_hex(24)
    nobody = desk.run("approve", unknown)
    assert nobody.returncode == 3, nobody.stderr
    assert nobody.stderr.strip() == (f"toolbooth: error: preview {unknown!r} is not among the pending previews you "
                                     "may approve; check the id, or pass --hash")
