"""A meter may not look back further than the call history is kept: such a set is refused where it loads (start,
hot reload, ``config validate``), not at its first call."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from sidecar.cli.root import main
from sidecar.config import PolicySettings, bundled_policy_dir
from sidecar.contract import ReloadStatus
from sidecar.errors import PolicyEvaluationError, PolicyLoadError
from sidecar.metrics import Metrics
from sidecar.policy import DelegatingEngine, PolicyEngine, Stage
from sidecar.policy.factory import meter_window_check, open_reloading, policy_source
from sidecar.policy.history import HistoryNeeds, Meter, MeterKey, check_meter_windows
from sidecar.policy.reload import PolicySource, ReloadingEngine
from tests.support.reloading import rewrite
from tests.unit.test_policy_reload import INPUT

WEEK = 168 * 3600  # store.history_retention_hours' default, in seconds
REFUSED = (f"meter 'writes_per_principal' of the policy looks back 900000 s, longer than the call history is kept "
           f"({WEEK} s: store.history_retention_hours); shorten its window_seconds or raise "
           f"store.history_retention_hours")


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    return Path(shutil.copytree(bundled_policy_dir(), tmp_path / "toolbooth"))


def set_window(policies: Path, seconds: int) -> None:
    """Make the bundled meter ``writes_per_principal`` look back ``seconds``."""
    data = json.loads((policies / "data.json").read_text())
    data["toolbooth"]["history"]["meters"]["writes_per_principal"]["window_seconds"] = seconds
    rewrite(policies / "data.json", json.dumps(data))


def needs(*windows: int) -> HistoryNeeds:
    return HistoryNeeds(tuple(Meter(f"m{index}", (MeterKey.PRINCIPAL,), window)
                              for index, window in enumerate(windows)))


class Closing(DelegatingEngine):
    """A loaded engine that remembers being closed."""

    closed = False

    async def aclose(self) -> None:
        self.closed = True
        await super().aclose()


class Recording:
    """A real policy source whose loaded engines are kept, to see which were closed."""

    def __init__(self, source: PolicySource) -> None:
        self.source, self.loaded = source, list[Closing]()
        self.description = source.description

    async def fingerprint(self) -> str:
        return await self.source.fingerprint()

    async def load(self) -> PolicyEngine:
        self.loaded.append(engine := Closing(await self.source.load()))
        return engine


class Unanswering(DelegatingEngine):
    """An engine whose server does not say what it meters."""

    async def history_needs(self) -> HistoryNeeds:
        raise PolicyEvaluationError("data.toolbooth.history: no answer within 1s")


# --- the check ------------------------------------------------------------------------------------------------


def test_meters_within_the_retention_pass() -> None:
    check_meter_windows(needs(60, WEEK), WEEK)
    check_meter_windows(HistoryNeeds(), 1)


def test_a_meter_looking_back_further_is_refused_naming_it_its_window_and_the_key() -> None:
    with pytest.raises(PolicyLoadError) as refused:
        check_meter_windows(HistoryNeeds((Meter("writes_per_principal", (MeterKey.PRINCIPAL,), 900000),)), WEEK)
    assert str(refused.value) == REFUSED


def test_a_retention_of_part_of_an_hour_is_shown_in_plain_seconds() -> None:
    with pytest.raises(PolicyLoadError, match=r"\(360 s: store\.history_retention_hours\)"):
        check_meter_windows(needs(60, 361), 0.1 * 3600)


async def test_the_check_reads_a_loaded_engines_meters(policies: Path) -> None:
    engine = await policy_source(PolicySettings(path=policies)).load()
    try:
        await meter_window_check(60)(engine)  # the bundled meter looks back 60 s
        with pytest.raises(PolicyLoadError, match="'writes_per_principal' of the policy looks back 60 s"):
            await meter_window_check(59)(engine)
    finally:
        await engine.aclose()


async def test_an_engine_that_cannot_say_what_it_meters_is_not_refused(policies: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    engine = Unanswering(await policy_source(PolicySettings(path=policies)).load())
    with caplog.at_level(logging.WARNING, "toolbooth.policy.reload"):
        await meter_window_check(1)(engine)  # each call checks its meters instead, failing closed
    assert "cannot read the meters of policy revision" in caplog.text and "no answer within 1s" in caplog.text
    await engine.aclose()


# --- at start -------------------------------------------------------------------------------------------------


async def test_start_refuses_the_set_and_closes_its_engine(policies: Path) -> None:
    set_window(policies, 900000)
    source = Recording(policy_source(PolicySettings(path=policies)))
    with pytest.raises(PolicyLoadError) as refused:
        await ReloadingEngine.start(source, meter_window_check(WEEK))
    assert str(refused.value) == REFUSED
    assert len(source.loaded) == 1 and source.loaded[0].closed


async def test_open_reloading_checks_the_windows_only_given_the_retention(policies: Path) -> None:
    set_window(policies, 900000)
    with pytest.raises(PolicyLoadError, match="looks back 900000 s"):
        await open_reloading(PolicySettings(path=policies), history_retention_seconds=WEEK)
    unchecked = await open_reloading(PolicySettings(path=policies))  # e.g. the dev tools, which keep no history
    assert unchecked.status.healthy
    await unchecked.aclose()


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("engine", ["embedded", "opa"])
def test_config_validate_refuses_the_set(tmp_path: Path, policies: Path, engine: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    set_window(policies, 7200)
    opa = "  opa:\n    url: http://127.0.0.1:8181\n" if engine == "opa" else ""  # not contacted
    config = tmp_path / "toolbooth.yaml"
    config.write_text(f"server:\n  listen: ['unix://{tmp_path}/tb.sock']\n"
                      f"store:\n  sqlite_path: {tmp_path}/tb.db\n  history_retention_hours: 1\n"
                      f"policy:\n  engine: {engine}\n  path: {policies}\n{opa}")
    assert main(["config", "validate", "--config", str(config)]) == 2
    assert ("meter 'writes_per_principal' of the policy looks back 7200 s, longer than the call history is kept "
            "(3600 s: store.history_retention_hours)") in capsys.readouterr().err


# --- on reload ------------------------------------------------------------------------------------------------


async def test_reload_refuses_the_set_the_old_revision_serves_and_the_refused_engine_is_closed(
        policies: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = Recording(policy_source(PolicySettings(path=policies)))
    engine = await ReloadingEngine.start(source, meter_window_check(WEEK))
    engine.metrics, reported, first = Metrics(), list[ReloadStatus](), engine.revision

    async def report(status: ReloadStatus) -> None:
        reported.append(status)

    engine.on_status = report
    set_window(policies, 900000)
    with caplog.at_level(logging.ERROR, "toolbooth.policy.reload"):
        status = await engine.reload_if_changed()
    assert not status.healthy and status.last_error == REFUSED and status.revision == first and reported == [status]
    assert f"policy reload refused, revision {first} keeps serving: {REFUSED}" in caplog.text
    assert engine.metrics.registry.get_sample_value("toolbooth_policy_reloads_total", {"result": "refused"}) == 1
    assert [loaded.closed for loaded in source.loaded] == [False, True]
    assert engine.revision == first and (await engine.decide(Stage.AVAILABILITY, INPUT)).allow
    assert [meter.window_seconds for meter in (await engine.history_needs()).meters] == [60]

    set_window(policies, WEEK)  # as long as the history is kept: loads
    loaded = await engine.reload_if_changed()
    assert loaded.healthy and engine.revision != first
    assert [meter.window_seconds for meter in (await engine.history_needs()).meters] == [WEEK]
    await engine.aclose()
