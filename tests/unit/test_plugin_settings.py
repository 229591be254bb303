"""Plugin settings: a ``Plugin(tools, settings=Model)`` configured from ``plugins.config.<entry point>`` of the
config file and ``TOOLBOOTH_PLUGINS__CONFIG__...`` variables, validated when it loads; every wrong input is a
``ConfigError`` naming its full key path."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from sidecar.config import load_settings, parse_settings
from sidecar.errors import ConfigError, PluginLoadError
from sidecar.plugin import (
    Plugin,
    PluginDefinitionError,
    Principal,
    SideEffect,
    ToolContext,
    read_plugin_settings,
    tool,
)
from sidecar.tools.registry import Registry
from tests.support.installed import install, site

__all__ = ["site"]  # the fixture

PLUGIN_MODULE = '''
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from sidecar.plugin import Plugin, SideEffect, ToolContext, tool

class Smtp(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    host: str
    port: int = Field(default=25, ge=1, le=65535)

class MailSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    smtp: Smtp = Smtp(host="localhost")
    password: SecretStr | None = None

class Out(BaseModel):
    host: str
    port: int

@tool(name="mail_settings", version="1.0.0", side_effect=SideEffect.NONE)
async def show(args: Out, ctx: ToolContext) -> Out:
    smtp = ctx.plugin_settings(MailSettings).smtp
    return Out(host=smtp.host, port=smtp.port)

PLUGIN = Plugin([show], settings=MailSettings)
'''

PLAIN_MODULE = '''
from pydantic import BaseModel
from sidecar.plugin import SideEffect, ToolContext, tool

class In(BaseModel):
    x: int = 0

@tool(name="plain_tool", version="1.0.0", side_effect=SideEffect.NONE)
async def handler(args: In, ctx: ToolContext) -> In:
    return args

TOOLS = [handler]
'''


@pytest.fixture
def installed(site: Path) -> Path:
    """Two plugins: ``mail`` (settings ``MailSettings``) and ``plain`` (a list of tools, no settings)."""
    install(site, "tb-mail", "tb_mail", {"mail": "tb_mail:PLUGIN"}, PLUGIN_MODULE)
    install(site, "tb-plain", "tb_plain", {"plain": "tb_plain:TOOLS"}, PLAIN_MODULE)
    return site


def registry(raw: dict[str, Any], env: dict[str, str] | None = None, tmp: Path | None = None) -> Registry:
    """The two test plugins under the settings of ``raw`` (a config file's contents) and ``env``."""
    if env is None:
        return Registry.for_settings(parse_settings({"plugins": {"allow": ["mail", "plain"], **raw}}))
    assert tmp is not None
    config = tmp / "toolbooth.yaml"
    config.write_text(_yaml({"plugins": {"allow": ["mail", "plain"], **raw}}))
    return Registry.for_settings(load_settings(config, env))


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data)


def bound(reg: Registry) -> Any:
    defn = reg.get("mail_settings")
    assert defn is not None
    return defn.settings


def context(settings: BaseModel | None = None) -> ToolContext:
    return ToolContext(principal=Principal(id="u"), request_id="r", deadline=time.monotonic() + 5,
                       idempotency_key=None, attempt=1, logger=logging.LoggerAdapter(logging.getLogger("t")),
                       settings=settings)


# --- what a plugin gets ----------------------------------------------------------------------------------


def test_a_section_is_validated_and_bound_to_every_tool_of_the_plugin(installed: Path) -> None:
    settings = bound(registry({"config": {"mail": {"smtp": {"host": "mx.example", "port": 587}}}}))
    assert (settings.smtp.host, settings.smtp.port) == ("mx.example", 587)
    assert type(settings).__name__ == "MailSettings"


def test_without_a_section_the_plugin_gets_the_defaults(installed: Path) -> None:
    assert bound(registry({})).smtp.host == "localhost"
    assert bound(registry({"config": {"mail": None}})).smtp.port == 25  # ``mail:`` with nothing under it


