"""Stores and policy engines are each chosen in one table: the kind is told apart nowhere else.

``StoreSettings.kind`` derives a store's kind once, ``sidecar.state.backends`` opens and reaches each kind;
``sidecar.policy.engines`` opens and describes each ``policy.engine``. Every kind has its row, and no other
module of ``sidecar`` compares backends or engines.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import sidecar
from sidecar.config import PolicyEngineKind, PolicySettings, StoreSettings
from sidecar.config.base import default_state_dir
from sidecar.config.store import StoreKind
from sidecar.errors import PolicyLoadError, StoreUnavailableError
from sidecar.policy.engines import ENGINES, engine_for, open_candidate
from sidecar.state.backends import BACKENDS, backend_for

ROOT = Path(sidecar.__file__).parent
# What telling a store's backend or a policy engine apart looks like, and the modules whose job it is.
TELLING = {
    re.compile(r"postgres_dsn\s+is\b|isinstance\([^)]*(Sqlite|Postgres)(Store|Driver)"): {"config/store.py"},
    re.compile(r"\bengine\s+is\s+(not\s+)?PolicyEngineKind|isinstance\([^)]*(Embedded|Opa)Engine"): {
        "config/policy.py", "policy/engines.py"},
}


def test_every_kind_has_its_row() -> None:
    assert set(BACKENDS) == set(StoreKind)
    assert set(ENGINES) == set(PolicyEngineKind)


@pytest.mark.parametrize("pattern", list(TELLING), ids=["stores", "engines"])
def test_no_other_module_tells_the_kinds_apart(pattern: re.Pattern[str]) -> None:
    telling = sorted(path.relative_to(ROOT).as_posix() for path in ROOT.rglob("*.py")
                     if pattern.search(path.read_text()))
    assert set(telling) <= TELLING[pattern], telling


def test_the_store_kind_and_its_facts(tmp_path: Path) -> None:
    sqlite = StoreSettings(sqlite_path=tmp_path / "t.db")
    assert (sqlite.kind, sqlite.describe()) == (StoreKind.SQLITE, f"sqlite {tmp_path / 't.db'}")
    assert sqlite.journal_path() == tmp_path / "t.db.journal"
    assert sqlite.checkpoint_path() == tmp_path / "t.db.checkpoint"
    postgres = StoreSettings.model_validate({"postgres_dsn": "postgresql://app:s3cret@db/one", "pool_max_size": 4})
    assert postgres.kind is StoreKind.POSTGRES and postgres.dsn() == "postgresql://app:s3cret@db/one"
    assert postgres.describe() == "postgres postgresql://app@db/one (pool 1-4)"  # never the password
    assert postgres.checkpoint_path() == default_state_dir() / "audit.checkpoint"
    assert backend_for(sqlite) is BACKENDS[StoreKind.SQLITE] and backend_for(postgres) is BACKENDS[StoreKind.POSTGRES]


async def test_reaching_a_store_creates_nothing(tmp_path: Path) -> None:
    settings = StoreSettings(sqlite_path=tmp_path / "new" / "t.db")
    await backend_for(settings).reach(settings)
    assert not (tmp_path / "new").exists()
    (tmp_path / "t.db").write_text("not a database")
    broken = StoreSettings(sqlite_path=tmp_path / "t.db")
    with pytest.raises(StoreUnavailableError, match=rf"^cannot open SQLite store at {tmp_path / 't.db'}: "):
        await backend_for(broken).reach(broken)


async def test_a_postgres_store_that_does_not_answer_is_unreachable() -> None:
    settings = StoreSettings.model_validate({"postgres_dsn": "postgresql://app:s3cret@127.0.0.1:1/none",
                                             "connect_timeout_seconds": 1})
    with pytest.raises(StoreUnavailableError, match=r"^cannot reach the PostgreSQL store at "
                                                     r"postgresql://app@127\.0\.0\.1:1/none: ") as caught:
        await backend_for(settings).reach(settings)
    assert "s3cret" not in str(caught.value)


def test_the_engines_rows_describe_them() -> None:
    embedded = PolicySettings()
    opa = PolicySettings.model_validate({"engine": "opa", "opa": {"url": "http://opa:8181"}})
    managed = PolicySettings.model_validate({"engine": "opa", "opa": {"url": "http://opa:8181",
                                                                      "upload_policies": False}})
    assert [engine_for(s).label(s) for s in (embedded, opa, managed)] == [
        "embedded", "opa http://opa:8181", "opa http://opa:8181"]
    assert [engine_for(s).managed(s) for s in (embedded, opa, managed)] == [
        None, None, "OPA-managed policies at http://opa:8181"]
    assert [engine_for(s).contacts_server for s in (embedded, opa)] == [False, True]


async def test_a_candidate_cannot_be_sent_to_policies_opa_manages(tmp_path: Path) -> None:
    managed = PolicySettings.model_validate({"engine": "opa", "opa": {"url": "http://opa:8181",
                                                                      "upload_policies": False}})
    with pytest.raises(PolicyLoadError, match="upload_policies: false"):
        await open_candidate(managed, PolicySettings().path)
    with pytest.raises(PolicyLoadError, match=f"no policy directory or bundle at {tmp_path / 'none'}"):
        await open_candidate(PolicySettings(), tmp_path / "none")
