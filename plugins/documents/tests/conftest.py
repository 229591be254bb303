"""Fixtures of the documents plugin's tests: an index on each backend, a corpus, real sidecars.

``settings`` is parametrized over SQLite (a file in ``tmp_path``) and PostgreSQL (a fresh schema of a
database of this session on the test server; required when ``CI=true``, else skipped if unreachable), and
points the plugin's variables (``TOOLBOOTH_PLUGINS__CONFIG__DOCUMENTS__*``) at it, so the installed plugin's
tools and ``toolbooth-documents`` use the same index. ``toolbooth_gate`` is the plugin test kit's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from plugins.documents.tests.support import (
    ENV_CURSOR_KEY_FILE,
    ENV_DB,
    ENV_POSTGRES_DSN,
    Corpus,
    Sidecars,
    configured,
)
from sidecar.plugin.fixtures import toolbooth_gate
from tests.contract.conftest import postgres  # the session's database on the test server (required when CI=true)
from tests.support.postgres import PostgresServer
from toolbooth_documents.index import Index, open_index
from toolbooth_documents.settings import IndexSettings

__all__ = ["postgres", "toolbooth_gate"]


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """None of the plugin's variables of whoever runs the tests; default paths inside ``tmp_path``."""
    for name in (ENV_DB, ENV_POSTGRES_DSN, ENV_CURSOR_KEY_FILE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


@pytest.fixture(params=["sqlite", "postgres"])
def settings(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> IndexSettings:
    """The index of this test, on one backend; the environment names it."""
    monkeypatch.setenv(ENV_DB, str(tmp_path / "index" / "documents.db"))
    if request.param == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres")
        monkeypatch.setenv(ENV_POSTGRES_DSN, server.new_schema())
    return configured()


@pytest.fixture
def index(settings: IndexSettings) -> Index:
    return open_index(settings)


@pytest.fixture
def corpus(index: Index, tmp_path: Path) -> Corpus:
    return Corpus(tmp_path / "corpus", index)


@pytest.fixture
async def sidecars(tmp_path: Path) -> AsyncIterator[Sidecars]:
    running = Sidecars(tmp_path)
    yield running
    await running.stop()


LONG = "# Long read\n\n" + "\n\n".join(f"Paragraph {n}: " + "words of the long document " * 12 for n in range(40))
"""A document of some 13,000 characters, in paragraphs."""


@pytest.fixture
async def documents(corpus: Corpus) -> Corpus:
    """Two tenants' documents: acme's projects alpha (one document restricted) and beta, globex's alpha and gamma."""
    await corpus.add("acme", "alpha", {
        "plan.md": "# Launch plan\nThe launch of the sidecar is planned for May.\n",
        "long.md": LONG,
        "notes.md": "# Meeting notes\nWe discussed the launch checklist and the rollback plan.\n",
    })
    await corpus.add("acme", "alpha", {"budget.md": "# Launch budget review\nsecret: the salary figures are 12345\n"},
                     restricted=True)
    await corpus.add("acme", "beta", {"beta.md": "# Beta launch\nThe beta launch notes.\n"})
    await corpus.add("globex", "alpha", {"globex.md": "# Globex launch\nGlobex launch secrets.\n"})
    await corpus.add("globex", "gamma", {"gamma.md": "# Gamma\nnothing about it\n"})
    return corpus


@pytest.fixture
async def address(documents: Corpus, sidecars: Sidecars) -> str:
    """A sidecar serving the installed plugin (its entry point) over ``documents``."""
    return await sidecars.start()