def test_a_tool_of_a_plugin_without_settings_gets_none(installed: Path) -> None:
    defn = registry({}).get("plain_tool")
    assert defn is not None and defn.settings is None


def test_variables_follow_the_sidecars_convention_and_win_over_the_file(installed: Path, tmp_path: Path) -> None:
    env = {"TOOLBOOTH_PLUGINS__CONFIG__MAIL__SMTP__PORT": "2525", "TOOLBOOTH_PLUGINS__CONFIG__MAIL__PASSWORD": "pw"}
    settings = bound(registry({"config": {"mail": {"smtp": {"host": "mx", "port": 587}}}}, env, tmp_path))
    assert (settings.smtp.host, settings.smtp.port) == ("mx", 2525)
    assert isinstance(settings.password, SecretStr) and settings.password.get_secret_value() == "pw"


async def test_the_handler_reads_its_settings_from_the_context(installed: Path) -> None:
    defn = registry({"config": {"mail": {"smtp": {"host": "mx.example"}}}}).get("mail_settings")
    assert defn is not None
    out = await defn.handler(defn.input_model(host="", port=1), context(defn.settings))
    assert out.model_dump() == {"host": "mx.example", "port": 25}


class Other(BaseModel):
    model_config = ConfigDict(extra="forbid")


def test_plugin_settings_of_another_model_or_none_is_a_type_error_naming_the_fix() -> None:
    with pytest.raises(TypeError, match=r"holds no Other settings \(it holds NoneType\): register the plugin as "
                                        r"Plugin\(tools, settings=Other\)"):
        context().plugin_settings(Other)
    assert context(Other()).plugin_settings(Other) == Other()


# --- every wrong input, with the error the operator sees ------------------------------------------------


