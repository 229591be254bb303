"""Fixtures shared by unit and integration tests."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.bootstrap import assemble
from sidecar.config import Limits, bundled_policy_dir
from sidecar.contract import Principal
from sidecar.pipeline import Pipeline
from sidecar.pipeline.order import Stages
from sidecar.policy import PolicyEngine
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.state import Store
from sidecar.state.sqlite import SqliteStore
from sidecar.tools.registry import Registry
from tests.support import image_build, tools
from tests.support.cli import cli_env, short_dir
from tests.support.required import missing

DEVELOPER = Principal(id="dev-1", tenant="acme", roles=("developer",))
ADMIN = Principal(id="admin-1", tenant="acme", roles=("admin",))

PipelineFactory = Callable[..., Awaitable[Pipeline]]


@pytest.fixture(scope="session")
def image() -> Iterator[str]:
    """The image built from the repository once for the session (``tests/support/image_build.py``), tagged
    uniquely; removed at its end."""
    if lacking := image_build.missing():
        missing(lacking, install=image_build.INSTALL)
    tag = f"localhost/toolbooth-test:{uuid.uuid4().hex[:12]}"
    try:
        print(f"built {tag} in {image_build.build(tag):.0f} s")
        yield tag
    finally:
        image_build.remove(tag)


@pytest.fixture
def home() -> Iterator[Path]:
    """A short directory for a command-line test's sidecar (its socket path fits a Unix socket's limit)."""
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def env(home: Path) -> dict[str, str]:
    """The environment a ``toolbooth`` command of a test runs in (``cli_env``)."""
    return cli_env(home)


@pytest.fixture(autouse=True, scope="session")
def _state_outside_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test writes the default state directory of whoever runs the suite (sidecars it starts inherit this)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state-home")))
        yield


@pytest.fixture
def bundled_policies(tmp_path: Path) -> Path:
    """A copy of the bundled policies taken as the test starts: a test that reads them more than once (to compare
    revisions, to put back a module it broke) reads one version of them, even while ``policies/`` is edited."""
    return Path(shutil.copytree(bundled_policy_dir(), tmp_path / "bundled-policies"))


@pytest.fixture
def default_engine() -> EmbeddedEngine:
    return EmbeddedEngine.load(bundled_policy_dir())


@pytest.fixture
async def make_pipeline(tmp_path: Path) -> AsyncIterator[PipelineFactory]:
    """Build pipelines over the test tools, a fresh SQLite store (seen through ``wrap_store``, if given) and
    (by default) the default policies."""
    made: list[Pipeline] = []

    async def make(*, policy: PolicyEngine | None = None, limits: Limits | None = None,
                   registry: Registry | None = None, wrap_store: Callable[[Store], Any] | None = None,
                   stages: Stages | None = None, **limit_overrides: Any) -> Pipeline:
        store: Any = await SqliteStore.open(tmp_path / f"store-{len(made)}.db")
        pipeline = assemble(
            registry=registry or Registry.from_tools(tools.ALL),
            policy=policy or EmbeddedEngine.load(bundled_policy_dir()),
            store=store if wrap_store is None else wrap_store(store),
            limits=limits or Limits(**limit_overrides),
            stages=stages,
        )
        made.append(pipeline)
        return pipeline

    yield make
    for pipeline in made:
        await pipeline.aclose()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No TOOLBOOTH_* variables from the caller; default paths inside ``tmp_path``."""
    for name in list(os.environ):
        if name.startswith("TOOLBOOTH_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


@pytest.fixture
def store_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], Path]:
    """``store_config(db)``: a config file whose SQLite store is ``db`` (the default state dir kept in tmp)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def write(db: Path) -> Path:
        path = tmp_path / "toolbooth.yaml"
        path.write_text(f"store:\n  sqlite_path: {db}\n")
        return path

    return write
