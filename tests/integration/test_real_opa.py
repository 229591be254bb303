"""The shipped Rego under OPA's own engine (v1.20.2): it compiles, its tests pass as ``opa test`` runs them, and
the built-ins the sidecar keeps (``sidecar/policy/opa_builtins.json``) are that engine's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sidecar.errors import PolicyLoadError
from sidecar.policy.files import DATA_FILE, checked_files, policy_paths
from sidecar.policy.shadowing import BUILTINS
from tests.support.real_opa import bindings, compiled, engine_builtins, failed_tests, rego_errors, rego_tests

REPO = Path(__file__).resolve().parents[2]
SHIPPED = [REPO / "policies", REPO / "examples", REPO / "plugins"]  # where Rego ships from


def policy_sets() -> list[Path]:
    """Each directory of shipped Rego: the nearest one above its files that holds a ``data.json``, else its own."""
    roots = set()
    for file in (file for top in SHIPPED if top.is_dir() for file in policy_paths(top, "*.rego")):
        roots.add(next((d for d in file.parents if (d / DATA_FILE).is_file() and REPO in d.parents), file.parent))
    return sorted(roots)


def modules(root: Path) -> list[tuple[str, str]]:
    """Every module under ``root``, tests too, by path."""
    return [(str(file), file.read_text()) for file in policy_paths(root, "*.rego")]


def opa_of(root: Path) -> object:
    data = json.loads((root / DATA_FILE).read_text()) if (root / DATA_FILE).is_file() else None
    return compiled(modules(root), data)


def test_the_default_policies_are_shipped() -> None:
    assert REPO / "policies" / "toolbooth" in policy_sets()


@pytest.mark.parametrize("root", policy_sets(), ids=lambda root: str(root.relative_to(REPO)))
def test_shipped_rego_compiles_and_its_tests_pass_under_opa(root: Path) -> None:
    try:
        engine = opa_of(root)
    except bindings().OpaError as exc:
        pytest.fail(f"OPA refuses {root}: {exc.message}", pytrace=False)
    tests = rego_tests(modules(root))
    assert tests, f"no test_* rules under {root}"
    failures = failed_tests(engine, tests)
    assert not failures, "\n".join(f"{rule}: {why}" for rule, why in failures.items())


def test_a_rule_hiding_a_builtin_is_refused_by_opa_and_by_the_sidecar_alike(tmp_path: Path) -> None:
    """The defect this guards against: ``x in xs`` calls ``internal.member_2``, which a rule named ``internal``
    hides. OPA refuses it; so does every load of the sidecar, naming the file, line and built-in."""
    root = Path(shutil.copytree(REPO / "policies" / "toolbooth", tmp_path / "toolbooth"))
    authz = root / "authz.rego"
    authz.write_text(authz.read_text().replace("internal_recipient(", "internal("))
    with pytest.raises(bindings().OpaError) as refused:
        opa_of(root)
    assert {(error.code, error.message) for error in rego_errors(refused.value.message)} == {
        ("rego_type_error", "undefined function data.toolbooth.authz.internal.member_2")}
    with pytest.raises(PolicyLoadError, match=rf"{authz}:\d+: function 'internal' hides OPA's built-in namespace "
                                              r"internal \(internal\.member_2, "):
        checked_files(root)


def test_the_kept_builtins_are_the_engines() -> None:
    kept, real = set(BUILTINS), engine_builtins()
    assert kept == real, f"sidecar/policy/opa_builtins.json lacks {sorted(real - kept)}, has {sorted(kept - real)}"
