"""``toolbooth plugin new NAME``: write a working plugin package to start from.

It writes ``NAME/`` (in the current directory, or ``--directory``): a ``pyproject.toml`` whose ``toolbooth.tools``
entry point names the package's tools, the package (one read-only tool, ``<package>_greet``, that needs the
permission ``<package>:greet``), and its tests, which use the plugin test kit (``sidecar.plugin.testing``): the
tool called directly and through the whole gate. ``pip install -e 'NAME[test]'`` then ``pytest NAME`` pass as
written. A package name an import already finds (``json``, ``yaml``, an installed plugin's) is refused: the plugin
would shadow that module, or be shadowed by it. Exit codes: 0 written, 2 a NAME that is not a distribution name
usable as a package, or a directory that already exists (nothing is overwritten), 1 the files cannot be written
there (what was written is removed).
"""

from __future__ import annotations

import argparse
import importlib.util
import keyword
import re
import shutil
import sys
from pathlib import Path
from string import Template

from sidecar.cli.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CommandError, Subparsers, dump_json
from sidecar.cli.output import json_output, output_flag

__all__ = ["NAME_PATTERN", "add_commands", "cmd_plugin_new", "package_name", "write_plugin"]

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*\Z")
MAX_NAME = 50  # so that the tool's name, ``<package>_greet``, stays within the 64 characters of a tool name
# would shadow what the plugin imports or runs (``conftest``: its tests' own conftest.py)
RESERVED = frozenset({"sidecar", "toolbooth", "tests", "test", "conftest"})

PYPROJECT = """\
[build-system]
requires = ["hatchling>=1.25"]
build-backend = "hatchling.build"

[project]
name = "$name"
version = "0.1.0"
description = "A Toolbooth tool plugin."
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["toolbooth", "pydantic>=2.7"]

[project.optional-dependencies]
test = ["pytest>=8", "pytest-asyncio>=0.23"]

# The sidecar loads the plugin named $package from this entry point: a tool, a list of tools, or a Plugin.
[project.entry-points."toolbooth.tools"]
$package = "$package:TOOLS"

[tool.hatch.build.targets.wheel]
packages = ["$package"]

[tool.pytest.ini_options]
asyncio_mode = "auto"
asyncio_default_fixture_loop_scope = "function"
"""

README = """\
# $name

A Toolbooth tool plugin: the tool `${package}_greet`.

    pip install -e '.[test]'   # into the environment where toolbooth is installed
    pytest                     # the tool directly and through the whole gate (sidecar.plugin.testing)

Once installed, `toolbooth serve` loads it (entry point `$package`); `toolbooth tools list` shows its tool to a
caller holding the permission `$package:greet`. See Toolbooth's docs/plugins.md.
"""

PACKAGE = '''\
"""$name: a Toolbooth tool plugin."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sidecar.plugin import SideEffect, ToolContext, tool

__all__ = ["TOOLS", "GreetInput", "GreetOutput", "greet"]


class GreetInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=100, description="Who to greet.")


class GreetOutput(BaseModel):
    greeting: str


@tool(name="${package}_greet", version="0.1.0", side_effect=SideEffect.NONE, permissions=("$package:greet",),
      timeout=1.0)
async def greet(args: GreetInput, ctx: ToolContext) -> GreetOutput:
    """Greet someone by name."""
    return GreetOutput(greeting=f"Hello, {args.name}!")


TOOLS = [greet]
'''

CONFTEST = '''\
"""The plugin test kit's fixtures: ``tool_context`` and ``toolbooth_gate`` (``sidecar.plugin.fixtures``)."""

from sidecar.plugin.fixtures import tool_context, toolbooth_gate

__all__ = ["tool_context", "toolbooth_gate"]
'''

TESTS = '''\
"""The tool called directly, then through the whole gate (the bundled policies), and its entry point."""

from __future__ import annotations

from importlib import metadata

from sidecar.plugin import ErrorCode, Principal
from sidecar.plugin.fixtures import ContextFactory, GateOpener
from sidecar.plugin.testing import Status

from $package import TOOLS, GreetInput, GreetOutput, greet


async def test_greets_by_name(tool_context: ContextFactory) -> None:
    output = await greet(GreetInput(name="Ana"), tool_context(greet))
    assert isinstance(output, GreetOutput) and output.greeting == "Hello, Ana!"


async def test_through_the_gate(toolbooth_gate: GateOpener) -> None:
    gate = await toolbooth_gate(TOOLS)  # its caller holds the permissions the tools need
    result = await gate.call(greet, {"name": "Ana"})
    assert result.status is Status.SUCCESS and result.data == {"greeting": "Hello, Ana!"}
    invalid = await gate.call(greet, {"name": ""})
    assert invalid.error is not None and invalid.error.code is ErrorCode.INVALID_ARGUMENT
    denied = await gate.call(greet, {"name": "Ana"}, principal=Principal(id="eve", tenant="test"))
    assert denied.error is not None and denied.error.code is ErrorCode.PERMISSION_DENIED


def test_the_entry_point_names_the_tools() -> None:
    (entry_point,) = metadata.entry_points(group="toolbooth.tools", name="$package")
    assert entry_point.load() is TOOLS
'''


