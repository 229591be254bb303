"""``isolation`` in the config: its keys, and the names it lists checked against the loaded tools.

An unknown plugin or tool, an async tool, a plugin without a sync tool and a handler a worker cannot
import by its path are each a ``ConfigError`` naming them, from the plan (``assemble``, so ``serve``)
and from ``config validate``, which starts no worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.bootstrap import open_pipeline
from sidecar.cli import main
from sidecar.config import IsolationSettings, parse_settings
from sidecar.errors import ConfigError
from sidecar.plugin import SideEffect, ToolContext, tool
from sidecar.tools.isolation.plan import isolation_plan
from sidecar.tools.registry import Registry
from tests.support import isolated, tools
from tests.support.isolated import Job, Ran

PLUGIN = "tests.support.isolated"
SYNC = sorted(defn.name for defn in isolated.SYNC)


def plan(registry: Registry, **isolation: Any) -> str:
    return isolation_plan(registry, IsolationSettings(**isolation)).describe()


def refused(registry: Registry, **isolation: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        isolation_plan(registry, IsolationSettings(**isolation))
    return str(info.value).splitlines()


@pytest.mark.parametrize(("raw", "expected"), [
    ({"workers_per_plugin": 0}, "config error at isolation.workers_per_plugin: Input should be greater than 0"),
    ({"workers_per_plugin": 65}, "config error at isolation.workers_per_plugin: Input should be less than or equal"),
    ({"stop_grace_seconds": -1}, "config error at isolation.stop_grace_seconds: Input should be greater than or"),
    ({"plugin": ["x"]}, "config error at isolation.plugin: unknown key"),
    ({"tools": "spin"}, "config error at isolation.tools: Input should be a valid tuple"),
])
def test_bad_keys_are_errors_naming_them(raw: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings({"isolation": raw})
    assert str(info.value).startswith(expected), info.value


def test_a_plugin_isolates_its_sync_tools_and_a_tool_itself() -> None:
    registry = Registry.from_tools([*isolated.ALL, tools.echo_sync, tools.echo])
    assert plan(registry) == "none"
    assert plan(registry, plugins=[PLUGIN]) == f"{PLUGIN} ({', '.join(SYNC)})"  # not async_job
    assert plan(registry, tools=["echo_sync", "spin"]) == f"{PLUGIN} (spin); tests.support.tools (echo_sync)"


def test_every_unknown_name_is_an_error_naming_it_and_what_is_loaded() -> None:
    registry = Registry.from_tools([isolated.whoami, isolated.spin])
    assert refused(registry, plugins=["nope", PLUGIN], tools=["spn", "spin"]) == [
        f"config error at isolation.plugins: 'nope' matches no loaded plugin; loaded: {PLUGIN}",
        "config error at isolation.tools: 'spn' is no loaded tool; loaded: spin, whoami",
    ]


def test_an_async_tool_cannot_be_isolated() -> None:
    registry = Registry.from_tools([*isolated.ALL, tools.echo])
    assert refused(registry, tools=["async_job"]) == [
        "config error at isolation.tools: tool 'async_job' has an async handler; only sync handlers run in worker "
        "processes (an async one is cancelled at its deadline)"]
    assert refused(registry, plugins=["tests.support.tools"]) == [
        "config error at isolation.plugins: plugin 'tests.support.tools' has no sync tool to isolate (async: echo; "
        "they are cancelled at their deadline)"]


def replaced(args: Job, ctx: ToolContext) -> Ran:
    raise AssertionError("never called")


REPLACED = tool(name="replaced", version="1.0.0", side_effect=SideEffect.NONE)(replaced)
replaced = isolated.whoami.handler  # the path of REPLACED's handler now leads elsewhere


def test_a_handler_a_worker_cannot_import_by_its_path_is_an_error() -> None:
    @tool(name="local", version="1.0.0", side_effect=SideEffect.NONE)
    def local(args: Job, ctx: ToolContext) -> Ran:
        raise AssertionError("never called")

    [nested] = refused(Registry.from_tools([local]), tools=["local"])
    assert nested.startswith("config error at isolation: tool 'local' cannot be isolated: its handler ")
    assert nested.endswith(".<locals>.local cannot be imported by a worker process (define it with def at the "
                           "top level of an importable module)")
    [elsewhere] = refused(Registry.from_tools([REPLACED]), tools=["replaced"])
    assert elsewhere.startswith("config error at isolation: tool 'replaced' cannot be isolated: its handler's path ")
    assert elsewhere.endswith(":replaced leads to another object than its handler")


async def test_serve_refuses_the_config_before_it_listens(tmp_path: Path) -> None:
    settings = parse_settings({"store": {"sqlite_path": str(tmp_path / "tb.db")}, "isolation": {"tools": ["nope"]}})
    with pytest.raises(ConfigError) as info:
        await open_pipeline(settings, registry=Registry.from_tools(isolated.ALL))
    assert str(info.value).startswith("config error at isolation.tools: 'nope' is no loaded tool")


@pytest.mark.parametrize(("isolation", "expected"), [
    ("tools: [calculate]", "toolbooth: error: config error at isolation.tools: tool 'calculate' has an async "
                           "handler; only sync handlers run in worker processes"),
    ("plugins: [calcualtor]", "toolbooth: error: config error at isolation.plugins: 'calcualtor' matches no loaded "
                              "plugin; loaded: calculator / toolbooth-calculator"),
])
def test_config_validate_and_serve_name_a_wrong_entry(clean_env: None, tmp_path: Path, isolation: str,
                                                      expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "toolbooth.yaml"
    config.write_text(f"store:\n  sqlite_path: {tmp_path}/tb.db\nplugins:\n  allow: [calculator]\n"
                      f"isolation:\n  {isolation}\n")
    assert main(["config", "validate", "--config", str(config)]) == 2
    assert capsys.readouterr().err.splitlines()[0].startswith(expected)
    assert main(["serve", "--config", str(config), "--listen", f"unix://{tmp_path}/tb.sock"]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(expected)
    assert not (tmp_path / "tb.sock").exists()


def test_config_validate_says_what_is_isolated(clean_env: None, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "toolbooth.yaml"
    config.write_text(f"store:\n  sqlite_path: {tmp_path}/tb.db\n")
    assert main(["config", "validate", "--config", str(config)]) == 0
    assert "  isolated: none\n" in capsys.readouterr().out
