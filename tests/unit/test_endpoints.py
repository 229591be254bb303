"""The table of endpoints (``sidecar.config.endpoints`` and ``sidecar.server.endpoints``) and what reads it: the
settings' dev-mode rule, the worker plan, the check of each extra."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from sidecar.config import Settings, parse_settings
from sidecar.config.endpoints import ENDPOINTS, EndpointRow, Workers, check_installed
from sidecar.errors import ConfigError
from sidecar.server.endpoints import KINDS, Phase
from sidecar.server.worker_plan import WorkerPlan

ROWS = {row.section: row for row in ENDPOINTS}
JWT = {"jwt": {"issuer": "i", "audience": "a", "key": "k", "algorithms": ["HS256"]}}


def test_both_tables_name_the_same_endpoints() -> None:
    assert list(KINDS) == list(ROWS)  # the same names, in the same order


def test_metrics_outlives_grpc_and_the_transports_run_within_it() -> None:
    assert {name: kind.phase for name, kind in KINDS.items()} == {
        "mcp": Phase.WITHIN_GRPC, "approvals_ui": Phase.WITHIN_GRPC, "http_json": Phase.WITHIN_GRPC,
        "metrics": Phase.AROUND_GRPC}


@pytest.mark.parametrize("row", ENDPOINTS, ids=lambda row: row.section)
def test_every_rows_key_is_a_setting_and_off_by_default(row: EndpointRow) -> None:
    assert row.section in Settings.model_fields
    assert row.listen(parse_settings({})) is None
    settings = parse_settings({row.section: {"listen": "127.0.0.1:0"}})
    assert row.listen(settings) == "127.0.0.1:0" and row.key == f"{row.section}.listen"


@pytest.mark.parametrize("row", ENDPOINTS, ids=lambda row: row.section)
def test_dev_mode_keeps_each_endpoint_on_loopback_unless_its_row_allows(row: EndpointRow) -> None:
    off_loopback = {row.section: {"listen": "0.0.0.0:8790"}}
    if row.dev_off_loopback:
        assert row.listen(parse_settings(off_loopback)) == "0.0.0.0:8790"
    else:
        with pytest.raises(ConfigError, match=rf"{row.key}: '0\.0\.0\.0:8790' is not a loopback address; auth mode "
                                              "'dev' trusts a static principal"):
            parse_settings(off_loopback)
    assert row.listen(parse_settings({**off_loopback, "auth": JWT})) == "0.0.0.0:8790"


def test_only_metrics_may_leave_loopback_in_dev_mode() -> None:
    assert [row.section for row in ENDPOINTS if row.dev_off_loopback] == ["metrics"]


def _plan(settings: Settings, shared: dict[str, str]) -> WorkerPlan:
    return WorkerPlan(settings, ("127.0.0.1:50051",), None, shared=shared)


@pytest.mark.parametrize("row", ENDPOINTS, ids=lambda row: row.section)
def test_the_worker_plan_places_each_endpoint_as_its_row_says(row: EndpointRow) -> None:
    settings = parse_settings({"server": {"listen": "127.0.0.1:50051", "workers": 3},
                               row.section: {"listen": "127.0.0.1:9100"}})
    plan = _plan(settings, {row.section: "127.0.0.1:9100"} if row.workers is Workers.SHARED else {})
    placed = [row.listen(plan.settings_for(index)) for index in range(3)]
    expected: dict[Workers, list[Any]] = {
        Workers.FIRST: ["127.0.0.1:9100", None, None],
        Workers.SHARED: ["127.0.0.1:9100"] * 3,
        Workers.PORT_EACH: ["127.0.0.1:9100", "127.0.0.1:9101", "127.0.0.1:9102"],
    }
    assert placed == expected[row.workers]


def test_every_worker_gets_the_one_port_reserved_for_a_shared_endpoint() -> None:
    settings = parse_settings({"server": {"listen": "127.0.0.1:0", "workers": 2},
                               "http_json": {"listen": "127.0.0.1:0"}})
    plan = WorkerPlan.reserve(settings)
    try:
        shared = plan.shared["http_json"]
        assert not shared.endswith(":0")
        assert [plan.settings_for(index).http_json.listen for index in range(2)] == [shared, shared]
    finally:
        plan.close()


@pytest.mark.parametrize("row", [row for row in ENDPOINTS if row.extra is not None], ids=lambda row: row.section)
def test_an_endpoint_on_without_its_extra_is_a_config_error(row: EndpointRow, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    gone = row.modules[-1]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == gone else real(name, *a))
    with pytest.raises(ConfigError, match=rf"^config error at {row.key}: serving .* needs the '{row.extra}' extra "
                                          rf"\(pip install 'toolbooth\[{row.extra}\]'\); missing: {gone}$"):
        check_installed(parse_settings({row.section: {"listen": "127.0.0.1:0"}}))
    check_installed(parse_settings({}))  # all off: nothing to need
