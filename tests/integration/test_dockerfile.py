"""The ``Dockerfile`` and ``.dockerignore``, checked without a container engine.

No image is built here (no Docker daemon, and no base image to pull). What is checked: the Dockerfile's
instructions as ``dockerfile-parse`` reads them (two stages, a numeric non-root user, ``toolbooth serve``
as the entry point, the state and socket directories as volumes, nothing secret in ``ENV``/``ARG``/
``COPY``), the build context ``.dockerignore`` leaves (``tests/support/build_context.py``), and the two
stages' ``RUN`` commands themselves: the builder's, run as written by ``sh -c`` in a copy of that context,
builds the wheels of toolbooth and of every plugin under ``plugins/``; the runtime's installs them from
those wheels alone into a fresh virtualenv, where ``toolbooth`` runs and finds the plugins' tools.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from tests.support.build_context import context_files, copy_context

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PLUGINS = sorted(path.parent for path in (REPO / "plugins").glob("*/pyproject.toml"))
SECRET_WORDS = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|PRIVATE|_KEY\b|CREDENTIAL", re.IGNORECASE)

Instruction = tuple[str, str]  # (instruction, value)


def _stages() -> dict[str, list[Instruction]]:
    """The instructions of each stage, by stage name."""
    parser = DockerfileParser(path=str(REPO / "Dockerfile"))
    stages: dict[str, list[Instruction]] = {}
    current: list[Instruction] | None = None
    for item in parser.structure:
        if item["instruction"] == "FROM":
            name = item["value"].split()[-1]
            current = stages.setdefault(name, [])
        elif current is not None and item["instruction"] != "COMMENT":
            current.append((item["instruction"], item["value"]))
    return stages


def _values(stage: list[Instruction], instruction: str) -> list[str]:
    return [value for kind, value in stage if kind == instruction]


def _env(stage: list[Instruction]) -> dict[str, str]:
    """What a ``RUN`` of ``stage`` sees: its ``ARG`` defaults and ``ENV`` values."""
    args = [value for value in _values(stage, "ARG") if "=" in value]
    pairs = args + [pair for value in _values(stage, "ENV") for pair in shlex.split(value)]
    return dict(pair.split("=", 1) for pair in pairs)


def _run(command: str, *, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A ``RUN`` in shell form, as Docker runs it: ``/bin/sh -c COMMAND`` (``python`` being this one)."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(["/bin/sh", "-c", command], cwd=cwd, env={**os.environ, "PATH": path, **env},
                          capture_output=True, text=True, timeout=900, check=False)


def test_two_stages_the_runtime_one_non_root_with_toolbooth_serve() -> None:
    stages = _stages()
    assert list(stages) == ["builder", "runtime"]
    runtime = stages["runtime"]
    (user,) = _values(runtime, "USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) >= 10000 and gid.isdigit() and int(gid) != 0  # numeric: runAsNonRoot can check
    assert json.loads(_values(runtime, "ENTRYPOINT")[0]) == ["toolbooth", "serve"]
    assert [kind for kind, _ in runtime][-1] == "ENTRYPOINT"
    assert "COPY" not in [kind for kind, _ in runtime]  # nothing of the build context reaches the image


def test_state_and_socket_directories_are_volumes_named_by_the_xdg_variables() -> None:
    runtime = _stages()["runtime"]
    env = _env(runtime)
    state, socket = f"{env['XDG_STATE_HOME']}/toolbooth", f"{env['XDG_RUNTIME_DIR']}/toolbooth"
    assert json.loads(_values(runtime, "VOLUME")[0]) == [state, socket]
    install = _values(runtime, "RUN")[0]
    assert f"install -d -o 10001 -g 10001 -m 0750 {state} {socket}" in install
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # nothing written beside the code on a read-only root


def test_no_secret_is_copied_or_set() -> None:
    stages = _stages()
    for stage in stages.values():
        for kind, value in stage:
            if kind in ("ENV", "ARG"):
                assert not SECRET_WORDS.search(value), f"{kind} {value}"
    copied = {source for value in _values(stages["builder"], "COPY") for source in value.split()[:-1]}
    assert copied == {"pyproject.toml", "README.md", "sidecar/", "policies/", "plugins/"}
    files = context_files(REPO)
    leaks = [f for f in files if re.search(r"\.(pem|key|crt|p12|db|journal|checkpoint)$|(^|/)\.env", f)]
    assert leaks == []
    assert not [f for f in files if f.startswith((".git/", ".venv/", "tests/", "deploy/")) or "__pycache__" in f]


def test_the_build_context_holds_what_the_builder_copies() -> None:
    files = set(context_files(REPO))
    assert {"pyproject.toml", "README.md", "sidecar/__init__.py", "policies/toolbooth/authz.rego"} <= files
    for plugin in PLUGINS:
        assert plugin.relative_to(REPO).joinpath("pyproject.toml").as_posix() in files
        assert not [f for f in files if f.startswith(plugin.relative_to(REPO).joinpath("tests").as_posix())]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The builder stage's ``COPY``s into its ``WORKDIR`` of a copy of the build context, then its ``RUN``."""
    builder = _stages()["builder"]
    context, workdir = tmp_path_factory.mktemp("context"), tmp_path_factory.mktemp("src")
    copy_context(REPO, context)
    for value in _values(builder, "COPY"):
        *sources, destination = value.split()
        for source in sources:
            subprocess.run(["cp", "-r", str(context / source), str(workdir / destination)], check=True)
    (command,) = _values(builder, "RUN")
    wheel_dir = re.search(r"--wheel-dir (\S+)", command)
    assert wheel_dir is not None and wheel_dir.group(1) == "/wheels"
    out = tmp_path_factory.mktemp("wheels")
    built = _run(command.replace("/wheels", str(out)), cwd=workdir, env=_env(builder))
    assert built.returncode == 0, built.stderr[-3000:]
    return out


def test_the_builder_stage_builds_wheels_of_toolbooth_and_every_plugin(wheels: Path) -> None:
    names = {path.name.split("-")[0].lower() for path in wheels.glob("*.whl")}
    plugins = {tomllib.loads((plugin / "pyproject.toml").read_text())["project"]["name"] for plugin in PLUGINS}
    assert PLUGINS and {name.replace("-", "_") for name in plugins} | {"toolbooth", "mcp"} <= names


def test_the_runtime_stage_installs_from_the_wheels_alone_and_serves_the_plugins(
        wheels: Path, tmp_path: Path) -> None:
    runtime = _stages()["runtime"]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = _values(runtime, "RUN")[0].split("&&")[0]  # the pip step; the rest makes the user and directories
    install = install.replace("--mount=type=bind,from=builder,source=/wheels,target=/wheels", "").strip()
    installed = subprocess.run(["/bin/sh", "-c", install.replace("/wheels", str(wheels))], cwd=tmp_path,
                               env={**os.environ, **_env(runtime), "PIP_FIND_LINKS": "",
                                    "PIP_CONFIG_FILE": os.devnull,  # this machine's indexes and wheels: not used
                                    "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"},
                               capture_output=True, text=True, timeout=900, check=False)
    assert installed.returncode == 0, installed.stderr[-3000:]
    version = subprocess.run([str(venv / "bin" / "toolbooth"), "--version"], capture_output=True, text=True,
                             check=True, cwd=tmp_path)
    assert version.stdout.startswith("toolbooth ")
    found = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import json; from sidecar.tools.registry import Registry; "
         "print(json.dumps(sorted(d.name for d in Registry.from_entry_points())))"],
        capture_output=True, text=True, check=True, cwd=tmp_path)
    assert "calculate" in json.loads(found.stdout)
