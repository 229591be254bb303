"""Hot reload of a policy directory: accepted changes swap in, broken ones are refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.config import PolicySettings, bundled_policy_dir
from sidecar.contract import ReloadStatus
from sidecar.errors import PolicyLoadError
from sidecar.policy import Stage
from sidecar.policy import factory as policy_factory
from sidecar.policy.compiling import compiled
from sidecar.policy.factory import policy_source
from sidecar.policy.files import PolicyFiles
from sidecar.policy.input import PolicyInput
from sidecar.policy.reload import Pin, ReloadingEngine, new_pin
from tests.support.reloading import rewrite

DENY_ALL = 'package toolbooth.availability\n\nimport rego.v1\n\ndecision := {"allow": false, "reason": "closed"}\n'
INPUT = PolicyInput.of({
    "principal": {"id": "u", "tenant": "t", "roles": ["developer"], "permissions": []},
    "tool": {"name": "calculate", "version": "1", "side_effect": "none", "permissions": [], "plugin": "p"},
    "context": {"stage": "availability", "time": "2026-11-30T15:00:00Z", "conversation_id": None},
})


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    return Path(shutil.copytree(bundled_policy_dir(), tmp_path / "toolbooth"))



async def allowed(engine: ReloadingEngine) -> bool:
    return (await engine.decide(Stage.AVAILABILITY, INPUT)).allow


async def test_a_valid_change_is_swapped_in(policies: Path) -> None:
    engine = await ReloadingEngine.start(policy_source(PolicySettings(path=policies)))
    first = engine.revision
    assert await allowed(engine)
    rewrite(policies / "availability.rego", DENY_ALL)
    status = await engine.reload_if_changed()
    assert not await allowed(engine)
    assert status.revision == engine.revision != first and status.healthy


async def test_no_change_no_reload(policies: Path) -> None:
    engine = await ReloadingEngine.start(policy_source(PolicySettings(path=policies)))
    before = engine.status
    assert await engine.reload_if_changed() is before


async def test_a_broken_change_is_refused_and_the_old_revision_serves(policies: Path) -> None:
    engine = await ReloadingEngine.start(policy_source(PolicySettings(path=policies)))
    first = engine.revision
    reported: list[ReloadStatus] = []

    async def report(status: ReloadStatus) -> None:
        reported.append(status)

    engine.on_status = report
    rewrite(policies / "availability.rego", "package toolbooth.availability\n\ndecision := {")
    status = await engine.reload_if_changed()
    assert engine.revision == first and await allowed(engine)
    assert not status.healthy and "availability.rego" in (status.last_error or "")
    assert reported == [status]
    rewrite(policies / "availability.rego", DENY_ALL)  # fixed: the next change loads
    assert (await engine.reload_if_changed()).healthy and not await allowed(engine)


async def test_failing_policy_tests_refuse_the_change(policies: Path) -> None:
    engine = await ReloadingEngine.start(policy_source(PolicySettings(path=policies, reload_requires_tests=True)))
    rewrite(policies / "gate_test.rego", "package toolbooth.gate_test\n\nimport rego.v1\n\ntest_never if false\n")
    status = await engine.reload_if_changed()
    assert await allowed(engine) and "data.toolbooth.gate_test.test_never" in (status.last_error or "")


async def test_failing_policy_tests_stop_start_up(policies: Path) -> None:
    rewrite(policies / "gate_test.rego", "package toolbooth.gate_test\n\nimport rego.v1\n\ntest_never if false\n")
    with pytest.raises(PolicyLoadError, match=r"policy tests under .* failed"):
        await ReloadingEngine.start(policy_source(PolicySettings(path=policies, reload_requires_tests=True)))


async def test_a_broken_start_fails(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="does not exist"):
        await ReloadingEngine.start(policy_source(PolicySettings(path=tmp_path / "nowhere")))


async def test_a_deleted_directory_is_refused(policies: Path) -> None:
    engine = await ReloadingEngine.start(policy_source(PolicySettings(path=policies)))
    shutil.rmtree(policies)
    status = await engine.reload_if_changed()
    assert not status.healthy and await allowed(engine)


async def test_watch_polls_until_stopped(policies: Path) -> None:
    engine = await ReloadingEngine.start(policy_source(PolicySettings(path=policies)))
    stop = asyncio.Event()
    watcher = asyncio.create_task(engine.watch(0.01, stop))
    rewrite(policies / "availability.rego", DENY_ALL)
    for _ in range(200):
        if not await allowed(engine):
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(watcher, 1)
    assert not await allowed(engine)


async def test_a_rule_that_cannot_compile_is_refused(policies: Path) -> None:
    engine = await ReloadingEngine.start(policy_source(PolicySettings(path=policies)))
    rewrite(policies / "availability.rego", 'package toolbooth.availability\n\nimport rego.v1\n\n'
                                            'decision := {"allow": unknown_var}\n')
    status = await engine.reload_if_changed()
    assert not status.healthy and "unknown_var is unsafe" in (status.last_error or "") and await allowed(engine)


async def test_every_set_is_compiled_on_the_one_policy_thread(policies: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """regorus's allocator keeps freed memory per thread: compiled on whichever executor thread was free, each
    reload left an engine's worth in another thread (RSS grew by ~5 MB a reload under load)."""
    threads: list[str] = []
    real = policy_factory.checked_files

    def checked(path: Path) -> PolicyFiles:
        threads.append(threading.current_thread().name)
        return real(path)

    monkeypatch.setattr(policy_factory, "checked_files", checked)
    engine = await ReloadingEngine.start(policy_source(PolicySettings(path=policies)))
    data = json.loads((policies / "data.json").read_text())
    for generation in range(3):
        data["toolbooth"]["generation"] = generation
        rewrite(policies / "data.json", json.dumps(data))
        pause = threading.Event()  # the default executor's threads are busy with these while the set compiles
        await asyncio.gather(engine.reload_if_changed(), *(asyncio.to_thread(pause.wait, 0.05) for _ in range(3)))
        assert engine.status.healthy
    assert len(threads) == 4 and set(threads) == {threads[0]} and threads[0].startswith("toolbooth-policy")