def add_commands(commands: Subparsers) -> None:
    """Add ``plugin new`` to the ``toolbooth`` parser."""
    plugin = commands.add_parser("plugin", help="start a tool plugin (plugin new NAME)")
    actions = plugin.add_subparsers(dest="plugin_command", required=True, metavar="ACTION")
    new = actions.add_parser("new", help="write a plugin package, with a tool and its tests, to start from")
    new.add_argument("name", metavar="NAME", help="its distribution name: lowercase letters and digits, words joined "
                                                  "by '-' or '_' (the package's name has '_' for '-')")
    new.add_argument("--directory", type=Path, default=Path("."), metavar="DIR",
                     help="where to write NAME/ (default: the current directory)")
    output_flag(new)
    new.set_defaults(handler=cmd_plugin_new)


def cmd_plugin_new(args: argparse.Namespace) -> int:
    """``toolbooth plugin new``: write the package, then say how to install and test it."""
    root = args.directory / args.name
    written = write_plugin(args.name, root)
    if json_output(args):
        print(dump_json({"directory": str(root), "package": package_name(args.name),
                         "files": [str(path.relative_to(root)) for path in written]}))
    else:
        print(f"wrote {root}: {', '.join(str(path.relative_to(root)) for path in written)}")
        print(f"next: pip install -e '{root}[test]' && pytest {root}")
    return EXIT_OK


def package_name(name: str) -> str:
    """The import name of distribution ``name``; ``CommandError`` (exit 2) saying why a name cannot be one."""
    package = name.replace("-", "_")
    if not NAME_PATTERN.match(name) or len(name) > MAX_NAME:
        raise CommandError(f"plugin name {name!r}: expected at most {MAX_NAME} lowercase letters and digits, "
                           "starting with a letter, words joined by single '-' or '_' (e.g. acme-weather)",
                           EXIT_USAGE)
    if keyword.iskeyword(package) or package in RESERVED:
        raise CommandError(f"plugin name {name!r}: {package!r} cannot be the plugin's package "
                           f"({'a Python keyword' if keyword.iskeyword(package) else 'a name Toolbooth uses'})",
                           EXIT_USAGE)
    if _importable(package):
        raise CommandError(f"plugin name {name!r}: an import of {package!r} already finds a module (the standard "
                           "library's or an installed package's), which the plugin's package would shadow or be "
                           f"shadowed by: choose another NAME (e.g. acme-{name})", EXIT_USAGE)
    return package


def _importable(package: str) -> bool:
    """Whether ``import package`` finds a module already (without importing it); a namespace package, a bare
    directory somewhere on the path, does not count."""
    if package in sys.stdlib_module_names or package in sys.builtin_module_names:
        return True
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None


def write_plugin(name: str, root: Path) -> list[Path]:
    """Write the plugin ``name`` into the new directory ``root``; the files written. ``CommandError``: exit 2 for
    a bad name or a ``root`` that exists, exit 1 when ``root`` or a file in it cannot be written."""
    package = package_name(name)
    try:
        root.mkdir(parents=True)
    except FileExistsError:
        raise CommandError(f"{root} already exists: choose another NAME or --directory (nothing was overwritten)",
                           EXIT_USAGE) from None
    except OSError as exc:  # no such directory, not a directory, not writable
        raise CommandError(f"cannot write {root}: {exc.strerror or exc} (nothing was written)", EXIT_FAILURE,
                           "CANNOT_WRITE") from None
    files = {"pyproject.toml": PYPROJECT, "README.md": README, f"{package}/__init__.py": PACKAGE,
             f"{package}/py.typed": "", "tests/conftest.py": CONFTEST, f"tests/test_{package}.py": TESTS}
    try:
        return [_write(root / relative, Template(template).substitute(name=name, package=package))
                for relative, template in files.items()]
    except OSError as exc:  # a full disk, a quota: what this command made goes
        shutil.rmtree(root, ignore_errors=True)
        raise CommandError(f"cannot write {root}: {exc.strerror or exc} (what it wrote was removed)", EXIT_FAILURE,
                           "CANNOT_WRITE") from None


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
