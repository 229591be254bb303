"""The local journal (``sidecar.state.journal``) and lasting writes (``sidecar.state.lasting``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli.preflight import preflight
from sidecar.config import parse_settings
from sidecar.errors import StoreRefusedError, StoreUnavailableError
from sidecar.state import AuditEvent, KeyScope, lasting
from sidecar.state.audit import AuditBatcher
from sidecar.state.chain import EVENT_COLUMNS, LATER_COLUMNS
from sidecar.state.driver import Row
from sidecar.state.journal import AuditRows, Completion, Journal, JournalEntry, Release, Write
from sidecar.state.lasting import Lasting
from tests.support.waiting import until

SCOPE = KeyScope("acme", "dev-1", "create_note", "key-1")
STORE = "sqlite /srv/toolbooth.db"


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lasting, "RETRY_SECONDS", 0.05)


class FlakyStore:
    """Takes writes while ``up``; refuses those naming a text in ``refused`` as data."""

    def __init__(self) -> None:
        self.up, self.taken, self.refused = True, list[Write](), set[str]()

    async def apply(self, write: Write) -> None:
        if isinstance(write, Completion) and write.result_json in self.refused:
            raise StoreRefusedError("refused: the data")
        if isinstance(write, AuditRows) and any(row[0] in self.refused for row in write.rows):
            raise StoreRefusedError("refused: a row")
        if not self.up:
            raise StoreUnavailableError("store down")
        self.taken.append(write)

    @property
    def rows(self) -> list[Row]:
        """The audit rows taken, in the order they were appended."""
        return [row for write in self.taken if isinstance(write, AuditRows) for row in write.rows]


def journal(tmp_path: Path, store: str = STORE) -> Journal:
    return Journal.open(tmp_path / "state" / "kept.journal", store)


async def test_kept_writes_survive_reopening_in_order(tmp_path: Path) -> None:
    kept = journal(tmp_path)
    writes: list[Write] = [Completion(SCOPE, "r1", '{"status":"success"}'), AuditRows((("r1", 1, None, 2.5),)),
                           Release(SCOPE, "r2")]
    for write in writes:
        await kept.keep(write)
    assert (kept.size, kept.outcomes) == (3, 2)
    kept.close()
    again = journal(tmp_path)
    assert (again.size, again.outcomes) == (3, 2)
    entries = await again.entries()
    assert [entry.write for entry in entries] == writes
    await again.forget(entries[0])
    await again.forget(entries[1])
    assert (again.size, again.outcomes) == (1, 1)
    again.close()


async def test_a_journal_of_another_store_is_refused_while_it_holds_writes(tmp_path: Path) -> None:
    kept = journal(tmp_path)
    await kept.keep(Release(SCOPE, "r1"))
    kept.close()
    with pytest.raises(StoreUnavailableError) as info:
        journal(tmp_path, "postgresql://app@db:5432/other")
    assert str(info.value) == (
        f"the local journal at {tmp_path / 'state' / 'kept.journal'} holds 1 write(s) of another store ({STORE}), "
        "not of postgresql://app@db:5432/other: start with that store to apply them, or set store.journal_file "
        "to another file")
    with pytest.raises(StoreUnavailableError, match="holds 1 write"):
        Journal.check(tmp_path / "state" / "kept.journal", "postgresql://app@db:5432/other")
    emptied = journal(tmp_path)
    await emptied.forget((await emptied.entries())[0])
    emptied.close()
    journal(tmp_path, "postgresql://app@db:5432/other").close()  # empty: it now belongs to the other store


async def test_a_journal_in_use_gets_a_spare_whose_writes_the_next_start_adopts(tmp_path: Path) -> None:
    first = journal(tmp_path)
    second = journal(tmp_path)  # another sidecar of the same database on this host
    assert second.path == first.path.with_name("kept.journal.1")
    await second.keep(Release(SCOPE, "r-second"))
    second.close()  # it stops with a write kept
    empty = journal(tmp_path)
    assert empty.path == second.path  # the spare again; nobody adopted its write while in use
    assert empty.size == 1
    third = journal(tmp_path)
    assert third.path == first.path.with_name("kept.journal.2")
    third.close()
    assert not third.path.exists()  # an empty spare is removed
    empty.close()
    first.close()
    adopting = journal(tmp_path)
    assert adopting.path == first.path and adopting.size == 1 and not second.path.exists()
    assert [entry.write for entry in await adopting.entries()] == [Release(SCOPE, "r-second")]
    adopting.close()


def test_a_journal_that_cannot_be_opened_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreUnavailableError, match=r"cannot open the local journal at .*file/kept.journal"):
        Journal.open(tmp_path / "file" / "kept.journal", STORE)
    (tmp_path / "garbage.journal").write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreUnavailableError, match=r"cannot open the local journal at .*garbage.journal: file is "
                                                    "not a database"):
        Journal.open(tmp_path / "garbage.journal", STORE)


async def test_config_validate_checks_the_journal(tmp_path: Path) -> None:
    settings = parse_settings({"store": {"sqlite_path": str(tmp_path / "db"),
                                         "journal_file": str(tmp_path / "garbage.journal")}})
    (tmp_path / "garbage.journal").write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreUnavailableError, match=r"cannot open the local journal at .*garbage.journal"):
        await preflight(settings)


def test_the_default_journal_belongs_to_its_database(tmp_path: Path) -> None:
    sqlite = parse_settings({"store": {"sqlite_path": str(tmp_path / "t.db")}}).store
    assert sqlite.journal_path() == tmp_path / "t.db.journal"
    one, other = (parse_settings({"store": {"postgres_dsn": f"postgresql://app:pw@db:5432/{name}"}}).store
                  for name in ("one", "other"))
    assert one.journal_path() != other.journal_path() and one.journal_path().parent == other.journal_path().parent
    assert one.identity() == "postgresql://app@db:5432/one"  # never the password


async def test_a_write_the_store_cannot_take_is_kept_then_applied(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    store, kept = FlakyStore(), journal(tmp_path)
    writes = Lasting(store.apply, kept)
    store.up = False
    await writes.write(Completion(SCOPE, "r1", "{}"))
    assert kept.size == 1 and writes.behind and "kept in the local journal" in caplog.text
    with pytest.raises(StoreUnavailableError):
        await writes.catch_up()
    store.up = True
    await until(lambda: not writes.behind, timeout=10, what="the background replay")
    assert store.taken == [Completion(SCOPE, "r1", "{}")]
    await writes.aclose()


async def test_audit_rows_join_the_kept_writes_in_order(tmp_path: Path) -> None:
    store, kept = FlakyStore(), journal(tmp_path)
    writes = Lasting(store.apply, kept)
    store.up = False
    first, second = AuditRows((("a",),)), AuditRows((("b",),))
    await writes.write(first)
    store.up = True
    await writes.write(second)  # the store is up, but the first one is still kept: the second follows it
    assert store.taken == [] and kept.size == 2
    await writes.catch_up()  # outcomes only: audit rows are applied in the background
    assert store.taken == []
    await writes.catch_up(audit=True)
    assert store.rows == [*first.rows, *second.rows]
    await writes.aclose()


async def test_refused_data_is_neither_retried_nor_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store, kept = FlakyStore(), journal(tmp_path)
    writes = Lasting(store.apply, kept)
    store.refused.add("bad")
    with pytest.raises(StoreRefusedError):
        await writes.write(Completion(SCOPE, "r1", "bad"))
    assert kept.size == 0
    await kept.keep(Completion(SCOPE, "r2", "bad"))  # kept by an earlier version, say: dropped when applied
    await kept.keep(Release(SCOPE, "r3"))
    with caplog.at_level(logging.ERROR):
        await writes.catch_up()
    assert store.taken == [Release(SCOPE, "r3")] and kept.size == 0
    assert "refused by the store, dropped" in caplog.text
    await writes.aclose()


async def test_without_a_journal_a_failing_write_raises() -> None:
    store = FlakyStore()
    store.up = False
    with pytest.raises(StoreUnavailableError, match="store down"):
        await Lasting(store.apply).write(Release(SCOPE, "r1"))


async def test_shutdown_with_the_store_down_is_not_held_up(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    async def down(write: Write) -> None:
        nonlocal calls
        calls += 1
        raise StoreUnavailableError("store down")

    kept = journal(tmp_path)
    writes = Lasting(down, kept)
    await writes.write(Release(SCOPE, "r1"))
    tried = calls
    await writes.aclose()  # the last try failed: shutdown does not try again
    assert calls == tried and "stay in the local journal" in caplog.text
    assert journal(tmp_path).size == 1  # for the next start


async def test_a_batch_nothing_can_take_is_dropped_whole_not_row_by_row(caplog: pytest.LogCaptureFixture) -> None:
    tries: list[int] = []

    async def unwritable(rows: list[Row]) -> None:
        tries.append(len(rows))
        raise StoreUnavailableError("the store and the local journal are both failing")

    batcher = AuditBatcher(unwritable)
    for n in range(3):
        batcher.put(AuditEvent(request_id=f"r{n}", time="t", principal_id="p", tenant="t", tool="x",
                               tool_version="1", input_hash="h", decisions_json="[]", policy_revision="v",
                               idempotency_key=None, call_id=None, conversation_id=None, status="success",
                               error_code=None, duration_ms=1, arguments_json=None))
    await batcher.flush()
    assert tries == [3] and "3 audit event(s) could not be written, dropped" in caplog.text


async def test_audit_rows_kept_before_the_decision_log_get_its_columns_unset(tmp_path: Path) -> None:
    """A journal written by a release before ``decision_ids`` and ``decision_input`` holds rows without them."""
    former = tuple(f"v{n}" for n in range(len(EVENT_COLUMNS) - len(LATER_COLUMNS)))
    kept = journal(tmp_path)
    await kept.keep(AuditRows((former,)))
    kept.close()
    [entry] = await journal(tmp_path).entries()
    assert entry.write == AuditRows(((*former, None, None),))


async def test_callers_waiting_to_catch_up_share_the_failure_of_the_try_in_front(tmp_path: Path) -> None:
    kept, tries, gate = journal(tmp_path), 0, asyncio.Event()

    async def slowly_down(write: Write) -> None:
        nonlocal tries
        tries += 1
        await gate.wait()  # a store that takes its time to fail (the pool's wait for a connection)
        raise StoreUnavailableError("store down")

    writes = Lasting(slowly_down, kept)
    await kept.keep(Release(SCOPE, "r1"))
    callers = [asyncio.create_task(writes.catch_up()) for _ in range(8)]
    await until(lambda: tries == 1, what="the first try")
    gate.set()
    failures = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(failure, StoreUnavailableError) for failure in failures), failures
    assert tries == 1, "each waiting caller tried the failing store again in turn"
    assert "store down" in str(failures[-1])
    await writes.aclose()


async def test_a_later_caller_tries_again_after_a_failure_it_did_not_wait_for(tmp_path: Path) -> None:
    store, kept = FlakyStore(), journal(tmp_path)
    writes = Lasting(store.apply, kept)
    await kept.keep(Release(SCOPE, "r1"))
    store.up = False
    with pytest.raises(StoreUnavailableError):
        await writes.catch_up()
    store.up = True
    await writes.catch_up()
    assert store.taken == [Release(SCOPE, "r1")]
    await writes.aclose()


async def test_kept_outcomes_are_applied_before_the_audit_rows_kept_ahead_of_them(tmp_path: Path) -> None:
    store, kept = FlakyStore(), journal(tmp_path)
    writes = Lasting(store.apply, kept)
    rows = AuditRows((("a",),))
    await kept.keep(rows)
    await kept.keep(Completion(SCOPE, "r1", "{}"))
    await writes.catch_up(audit=True)
    assert store.taken == [Completion(SCOPE, "r1", "{}"), rows] and kept.size == 0
    await writes.aclose()


class ReadCounting:
    """Wraps a journal's ``entries`` and ``forget``: the sizes of the pages read, whether an audit entry was among
    them, and how many entries each ``forget`` removed."""

    def __init__(self, kept: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pages: list[int] = []
        self.forgotten: list[int] = []
        self.audit_read = False
        read, forget = kept.entries, kept.forget

        async def entries(**kwargs: Any) -> list[JournalEntry]:
            page = await read(**kwargs)
            self.pages.append(len(page))
            self.audit_read |= any(isinstance(entry.write, AuditRows) for entry in page)
            return page

        async def forgetting(*entries: JournalEntry) -> None:
            self.forgotten.append(len(entries))
            await forget(*entries)

        monkeypatch.setattr(kept, "entries", entries)
        monkeypatch.setattr(kept, "forget", forgetting)


async def test_a_long_outage_is_applied_a_page_at_a_time_in_order(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    store, kept = FlakyStore(), journal(tmp_path)
    writes = Lasting(store.apply, kept)
    backlog = [AuditRows(((f"event-{n}",),)) for n in range(5 * lasting.PAGE + 3)]
    for rows in backlog:
        await kept.keep(rows)
    reads = ReadCounting(kept, monkeypatch)
    await writes.catch_up(audit=True)
    assert store.rows == [row for rows in backlog for row in rows.rows] and kept.size == 0
    assert max(reads.pages) == lasting.PAGE, "a catch-up held more of the journal in memory than a page"
    assert len(store.taken) == 6, "each page of kept rows is appended as one batch (one transaction)"
    assert reads.forgotten == [lasting.PAGE] * 5 + [3], "each page is forgotten in one journal transaction"
    await writes.aclose()


async def test_a_row_the_store_refuses_drops_its_entry_alone_from_a_page(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    store, kept = FlakyStore(), journal(tmp_path)
    writes = Lasting(store.apply, kept)
    backlog = [AuditRows(((f"event-{n}",),)) for n in range(4)]
    for rows in backlog:
        await kept.keep(rows)
    store.refused.add("event-2")
    await writes.catch_up(audit=True)
    assert store.rows == [("event-0",), ("event-1",), ("event-3",)] and kept.size == 0
    assert "refused by the store, dropped" in caplog.text
    await writes.aclose()


async def test_a_keyed_call_catching_up_reads_no_kept_audit_rows(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A keyed call applies the kept outcomes before it claims: the audit rows of an outage are not read on its
    way (they are the background replay's)."""
    store, kept = FlakyStore(), journal(tmp_path)
    writes = Lasting(store.apply, kept)
    for n in range(3 * lasting.PAGE):
        await kept.keep(AuditRows(((f"event-{n}",),)))
    await kept.keep(Completion(SCOPE, "r1", "{}"))
    reads = ReadCounting(kept, monkeypatch)
    await writes.catch_up()
    assert store.taken == [Completion(SCOPE, "r1", "{}")] and (kept.size, kept.outcomes) == (3 * lasting.PAGE, 0)
    assert not reads.audit_read
    kept.close()


