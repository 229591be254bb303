"""``toolbooth approve`` without ``--hash`` reads the pending previews a page at a time and stops at the one it
approves; ``previews list`` says how to read on when it is cut short."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import pytest

from sidecar.cli import approvals as cli
from sidecar.cli import main
from sidecar.contract import ApprovalResult, ErrorCode, ErrorInfo, Preview

PAGES = [[f"p-{page}-{n}" for n in range(3)] for page in range(4)]  # newest first, three to a page


class PagedClient:
    """A sidecar's ListPreviews over ``PAGES`` (the token of a page is its number) that approves any of them."""

    def __init__(self) -> None:
        self.listed: list[str] = []  # the page tokens asked for

    def previews_page(self, *, limit: int = 0, page_token: str = "") -> tuple[list[Preview], str]:
        self.listed.append(page_token)
        number = int(page_token or 0)
        page = [Preview(preview_id=i, preview_hash=f"sha256:{i}", call_json="{}", reason="r",
                        expires_at="2026-12-01T10:15:00Z") for i in PAGES[number][:limit]]
        return page, "" if number + 1 == len(PAGES) else str(number + 1)

    def approve(self, preview_id: str, preview_hash: str, *, comment: str | None = None) -> ApprovalResult:
        if not any(preview_id in page for page in PAGES):
            return ApprovalResult(ok=False, error=ErrorInfo.of(ErrorCode.RESOURCE_NOT_FOUND, "no such preview"))
        return ApprovalResult(ok=True, preview=Preview(preview_id=preview_id, preview_hash=preview_hash,
                                                       call_json="{}", reason="r", expires_at="2026-12-01T10:15:00Z"))


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> PagedClient:
    fake = PagedClient()

    def with_client(args: argparse.Namespace, request: Callable[[Any], Any]) -> Any:
        return request(fake)

    monkeypatch.setattr(cli, "with_client", with_client)
    return fake


def test_approve_without_a_hash_reads_the_pages_up_to_the_one_it_approves(client: PagedClient,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["approve", "p-1-2", "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["preview"]["preview_hash"] == "sha256:p-1-2"
    assert client.listed == ["", "1"]  # not the pages after it


def test_approving_a_preview_no_page_lists_reads_every_page_and_says_so(client: PagedClient,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["approve", "p-9-9-unknown"]) == 3  # refused
    assert client.listed == ["", "1", "2", "3"]
    assert capsys.readouterr().err.strip() == ("toolbooth: error: preview 'p-9-9-unknown' is not among the pending "
                                               "previews you may approve; check the id, or pass --hash")
