"""Policies from a Kubernetes ConfigMap volume: only the current version is loaded, and an update is seen.

The kubelet keeps each version of the volume in a hidden ``..<timestamp>`` directory and links the visible
files into the current one (``tests/support/kube_volume.py``). Loading those hidden directories too would
load every policy twice, under names that change with each update, and, while an update is half way, the
old and the new rules together.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sidecar.config import PolicySettings, bundled_policy_dir
from sidecar.policy import Stage
from sidecar.policy.factory import policy_source
from sidecar.policy.files import PolicyFiles
from sidecar.policy.reload import ReloadingEngine
from tests.support.kube_volume import project
from tests.unit.test_policy_reload import DENY_ALL, INPUT


def _bundled() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(bundled_policy_dir().iterdir()) if path.is_file()}


def test_a_mounted_policy_set_loads_as_the_same_files_in_a_plain_directory(tmp_path: Path) -> None:
    project(tmp_path / "mounted", _bundled())
    plain = PolicyFiles.read(Path(shutil.copytree(bundled_policy_dir(), tmp_path / "plain")))
    mounted = PolicyFiles.read(tmp_path / "mounted")
    assert [name for name, _ in mounted.modules] == ["approval.rego", "authz.rego", "availability.rego"]
    assert mounted.revision() == plain.revision()
    assert [name for name, _ in mounted.with_tests().modules if name.endswith("_test.rego")] == [
        "approval_test.rego", "authz_test.rego", "availability_test.rego"]


def test_an_update_caught_half_way_loads_only_the_new_version(tmp_path: Path) -> None:
    root = tmp_path / "mounted"
    project(root, _bundled())
    project(root, {**_bundled(), "availability.rego": DENY_ALL}, keep_old=True)  # both versions on disk
    modules = dict(PolicyFiles.read(root).modules)
    assert sorted(modules) == ["approval.rego", "authz.rego", "availability.rego"]
    assert modules["availability.rego"] == DENY_ALL


async def test_an_update_of_the_volume_is_reloaded(tmp_path: Path) -> None:
    root = tmp_path / "mounted"
    project(root, _bundled())
    engine = await ReloadingEngine.start(policy_source(PolicySettings(path=root)))
    first = engine.revision
    assert (await engine.decide(Stage.AVAILABILITY, INPUT)).allow
    project(root, {**_bundled(), "availability.rego": DENY_ALL})
    status = await engine.reload_if_changed()
    assert status.healthy and status.revision == engine.revision != first
    assert not (await engine.decide(Stage.AVAILABILITY, INPUT)).allow
    await engine.aclose()