async def test_rows_kept_while_a_catch_up_runs_are_left_to_the_next(tmp_path: Path) -> None:
    """A pass applies what was kept when it began: a journal that keeps growing under load does not hold the
    callers waiting for their turn."""
    kept = journal(tmp_path)
    taken: list[Write] = []
    late = AuditRows((("late",),))

    async def apply(write: Write) -> None:
        if not taken:
            await kept.keep(late)  # audit rows join the journal while it is being applied
        taken.append(write)

    writes = Lasting(apply, kept)
    first = AuditRows((("first",),))
    await kept.keep(first)
    await writes.catch_up(audit=True)
    assert taken == [first] and kept.size == 1
    await writes.catch_up(audit=True)
    assert taken == [first, late] and kept.size == 0
    await writes.aclose()


async def test_a_journal_kept_before_its_index_existed_opens_with_its_writes(tmp_path: Path) -> None:
    path = tmp_path / "state" / "kept.journal"
    path.parent.mkdir()
    with contextlib.closing(sqlite3.connect(path)) as old, old:  # the schema before pending_by_kind
        old.executescript("CREATE TABLE pending (id INTEGER PRIMARY KEY AUTOINCREMENT, outcome INTEGER NOT NULL, "
                          "entry TEXT NOT NULL); CREATE TABLE owner (id INTEGER PRIMARY KEY CHECK (id = 1), "
                          "store TEXT NOT NULL)")
        old.execute("INSERT INTO pending (outcome, entry) VALUES (1, ?)",
                    ('{"kind":"release","scope":["acme","dev-1","create_note","key-1"],"request_id":"r1"}',))
    kept = journal(tmp_path)
    assert (kept.size, kept.outcomes, kept.newest) == (1, 1, 1)
    assert [entry.write for entry in await kept.entries(outcomes=True)] == [Release(SCOPE, "r1")]
    assert await kept.entries(outcomes=False) == []
    kept.close()
    with contextlib.closing(sqlite3.connect(path)) as reopened:
        assert reopened.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND name = 'pending_by_kind'"
                                ).fetchone() is not None



