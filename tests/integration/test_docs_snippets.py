"""The fenced blocks of docs/agents.md, approvals.md, operations.md, policies.md and plugins.md, each checked by
its language, so that a block added to a doc is checked unless a table below names it with a reason:

- ``json`` parses; a policy input validates against docs/policy-input.schema.json (a ``history``/``conversation``
  part merged into the doc's own input example); ``data.toolbooth.history`` loads with ``parse_history_needs``,
  ``data.toolbooth.audit.mask`` with ``parse_audit_masks``; a ``ToolResult`` validates as one; an MCP client's
  configuration starting ``toolbooth`` has arguments the command line accepts;
- ``yaml`` loads as a config file with ``load_settings`` (the ``*_file`` paths it names provided in a temporary
  directory), each ``plugins.config`` section with the plugin's own model (``read_plugin_settings``);
- ``rego`` compiles with the bundled policies and their tests, in the package it is a fragment of, and a
  ``test_*`` rule it defines passes;
- ``python`` compiles; a complete program runs, alone or against a real ``toolbooth serve`` on a Unix socket;
- ``sh`` (and the ``$ `` lines of an unlabelled transcript): every ``toolbooth`` command line is accepted by the
  real parser, every ``pip install 'toolbooth[EXTRA]'`` names an extra of pyproject.toml, every ``curl`` or
  ``grpcurl`` body (``-d``) is JSON;
- ``toml`` parses.

plugins.md's "Testing a plugin" is run as written by ``test_plugin_docs.py``; the docs' imports are checked by
``tests/unit/test_public_api.py``.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import dataclasses
import io
import itertools
import json
import shlex
import shutil
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from sidecar.cli.root import build_parser
from sidecar.config import Settings, bundled_policy_dir, load_settings
from sidecar.contract import ToolResult
from sidecar.plugin import read_plugin_settings
from sidecar.policy.decision import parse_audit_masks
from sidecar.policy.files import PolicyFiles
from sidecar.policy.history import parse_history_needs
from tests.support.cli import Sidecar, short_dir, start_sidecar, write_config
from tests.support.doc_snippets import (
    Block,
    Listed,
    doc_blocks,
    listed,
    shell_commands,
    toolbooth_words,
    unmatched,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "docs" / f"{name}.md" for name in ("agents", "approvals", "operations", "policies", "plugins")]
SCHEMA = json.loads((REPO / "docs" / "policy-input.schema.json").read_text())
DOC_SOCKET = "unix:///run/toolbooth/toolbooth.sock"
# what a reader's shell holds for the variables the docs' commands use
VARIABLES = {"TOKEN": "eyJhbGciOiJIUzI1NiJ9.e30.c2ln", "APPROVER_JWT": "eyJhbGciOiJIUzI1NiJ9.e30.YXBw"}

# Sections another test runs as written.
COVERED_ELSEWHERE: dict[tuple[str, str], str] = {
    ("plugins.md", "Testing a plugin"): "run as a conftest and a test module by tests/integration/test_plugin_docs.py",
}

# Blocks nothing here can check: program output, diagrams, commands of other programs.
NOT_CHECKED: dict[Listed, str] = {
    ("agents.md", "toolbooth: note: tool 'search' is not strict"): "what tools export prints on stderr",
    ("agents.md", 'idempotency_key = "toolcall:" + tool_call_id'): "a formula in prose, not a program",
    ("approvals.md", "agent                         sidecar"): "a sequence diagram",
    ("operations.md", "config error at plugins.config.email.smtp.port"): "errors serve prints",
    ("operations.md", "docker build -t toolbooth:0.1.0 .\nbuildah"): "builds the image (test_image.py builds it)",
    ("policies.md", "meter 'writes_per_principal' of the policy looks back"): "an error serve prints",
    ("policies.md", "problem: data.toolbooth.approval.decision.required"): "what policy check prints",
    ("policies.md", "opa-golib-python-bindings==0.4.4"): "installs a PyPI package (test_real_opa.py uses it)",
    ("policies.md", "policies/toolbooth/authz.rego:101: function 'internal'"): "an error a policy load prints",
    ("plugins.md", "plugin 'my_plugin', tool 'Create Task'"): "errors @tool raises",
}

# JSON that is not one JSON text as written.
JSON_FRAGMENTS: dict[Listed, str] = {
    ("operations.md", '"decision_id": "4ca636c1'): "elides members of its input with `...`",
}

# JSON shaped like a policy input that docs/policy-input.schema.json does not describe.
NOT_A_DECISION_INPUT: dict[Listed, str] = {
    ("approvals.md", '"stage": "approver"'): "the approver rule's input (a preview, no tool): not in the schema",
}

# YAML that is not a Toolbooth configuration.
NOT_A_CONFIG: dict[Listed, str] = {
    ("operations.md", "# prometheus.yml"): "Prometheus's scrape configuration",
}

# Other sections a configuration needs to load (merged under the block).
CONFIG_CONTEXT: dict[Listed, dict[str, Any]] = {
    ("approvals.md", "oidc:"): {"auth": {"jwt": {"issuer": "https://idp.example.com", "audience": "toolbooth",
                                                 "algorithms": ["HS256"], "key_file": "/etc/toolbooth/jwt.key"}}},
}

# Rego fragments: the package each one belongs to (the bundled module whose names it uses).
REGO_PACKAGES: dict[Listed, str] = {
    ("policies.md", "test_the_fourth_identical_failure_is_refused"): "toolbooth.authz_test",
}


@dataclass(frozen=True)
class Run:
    """A Python block run as a program: against the test's sidecar (``names`` added to its globals, with ``target``)
    or alone; ``expect`` checks its globals afterwards."""

    sidecar: bool
    names: dict[str, Any] = field(default_factory=dict)
    expect: Callable[[dict[str, Any]], bool] = lambda _: True


RUN: dict[Listed, Run] = {
    ("agents.md", 'client.tool_schemas("openai", conversation_id="c-42")'): Run(
        True, {"jwt": None}, lambda names: "calculate" in [tool["function"]["name"] for tool in names["tools"]]),
    ("agents.md", "results = await client.execute_batch("): Run(
        # no such tools here: the first is a permanent failure, which cancels the second
        True, {"jwt": None}, lambda names: [result.error.code for result in names["results"]] == [
            "TOOL_UNAVAILABLE", "CANCELLED"]),
    ("plugins.md", "TOOLS = [create_task]"): Run(False, expect=lambda names: names["TOOLS"][0].name == "create_task"),
    ("plugins.md", "class SendEmailInput(BaseModel):\n    to: str"): Run(False),
}

# Python compiled only.
COMPILE_ONLY: dict[Listed, str] = {
    ("agents.md", "await session.call_tool("): "a fragment: an MCP session, ids and show_to_approver are the reader's",
    ("agents.md", "from openai import OpenAI"): "a loop with OpenAI's API: needs its key and the network",
    ("agents.md", "claude = anthropic.Anthropic()"): "a loop with Anthropic's API: needs its key and the network",
    ("agents.md", "from agents import Agent, Runner"): "an agent run: needs a model provider's API",
    ("agents.md", "from pydantic_ai import Agent"): "an agent run: needs a model provider's API",
    ("agents.md", "async def index_site("): "a handler: IndexInput, list_pages and index are the reader's",
    ("agents.md", "client.execute_stream(\"index_site\""): "a fragment: client, url, show and Progress around it",
    ("approvals.md", "client.previews()"): "a fragment: show, other, arguments and the tokens are the reader's",
    ("policies.md", 'name="fetch_page"'): "a handler: FetchInput and FetchOutput are the reader's",
    ("plugins.md", "class TasksSettings(BaseModel):"): "a fragment: PreviewInput, PreviewOutput and create_task",
    ("plugins.md", 'name="search_documents"'): "a decorator's arguments: the handler is the reader's",
    ("plugins.md", "return Partial(output, errors="): "a handler: SendEmailInput/Output and smtp are the reader's",
    ("plugins.md", "class SearchDocumentsOutput(BaseModel):"): "models: DocumentHit is the reader's",
    ("plugins.md", "class EmailRendering(BaseModel):"): "a handler: drafts and SendEmailInput are the reader's",
    ("plugins.md", 'name="read_document"'): "a handler: ReadDocumentInput and load are the reader's",
}

TABLES: dict[str, dict[Listed, Any]] = {"NOT_CHECKED": NOT_CHECKED, "JSON_FRAGMENTS": JSON_FRAGMENTS,
                                        "NOT_A_DECISION_INPUT": NOT_A_DECISION_INPUT, "NOT_A_CONFIG": NOT_A_CONFIG,
                                        "CONFIG_CONTEXT": CONFIG_CONTEXT, "REGO_PACKAGES": REGO_PACKAGES,
                                        "RUN": RUN, "COMPILE_ONLY": COMPILE_ONLY}


def _all_blocks() -> list[Block]:
    return [block for doc in DOCS for block in doc_blocks(doc) if (block.doc, block.section) not in COVERED_ELSEWHERE]


BLOCKS = _all_blocks()


def of(*languages: str, unchecked: Mapping[Listed, str] | None = None) -> list[Any]:
    """The blocks of ``languages`` as parameters, by doc and line, but those ``unchecked`` lists (with its reason:
    ``test_every_table_entry_names_one_block`` keeps the list true)."""
    return [pytest.param(block, id=block.id) for block in BLOCKS if block.language in languages
            and (unchecked is None or listed(block, unchecked) is None)]


def test_every_table_entry_names_one_block() -> None:
    problems = [f"{name}: {problem}" for name, table in TABLES.items() for problem in unmatched(table, BLOCKS)]
    problems += [f"COVERED_ELSEWHERE: {where} has no block" for where in COVERED_ELSEWHERE
                 if not any((block.doc, block.section) == where for doc in DOCS for block in doc_blocks(doc))]
    assert not problems, "\n".join(problems)


def test_every_language_is_checked() -> None:
    languages = {block.language for block in BLOCKS}
    assert languages <= {"json", "yaml", "rego", "python", "sh", "toml", ""}, languages


# --- JSON -----------------------------------------------------------------------------------------------------------


def _input_example() -> dict[str, Any]:
    """The policy input of policies.md's "The input document"."""
    [block] = [block for block in BLOCKS if block.section == "The input document" and block.language == "json"]
    value: dict[str, Any] = json.loads(block.text)
    return value


