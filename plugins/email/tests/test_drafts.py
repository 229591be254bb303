"""The draft store on each backend (SQLite and PostgreSQL): the one-way life of a draft, one claim among racing
sidecars, and a database that fails."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

from sidecar.plugin import ConfigError, ErrorCode, ToolError
from tests.support.postgres import PASSWORD, closed_port_dsn
from tests.support.waiting import until
from toolbooth_email import send_email_preview
from toolbooth_email.drafts import Draft, DraftStore, DraftStoreError, PostgresDrafts, open_drafts
from toolbooth_email.models import EmailContent, Mailbox, SendEmailPreviewInput, SendEmailPreviewOutput

from .conftest import Configure, DraftsDb

RACERS = 8


async def saved(store: DraftStore, *, ttl: float = 900.0) -> Draft:
    content = EmailContent.model_validate({"from": Mailbox(email="toolbooth@example.com"),
                                           "recipients": [Mailbox(email="ana@example.com")], "cc": [], "bcc": [],
                                           "subject": "Hi", "body_text": "Hello."})
    now = time.time()
    preview = SendEmailPreviewOutput(preview_id=f"email_preview_{time.monotonic_ns()}", preview_hash="sha256:0",
                                     email=content, warnings=[], expires_at="2030-01-01T00:00:00Z")
    draft = Draft(preview.preview_id, "acme", "alice", preview, now, now + ttl)
    await store.save(draft)
    return draft


async def test_a_draft_is_claimed_once_released_only_by_its_claimer_and_settled_for_good(configure: Configure) -> None:
    store = open_drafts(configure.settings)
    draft = await saved(store)
    assert await store.get(draft.preview_id) == draft
    now = time.time()
    assert await store.claim(draft.preview_id, "key-1", now)
    assert not await store.claim(draft.preview_id, "key-2", now)  # any other key: claimed already
    await store.release(draft.preview_id, "key-2")  # not its claim: changes nothing
    assert (found := await store.get(draft.preview_id)) is not None and (found.state, found.send_key) == (
        "sending", "key-1")
    await store.release(draft.preview_id, "key-1")  # nothing was sent: pending again
    assert (found := await store.get(draft.preview_id)) is not None and (found.state, found.send_key) == (
        "pending", None)
    assert await store.claim(draft.preview_id, "key-2", now)
    await store.settle(draft.preview_id, "key-1", "unknown")  # not the claim of key-1 any more
    await store.settle(draft.preview_id, "key-2", "sent", '{"sent": true}')
    await store.release(draft.preview_id, "key-2")  # a settled draft is never pending again
    assert not await store.claim(draft.preview_id, "key-3", now)
    found = await store.get(draft.preview_id)
    assert found is not None and (found.state, found.send_key, found.result_json) == ("sent", "key-2",
                                                                                     '{"sent": true}')


async def test_an_expired_draft_cannot_be_claimed(configure: Configure) -> None:
    store = open_drafts(configure.settings)
    draft = await saved(store, ttl=60)
    assert not await store.claim(draft.preview_id, "key-1", draft.expires_at)
    assert await store.claim(draft.preview_id, "key-1", draft.expires_at - 1)


async def test_of_two_sidecars_racing_for_one_draft_exactly_one_claims_it(configure: Configure) -> None:
    # each its own connections, as two processes have
    sidecars = [open_drafts(configure.settings), open_drafts(configure.settings)]
    draft = await saved(sidecars[0])
    won = await asyncio.gather(*(sidecars[n % 2].claim(draft.preview_id, f"key-{n}", time.time())
                                 for n in range(RACERS)))
    assert won.count(True) == 1
    found = await sidecars[1].get(draft.preview_id)
    assert found is not None and found.state == "sending" and found.send_key == f"key-{won.index(True)}"


@pytest.mark.parametrize("drafts_db", ["postgres"], indirect=True)
async def test_postgres_claims_queued_on_the_row_lock_find_it_claimed(configure: Configure,
                                                                      drafts_db: DraftsDb) -> None:
    """Every claim waits on the draft's row lock, then the first re-reads it and takes it; all the others find it
    no longer pending (the update's condition is checked again on the row as it is after the wait)."""
    store = open_drafts(configure.settings)
    draft = await saved(store)
    async with await psycopg.AsyncConnection.connect(drafts_db.dsn) as holder:
        await holder.execute("SELECT 1 FROM email_drafts WHERE preview_id = %s FOR UPDATE", (draft.preview_id,))
        claims = [asyncio.create_task(open_drafts(configure.settings).claim(draft.preview_id, f"key-{n}", time.time()))
                  for n in range(RACERS)]

        async def all_waiting() -> bool:
            async with await psycopg.AsyncConnection.connect(drafts_db.dsn, autocommit=True) as probe:
                rows = await (await probe.execute(  # behind the holder, or behind a claim queued before them
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND cardinality(pg_blocking_pids(pid)) > 0")).fetchall()
            return bool(rows[0][0] >= RACERS)

        await until(all_waiting, what=f"{RACERS} claims waiting on the row lock")
        await holder.commit()
    won = await asyncio.gather(*claims)
    assert won.count(True) == 1


@pytest.mark.parametrize("drafts_db", ["postgres"], indirect=True)
async def test_an_unreachable_postgres_is_a_store_error_that_never_shows_the_dsn(configure: Configure,
                                                                                 drafts_db: DraftsDb,
                                                                                 make_context: Any) -> None:
    dsn = closed_port_dsn(drafts_db.dsn)
    with pytest.raises(DraftStoreError) as caught:
        await PostgresDrafts(dsn).get("email_preview_x")
    assert PASSWORD not in str(caught.value) and "127.0.0.1" not in str(caught.value)
    configure(drafts_dsn=dsn)
    mail = {"recipients": [{"email": "ana@example.com"}], "subject": "Hi", "body_text": "Hello."}
    with pytest.raises(ToolError) as refused:
        await send_email_preview(SendEmailPreviewInput.model_validate(mail), make_context())
    assert (refused.value.code, refused.value.retryable) == (ErrorCode.SERVICE_UNAVAILABLE, True)
    assert PASSWORD not in refused.value.message


def test_a_bad_dsn_names_the_key_and_not_the_password(configure: Configure) -> None:
    with pytest.raises(ConfigError, match=r"^config error at plugins\.config\.email\.drafts_dsn: not a PostgreSQL "
                                          r"connection string") as caught:
        configure(drafts_dsn=f"host=127.0.0.1 password={PASSWORD} nonsense")
    assert PASSWORD not in str(caught.value)
    settings = configure(drafts_dsn=f"postgresql://u:{PASSWORD}@127.0.0.1/db")
    assert PASSWORD not in repr(settings)