async def test_once_the_store_is_back_the_replay_tries_again_at_once(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The pause between tries grows while the store is down; a try that succeeds starts it over. Otherwise, after
    an outage, the rows a loaded sidecar keeps adding waited the longest pause between passes, and every audit
    batch went through the journal for as long as the load lasted."""
    store, kept = FlakyStore(), journal(tmp_path)
    writes = Lasting(store.apply, kept)
    pauses: list[float] = []
    arrivals = 3  # batches that join the journal while a pass applies (a loaded sidecar's audit rows)

    async def rest(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 5:
            store.up = True
        await asyncio.sleep(0)

    async def apply(write: Write) -> None:
        nonlocal arrivals
        await store.apply(write)
        if arrivals:
            arrivals -= 1
            await kept.keep(AuditRows(((f"late-{arrivals}",),)))

    monkeypatch.setattr(writes, "_rest", rest)
    monkeypatch.setattr(writes, "_apply", apply)
    store.up = False
    await writes.write(AuditRows((("during the outage",),)))
    await until(lambda: not writes.behind, what="the journal emptied")
    first = lasting._FIRST_PAUSE_SECONDS
    assert pauses == [first, 2 * first, 4 * first, 8 * first, 16 * first, first, first, first]
    assert store.rows == [("during the outage",), ("late-2",), ("late-1",), ("late-0",)]
    await writes.aclose()


async def test_a_row_the_chain_refuses_drops_its_entry_alone_and_says_why(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Not the store's refusal of the data but any other failure of one write (a row the chain refuses): the page
    goes entry by entry, the entry is dropped and the log says it could not be applied, and why."""
    kept = journal(tmp_path)
    taken: list[Row] = []

    async def apply(write: Write) -> None:
        assert isinstance(write, AuditRows)
        if ("broken",) in write.rows:
            raise ValueError("the chain refuses this row")
        taken.extend(write.rows)

    writes = Lasting(apply, kept)
    for row in (("before",), ("broken",), ("after",)):
        await kept.keep(AuditRows((row,)))
    with caplog.at_level(logging.ERROR):
        await writes.catch_up(audit=True)
    assert taken == [("before",), ("after",)] and kept.size == 0
    assert "a write kept in the local journal cannot be applied, dropped: the chain refuses this row" in caplog.text
    await writes.aclose()


async def test_a_journal_that_cannot_forget_rolls_back_and_keeps_what_it_holds(tmp_path: Path) -> None:
    kept = journal(tmp_path)
    await kept.keep(Release(SCOPE, "r1"))
    [entry] = await kept.entries()
    with contextlib.closing(sqlite3.connect(kept.path, timeout=0)) as other:
        other.execute("BEGIN IMMEDIATE")  # another writer holds the file: the removal cannot take its lock
        with pytest.raises(StoreUnavailableError, match="cannot be written: database is locked"):
            await kept.forget(entry)
        other.execute("ROLLBACK")
    assert (kept.size, kept.outcomes) == (1, 1)
    await kept.forget(entry)
    assert (kept.size, kept.outcomes) == (0, 0) and await kept.entries() == []
    kept.close()