@pytest.mark.parametrize("block", of("json", unchecked=JSON_FRAGMENTS))
def test_json(block: Block) -> None:
    value = json.loads(block.text)
    assert isinstance(value, dict | list), block.id
    if isinstance(value, dict):
        _check_json_document(block, value)


def _check_json_document(block: Block, value: dict[str, Any]) -> None:
    if {"principal", "context"} <= value.keys() and listed(block, NOT_A_DECISION_INPUT) is None:
        jsonschema.validate(value, SCHEMA)
    elif value and value.keys() <= {"history", "conversation"}:
        jsonschema.validate({**_input_example(), **value}, SCHEMA)
    elif {"status", "meta"} <= value.keys():
        ToolResult.model_validate(value)
    toolbooth = value.get("toolbooth", {})
    if "history" in toolbooth:
        parse_history_needs(toolbooth["history"], lambda _: False)
    if "mask" in toolbooth.get("audit", {}):
        parse_audit_masks(toolbooth["audit"]["mask"])
    if block.section == "The default policies":
        bundled = json.loads((bundled_policy_dir() / "data.json").read_text())
        assert _key_paths(value) <= _key_paths(bundled), _key_paths(value) - _key_paths(bundled)
    for server in {**value.get("mcpServers", {}), **value.get("servers", {})}.values():
        if str(server.get("command", "")).endswith("/toolbooth"):
            _parses(server["args"])


