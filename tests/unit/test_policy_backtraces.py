"""A failing regorus evaluation costs no more than a succeeding one, even with ``RUST_BACKTRACE=1``.

regorus captures a Rust backtrace with every error when the environment asks for one,
which cost milliseconds per failing decision (against microseconds) until the sidecar
turned library backtraces off (``sidecar.policy._regorus``). The setting is read once per
process, at the first capture, so the timing runs in a fresh interpreter with
``RUST_BACKTRACE=1`` and no ``RUST_LIB_BACKTRACE``, as a sidecar or the CLI starts.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import sidecar

SLOWER_AT_MOST = 20  # a failing decision against a succeeding one: generous, the defect was ~5000x

TIMING = '''
import asyncio, json, statistics, sys, time
from pathlib import Path
from sidecar.errors import PolicyEvaluationError
from sidecar.policy import Stage
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.input import PolicyInput

engine = EmbeddedEngine.load(Path(sys.argv[1]))
succeeding, failing = PolicyInput.of({"principal": {"id": "12"}}), PolicyInput.of({"principal": {"id": "x"}})

async def median_seconds(item, times):
    spent, error = [], None
    for _ in range(times):
        started = time.perf_counter()
        try:
            await engine.decide(Stage.AUTHZ, item)
        except PolicyEvaluationError as exc:
            error = str(exc)
        spent.append(time.perf_counter() - started)
    return statistics.median(spent), error

async def main():
    await median_seconds(succeeding, 20)
    (ok, _), (bad, error) = await median_seconds(succeeding, 200), await median_seconds(failing, 50)
    await engine.aclose()
    print(json.dumps({"succeeding": ok, "failing": bad, "error": error}))

asyncio.run(main())
'''


def test_a_failing_embedded_decision_stays_fast_with_rust_backtrace_set(tmp_path: Path) -> None:
    for stage, body in {"availability": '{"allow": true}', "approval": '{"required": false}',
                        "authz": '{"allow": to_number(input.principal.id) > 0}'}.items():
        (tmp_path / f"{stage}.rego").write_text(f"package toolbooth.{stage}\n\nimport rego.v1\n\ndecision := {body}\n")
    env = {name: value for name, value in os.environ.items() if name != "RUST_LIB_BACKTRACE"}
    env["RUST_BACKTRACE"] = "1"
    run = subprocess.run([sys.executable, "-c", TIMING, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=60, cwd=Path(sidecar.__file__).parent.parent)
    assert run.returncode == 0, run.stderr
    measured = json.loads(run.stdout)
    assert "to_number" in measured["error"] and "backtrace" not in measured["error"].lower()
    assert measured["failing"] < SLOWER_AT_MOST * measured["succeeding"], measured


def imports_regorus(file: Path) -> bool:
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(alias.name == "regorus" for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "regorus":
            return True
    return False


def test_sidecar_modules_import_regorus_only_through_the_module_that_turns_backtraces_off() -> None:
    package = Path(sidecar.__file__).parent
    importing = sorted(file.relative_to(package).as_posix() for file in package.rglob("*.py") if imports_regorus(file))
    assert importing == ["policy/_regorus.py"]