@pytest.mark.parametrize(("section", "message"), [
    ({"smtp": {"host": "mx", "port": 70000}},
     "config error at plugins.config.mail.smtp.port: Input should be less than or equal to 65535"),
    ({"smtp": {"port": 587}}, "config error at plugins.config.mail.smtp.host: Field required"),
    ({"smtp": {"host": "mx", "colour": "blue"}}, "config error at plugins.config.mail.smtp.colour: unknown key"),
    ({"smpt": {"host": "mx"}}, "config error at plugins.config.mail.smpt: unknown key"),
    ({"smtp": "mx"},
     "config error at plugins.config.mail.smtp: Input should be a valid dictionary or instance of Smtp"),
])
def test_a_wrong_section_names_the_full_key_path(installed: Path, section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        registry({"config": {"mail": section}})
    assert str(caught.value) == message


def test_a_wrong_value_from_a_variable_names_the_variable(installed: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        registry({"config": {"mail": {"smtp": {"host": "mx"}}}}, {"TOOLBOOTH_PLUGINS__CONFIG__MAIL__SMTP__PORT": "0"},
                 tmp_path)
    assert str(caught.value) == ("config error at plugins.config.mail.smtp.port "
                                 "(from TOOLBOOTH_PLUGINS__CONFIG__MAIL__SMTP__PORT): Input should be greater than or "
                                 "equal to 1")


def test_a_section_of_a_plugin_that_is_not_loaded_is_an_error_naming_it(installed: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        registry({"config": {"mial": {}, "mail": {}}})
    assert str(caught.value) == ("config error at plugins.config.mial: no plugin 'mial' is loaded (sections are "
                                 "named by toolbooth.tools entry point; loaded: mail, plain)")
    with pytest.raises(ConfigError, match=r"plugins\.config\.mail: no plugin 'mail' is loaded"):
        Registry.for_settings(parse_settings({"plugins": {"allow": ["plain"], "config": {"mail": {}}}}))


def test_a_section_of_a_plugin_without_settings_is_an_error(installed: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        registry({"config": {"plain": {"x": 1}}})
    assert str(caught.value) == ("config error at plugins.config.plain: plugin 'plain' declares no settings (its "
                                 "entry point names tools, not a Plugin with settings=); remove this section")


@pytest.mark.parametrize(("config", "message"), [
    ({"mail": 5}, "config error at plugins.config.mail: Input should be a valid dictionary"),
    ([1], "config error at plugins.config: Input should be a valid dictionary"),
])
def test_sections_must_be_mappings(config: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings({"plugins": {"config": config}})
    assert str(caught.value) == message


def test_a_plugin_variable_of_the_old_kind_is_refused_with_the_convention_named() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env={"TOOLBOOTH_TASKS_DB": "/tmp/tasks.db"})
    assert str(caught.value) == ("config error at tasks_db (from TOOLBOOTH_TASKS_DB): unknown key; a plugin's "
                                 "settings are TOOLBOOTH_PLUGINS__CONFIG__<PLUGIN>__<KEY> (plugins.config)")


# --- the registration itself ----------------------------------------------------------------------------


class Loose(BaseModel):
    port: int = 25


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    port: int = Field(default=25, ge=1)


class In(BaseModel):
    x: int = 0


@tool(name="strict_tool", version="1.0.0", side_effect=SideEffect.NONE)
async def strict_tool(args: In, ctx: ToolContext) -> In:
    return args


@pytest.mark.parametrize(("tools", "model", "message"), [
    ([], Strict, r"Plugin\(tools=...\) must be one or more tools defined with @tool"),
    ([print], Strict, r"Plugin\(tools=...\) must be one or more tools defined with @tool"),
    ([strict_tool], dict, r"Plugin\(settings=...\) must be a pydantic model class, got <class 'dict'>"),
    ([strict_tool], Loose, r"the settings model Loose must forbid unknown keys: "
                           r"model_config = ConfigDict\(extra=\"forbid\"\)"),
])
def test_a_bad_registration_is_refused(tools: list[Any], model: Any, message: str) -> None:
    with pytest.raises(PluginDefinitionError, match=message):
        Plugin(tools, settings=model)


def test_a_bad_registration_stops_start_up_naming_the_entry_point(site: Path) -> None:
    source = PLUGIN_MODULE.replace('extra="forbid", frozen=True)\n    smtp', 'frozen=True)\n    smtp')
    install(site, "tb-loose", "tb_loose", {"loose": "tb_loose:PLUGIN"}, source)
    with pytest.raises(PluginLoadError, match=r"cannot load entry point 'loose' of distribution 'tb-loose'.*"
                                              r"PluginDefinitionError: the settings model MailSettings must forbid"):
        Registry.from_entry_points(allow=["loose"])


def test_configure_is_the_test_seam_of_a_plugins_tools() -> None:
    [configured] = Plugin([strict_tool], settings=Strict).configure("strict", {"port": 7})
    assert configured.settings == Strict(port=7) and strict_tool.settings is None
    with pytest.raises(ConfigError, match=r"^config error at plugins.config.strict.port: Input should be greater"):
        Plugin([strict_tool], settings=Strict).configure("strict", {"port": 0})


# --- a plugin's own programs --------------------------------------------------------------------------------


def test_read_plugin_settings_reads_the_sidecars_config_file_and_variables(tmp_path: Path) -> None:
    config = tmp_path / "toolbooth.yaml"
    config.write_text("plugins:\n  config:\n    strict:\n      port: 8\n")
    assert read_plugin_settings("strict", Strict, config, env={}) == Strict(port=8)
    env = {"TOOLBOOTH_PLUGINS__CONFIG__STRICT__PORT": "9"}
    assert read_plugin_settings("strict", Strict, config, env=env).port == 9
    assert read_plugin_settings("strict", Strict, None, env={}) == Strict()
    with pytest.raises(ConfigError, match=r"^config error at plugins.config.strict.port \(from "
                                          r"TOOLBOOTH_PLUGINS__CONFIG__STRICT__PORT\): Input should be greater"):
        read_plugin_settings("strict", Strict, config, env={"TOOLBOOTH_PLUGINS__CONFIG__STRICT__PORT": "-1"})
    config.write_text("plugins:\n  config:\n    strict:\n      colour: red\n")
    with pytest.raises(ConfigError, match=r"^config error at plugins.config.strict.colour: unknown key$"):
        read_plugin_settings("strict", Strict, config, env={})