def _key_paths(value: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    if not isinstance(value, dict):
        return set()
    return {path for key, item in value.items() for path in {(*prefix, key)} | _key_paths(item, (*prefix, key))}


# --- YAML -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", of("yaml"))
def test_yaml(block: Block, tmp_path: Path) -> None:
    raw = yaml.safe_load(block.text)
    assert isinstance(raw, dict), block.id
    if listed(block, NOT_A_CONFIG) is not None:
        return  # parsed only, for the reason NOT_A_CONFIG gives
    unknown = raw.keys() - Settings.model_fields.keys()
    assert not unknown, f"{block.id}: not sections of a config: {sorted(unknown)} (or list it in NOT_A_CONFIG)"
    context = CONFIG_CONTEXT.get(listed(block, CONFIG_CONTEXT) or ("", ""), {})
    config = tmp_path / "toolbooth.yaml"
    config.write_text(yaml.safe_dump(_provided({**context, **raw}, tmp_path)))
    settings = load_settings(config, env={})
    plugins = {point.name: point for point in entry_points(group="toolbooth.tools")}
    for name in settings.plugins.config:
        assert name in plugins, f"{block.id}: plugins.config.{name} names no installed plugin"
        read_plugin_settings(name, plugins[name].load().settings, config, env={})


def _provided(raw: Any, root: Path, key: str = "") -> Any:
    """``raw`` with every absolute path of a ``*_file`` key moved under ``root``, where a file now is."""
    if isinstance(raw, dict):
        return {name: _provided(value, root, name) for name, value in raw.items()}
    if key.endswith("_file") and isinstance(raw, str) and raw.startswith("/"):
        path = root / raw.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("a secret of at least thirty-two bytes\n")
        return str(path)
    return raw


# --- Rego -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", of("rego"))
def test_rego(block: Block) -> None:
    text = block.text
    if not text.lstrip().startswith("package "):
        entry = listed(block, REGO_PACKAGES)
        assert entry is not None, f"{block.id}: a fragment: name its package in REGO_PACKAGES"
        package = REGO_PACKAGES[entry]
        imports = f"import data.{package.removesuffix('_test')}\n" if package.endswith("_test") else ""
        text = f"package {package}\n\nimport rego.v1\n{imports}\n{text}"
    bundled = PolicyFiles.read(bundled_policy_dir()).with_tests()
    files = dataclasses.replace(bundled, modules=(*bundled.modules, ("doc_snippet_test.rego", text)))
    engine = files.build()
    package = text.split(None, 2)[1]
    for rule in rule_names(text):
        if rule.startswith("test_"):
            assert engine.eval_rule(f"data.{package}.{rule}") is True, f"{block.id}: {rule} does not pass"


def rule_names(text: str) -> list[str]:
    """The names of the rules a module's text defines at the start of a line."""
    return [line.split()[0] for line in text.splitlines() if line[:1].isalpha() and " if " in f" {line} "]


# --- Python ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sidecar() -> Iterator[Sidecar]:
    """A ``toolbooth serve`` of the bundled plugins in dev mode, on a Unix socket."""
    home = short_dir()
    started = start_sidecar(home, home / "tb.sock", "--config", str(write_config(home)))
    yield started
    started.stop()
    shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize("block", of("python"))
def test_python(block: Block, request: pytest.FixtureRequest) -> None:
    code = compile(block.text, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    entry = listed(block, RUN)
    if entry is None:
        assert listed(block, COMPILE_ONLY) is not None, f"{block.id}: run it (RUN) or say why not (COMPILE_ONLY)"
        return
    run = RUN[entry]
    names: dict[str, Any] = {"__name__": "doc_snippet", **run.names}
    if run.sidecar:
        target = request.getfixturevalue("sidecar").target
        code = compile(block.text.replace(DOC_SOCKET, target), block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        names["target"] = target
    pending = eval(code, names)  # the doc's own code, run as a reader runs it
    if asyncio.iscoroutine(pending):
        asyncio.run(pending)
    shown = {name: value for name, value in names.items() if not name.startswith("__")}
    assert run.expect(names), f"{block.id} ran, but not as documented: {shown}"


# --- Shell ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", of("sh", "", unchecked=NOT_CHECKED))
def test_shell(block: Block) -> None:
    if block.language == "":
        commands = [line[2:] for line in block.text.splitlines() if line.startswith("$ ")]
        assert commands, f"{block.id}: no `$ ` command lines: label its language or list it in NOT_CHECKED"
    else:
        commands = shell_commands(block.text)
    checked = 0
    for command in commands:
        for words in toolbooth_words(command, VARIABLES):
            _parses(words)
            checked += 1
        checked += _check_other(command)
    assert checked, f"{block.id}: nothing here checks this block: list it in NOT_CHECKED"


def _parses(words: list[str]) -> None:
    """``toolbooth WORDS`` is accepted by the command line's parser."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            build_parser().parse_args(words)
    except SystemExit as exc:
        pytest.fail(f"toolbooth {shlex.join(words)}: exit {exc.code}: {stderr.getvalue().strip()}")


def _check_other(command: str) -> int:
    """Check a ``pip install 'toolbooth[EXTRA]'``'s extras and a ``curl``/``grpcurl`` body; how many were checked."""
    words = shlex.split(command, comments=True)
    checked = 0
    if words[:1] in (["curl"], ["grpcurl"]):
        for option, value in itertools.pairwise(words):
            if option == "-d":
                json.loads(value)
                checked += 1
    if words and words[0].endswith("pip") and words[1:2] == ["install"]:
        extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        for word in words[2:]:
            if word.startswith("toolbooth["):
                wanted = set(word.removeprefix("toolbooth[").removesuffix("]").split(","))
                assert wanted <= extras.keys(), f"{command}: no such extra: {sorted(wanted - extras.keys())}"
                checked += 1
            elif word.startswith(("examples/", "plugins/")):
                assert (REPO / word).is_dir(), f"{command}: {word} is not in the repository"
                checked += 1
    return checked


# --- TOML -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", of("toml"))
def test_toml(block: Block) -> None:
    tomllib.loads(block.text)


# --- The checks themselves ------------------------------------------------------------------------------------------


def test_a_stale_flag_fails() -> None:
    _parses(["tools", "list", "--output", "json"])
    with pytest.raises(pytest.fail.Exception, match="unrecognized arguments: --no-such-flag"):
        _parses(["tools", "list", "--no-such-flag"])


def test_the_command_lines_of_a_shell_block_are_found() -> None:
    text = ("cat > calls.jsonl <<'EOF'\n{\"tool\": \"toolbooth x\"}\nEOF\n"
            "toolbooth call-batch calls.jsonl \\\n    --max-concurrency 4   # toolbooth in a comment\n"
            "kubectl logs deploy/agent -c toolbooth\n"
            "kubectl exec deploy/agent -- env TOOLBOOTH_TOKEN=\"$TOKEN\" toolbooth call c --args '{\n  \"a\": 1}'\n"
            "toolbooth tools list --tls-server-name toolbooth && .venv/bin/toolbooth --version\n")
    found = [words for command in shell_commands(text) for words in toolbooth_words(command, {"TOKEN": "t"})]
    assert found == [["call-batch", "calls.jsonl", "--max-concurrency", "4"], ["call", "c", "--args", '{\n  "a": 1}'],
                     ["tools", "list", "--tls-server-name", "toolbooth"], ["--version"]]
    with pytest.raises(KeyError):
        toolbooth_words("toolbooth call --token $UNKNOWN", {})


def test_an_extra_that_does_not_exist_fails() -> None:
    assert _check_other("pip install 'toolbooth[mcp]'") == 1
    with pytest.raises(AssertionError, match="no such extra"):
        _check_other("pip install 'toolbooth[no-such-extra]'")
