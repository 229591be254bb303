"""The ``Dockerfile``, ``.dockerignore`` and ``constraints.txt``, checked without a container engine.

``test_image.py`` builds and runs the image; what is checked here holds whatever builds it and needs nothing
installed: the instructions as ``dockerfile-parse`` reads them (no parser directive, two stages, a numeric
non-root user, nothing secret in ``ENV``/``ARG``/``COPY``), the build context ``.dockerignore`` leaves
(``tests/support/build_context.py``), and that ``constraints.txt``, which the builder installs with, pins every
direct dependency of toolbooth (with the image's extras) and of each plugin within its ``pyproject.toml`` range.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.build_context import context_files, pinned_versions

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


def test_no_parser_directive() -> None:
    # "# syntax=" would make BuildKit fetch a frontend image from a registry; "# escape=" changes the quoting.
    first = (REPO / "Dockerfile").read_text().splitlines()[0]
    assert not re.match(r"#\s*(syntax|escape|check)\s*=", first, re.IGNORECASE), first


def test_two_stages_the_runtime_one_non_root() -> None:
    stages = _stages()
    assert list(stages) == ["builder", "runtime"]
    runtime = stages["runtime"]
    (user,) = _values(runtime, "USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) >= 10000 and gid.isdigit() and int(gid) != 0  # numeric: runAsNonRoot can check
    # nothing of the build context reaches the image, and nothing runs in it (it has no shell)
    assert all(value.startswith("--from=builder ") for value in _values(runtime, "COPY"))
    assert "RUN" not in [kind for kind, _ in runtime]


def test_no_secret_is_copied_or_set() -> None:
    stages = _stages()
    for stage in stages.values():
        for kind, value in stage:
            if kind in ("ENV", "ARG"):
                assert not SECRET_WORDS.search(value), f"{kind} {value}"
    copied = {source for value in _values(stages["builder"], "COPY") for source in value.split()[:-1]}
    assert copied == {"pyproject.toml", "README.md", "constraints.txt", "sidecar/", "policies/", "plugins/"}
    files = context_files(REPO)
    leaks = [f for f in files if re.search(r"\.(pem|key|crt|p12|db|journal|checkpoint)$|(^|/)\.env", f)]
    assert leaks == []
    assert not [f for f in files if f.startswith((".git/", ".venv/", "tests/", "deploy/")) or "__pycache__" in f]


def test_the_build_context_holds_what_the_builder_copies() -> None:
    files = set(context_files(REPO))
    assert {"pyproject.toml", "README.md", "constraints.txt", "sidecar/__init__.py",
            "policies/toolbooth/authz.rego"} <= files
    for plugin in PLUGINS:
        assert plugin.relative_to(REPO).joinpath("pyproject.toml").as_posix() in files
        assert not [f for f in files if f.startswith(plugin.relative_to(REPO).joinpath("tests").as_posix())]


def test_the_builder_installs_with_the_constraints() -> None:
    (command,) = [value for value in _values(_stages()["builder"], "RUN") if "pip wheel" in value]
    assert re.search(r"pip wheel --constraint constraints\.txt ", command), command
    lines = [line for line in (REPO / "constraints.txt").read_text().splitlines() if not line.startswith("#")]
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*==[0-9][0-9A-Za-z.+!]*", line) for line in lines), lines
    names = [line.split("==")[0] for line in lines]
    assert names == sorted(set(names)), "sorted by name, each once"


def _direct_requirements() -> list[Requirement]:
    """What toolbooth, with the extras the builder installs, and every plugin ask for, besides each other."""
    (extras,) = [value.split("=", 1)[1] for value in _values(_stages()["builder"], "ARG")
                 if value.startswith("EXTRAS=")]
    toolbooth = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    texts = list(toolbooth["dependencies"])
    texts += [text for extra in extras.split(",") if extra for text in toolbooth["optional-dependencies"][extra]]
    for plugin in PLUGINS:
        texts += tomllib.loads((plugin / "pyproject.toml").read_text())["project"]["dependencies"]
    requirements = [Requirement(text) for text in texts]
    return [r for r in requirements if not canonicalize_name(r.name).startswith("toolbooth")
            and (r.marker is None or r.marker.evaluate())]


def test_the_constraints_pin_every_direct_dependency_within_its_range() -> None:
    pins = pinned_versions(REPO)
    outside = [f"{r} (pinned: {pins.get(canonicalize_name(r.name))})" for r in _direct_requirements()
               if not r.specifier.contains(pins.get(canonicalize_name(r.name), "missing"), prereleases=True)]
    assert outside == [], "rerun: bash .ci/image-constraints"