async def test_the_policy_thread_runs_one_thing_at_a_time() -> None:
    idents = await asyncio.gather(*(compiled(threading.get_ident) for _ in range(8)))
    assert len(set(idents)) == 1 and idents[0] != threading.get_ident()


@contextlib.contextmanager
def deciding(pin: Pin) -> Iterator[None]:
    """As a call's decider does around each of its decisions, with the call's pin."""
    pin.deciding = True
    try:
        yield
    finally:
        pin.deciding = False


async def test_a_pinned_call_decides_on_one_revision_across_a_reload(policies: Path) -> None:
    engine = await ReloadingEngine.start(policy_source(PolicySettings(path=policies)))
    first, call = engine.revision, new_pin()
    with deciding(call):
        assert await allowed(engine)  # the call's first decision takes the set in force
    rewrite(policies / "availability.rego", DENY_ALL)
    await engine.reload_if_changed()
    assert not await allowed(engine) and engine.revision != first  # what is not the call's: the new set
    with deciding(call):
        assert await allowed(engine) and engine.revision == first  # the call's next decisions: still its own
    with deciding(new_pin()):
        assert not await allowed(engine)  # another call: the set in force at its first decision
    await engine.aclose()


async def test_a_call_still_deciding_after_two_reloads_gets_the_set_in_force(policies: Path) -> None:
    engine = await ReloadingEngine.start(policy_source(PolicySettings(path=policies)))
    call = new_pin()
    with deciding(call):
        assert await allowed(engine)
    for text in (DENY_ALL, DENY_ALL.replace("closed", "still closed")):
        rewrite(policies / "availability.rego", text)
        await engine.reload_if_changed()
    with deciding(call):  # its set is closed by now
        assert (await engine.decide(Stage.AVAILABILITY, INPUT)).reason == "still closed"
    await engine.aclose()
