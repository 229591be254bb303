"""The embedded policy engine: Rego evaluated in-process by regorus.

A policy directory holds Rego modules (``**/*.rego``; ``*_test.rego`` files are
policy tests and are not loaded) and an optional ``data.json`` at its root,
which becomes ``data``. ``EmbeddedEngine.load`` reads and checks them once; the
compiled engine is then reused, and a decision costs tens of microseconds.

regorus engines are pinned to the thread that creates them (pyo3 ``unsendable``:
any use from another thread panics) and setting the input then evaluating is not
atomic. ``load`` may run on any thread: it compiles a throwaway engine to check
the policies. The engine that evaluates is built on the first decision, by the
thread that makes it, and only that thread may decide from then on (another
thread gets ``PolicyEvaluationError``). In the sidecar that is the event-loop
thread, which also drops the engine after a reload.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import regorus

from sidecar.errors import PolicyEvaluationError, PolicyLoadError
from sidecar.policy import AUDIT_MASK_RULE, CALL_STAGES, RULES, Decision, Stage, parse_audit_masks, parse_decision
from sidecar.policy.input import PolicyInput

if TYPE_CHECKING:
    from sidecar.policy.bundle import Bundle

DATA_FILE = "data.json"



def clean_regorus_error(exc: BaseException) -> str:
    """The regorus message, without the Rust backtrace appended when ``RUST_BACKTRACE`` is set."""
    return str(exc).partition("Stack backtrace:")[0].strip()


@dataclass(frozen=True)
class PolicyFiles:
    """The policy set as read from disk: modules by relative path, and the data document.

    Shared by the engines: the OPA engine uploads these files and reports the same revision.
    ``bundle_revision`` is the revision of the bundle they came from (``None``: from a directory).
    """

    root: Path
    modules: tuple[tuple[str, str], ...]
    data: str | None
    bundle_revision: str | None = None

    @classmethod
    def read(cls, root: Path) -> PolicyFiles:
        """Read every non-test ``*.rego`` under ``root`` and ``root/data.json`` if present."""
        if not root.is_dir():
            raise PolicyLoadError(f"policy directory {root} does not exist")
        files = sorted(f.relative_to(root).as_posix() for f in root.rglob("*.rego") if not _is_test(f))
        if not files:
            raise PolicyLoadError(f"policy directory {root} contains no policies (*.rego)")
        data_file = root / DATA_FILE
        data = _read(data_file) if data_file.is_file() else None
        return cls(root, tuple((name, _read(root / name)) for name in files), data)

    @classmethod
    def of_bundle(cls, bundle: Bundle) -> PolicyFiles:
        """A loaded OPA bundle's modules and merged data, with the bundle's revision.

        Check them off the event loop with ``check_files``, as ``checked_files`` does a directory.
        """
        data = json.dumps(bundle.data) if bundle.data else None
        return cls(Path(bundle.source), bundle.modules, data, bundle.revision)

    def files(self) -> list[tuple[str, str]]:
        """``(relative path, content)`` of every file, policies and data, sorted by path."""
        data = [(DATA_FILE, self.data)] if self.data is not None else []
        return sorted([*self.modules, *data])

    def revision(self) -> str:
        """The bundle's revision, else the ``content_revision`` of every file (any engine serving them)."""
        return self.bundle_revision or content_revision((name, text.encode()) for name, text in self.files())

    def build(self) -> regorus.Engine:
        """A compiled regorus engine holding these modules and data.

        On an error the engine is released before ``PolicyLoadError`` is raised: no frame in
        the traceback may keep it alive, since a regorus engine must be dropped by its thread.
        """
        engine = regorus.Engine()
        steps = [(self.root / name, engine.add_policy, (str(self.root / name), text)) for name, text in self.modules]
        if self.data is not None:
            steps.append((self.root / DATA_FILE, engine.add_data_json, (self.data,)))
        # regorus compiles a rule when it is first evaluated: evaluating the three entry packages (with no
        # input) surfaces errors such as unsafe variables or unknown functions now, not at the first call.
        steps.extend((self.root, engine.eval_query, (RULES[stage].removesuffix(".decision"),))
                     for stage in CALL_STAGES)
        error = next((problem for where, step, args in steps if (problem := _load_step(where, step, *args))), None)
        if error is not None:
            del engine, steps
            raise PolicyLoadError(error)
        return engine


def checked_files(path: Path) -> PolicyFiles:
    """Read, compile and check a policy directory; safe on any thread (keeps no regorus engine).

    Load off the event loop as ``EmbeddedEngine(await asyncio.to_thread(checked_files, path))``:
    the engine object itself should not pass through a worker thread, which might drop it last.
    """
    return check_files(PolicyFiles.read(Path(path)))


def check_files(files: PolicyFiles) -> PolicyFiles:
    """Compile ``files`` once; check the three entrypoints' packages exist and ``data.toolbooth.audit.mask``."""
    engine = files.build()
    packages, mask_problem = set(engine.get_packages()), _mask_problem(engine)
    del engine  # gone before any raise
    _check_packages(packages, files.root)
    if mask_problem is not None:
        raise PolicyLoadError(f"policy directory {files.root}: {mask_problem}")
    return files


def content_revision(files: Iterable[tuple[str, bytes]]) -> str:
    """``sha256:`` and 16 hex digits over the ``(path, content)`` pairs, in the order given."""
    digest = hashlib.sha256()
    for name, content in files:
        for part in (name.encode(), content):
            digest.update(len(part).to_bytes(8, "big") + part)
    return f"sha256:{digest.hexdigest()[:16]}"


def _is_test(file: Path) -> bool:
    return file.name.endswith("_test.rego")


def _read(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyLoadError(f"cannot read {file}: {exc}") from None


def _load_step(where: Path, step: Callable[..., object], *args: str) -> str | None:
    """Run one loading step; the problem as text, or ``None``."""
    try:
        step(*args)
    except Exception as exc:  # noqa: BLE001 - regorus raises plain RuntimeError/ValueError; report any as a load error
        return f"cannot load {where}: {clean_regorus_error(exc)}"
    return None


def _audit_masks_of(engine: regorus.Engine) -> dict[str, tuple[str, ...]]:
    try:
        answer = engine.eval_query(AUDIT_MASK_RULE)
    except Exception as exc:
        raise PolicyEvaluationError(f"{AUDIT_MASK_RULE}: {clean_regorus_error(exc)}") from exc
    results = answer.get("result") or []
    return parse_audit_masks(results[0]["expressions"][0]["value"] if results else None)


def _mask_problem(engine: regorus.Engine) -> str | None:
    try:
        _audit_masks_of(engine)
    except PolicyEvaluationError as exc:
        return str(exc)
    return None


def _check_packages(packages: set[str], root: Path) -> None:
    missing = [package for stage in CALL_STAGES
               if (package := RULES[stage].removesuffix(".decision")) not in packages]
    if missing:
        raise PolicyLoadError(f"policy directory {root} does not define package(s) {', '.join(missing)}")


class EmbeddedEngine:
    """``PolicyEngine`` evaluating ``data.toolbooth.<stage>.decision`` with regorus, in-process."""

    def __init__(self, sources: PolicyFiles) -> None:
        self._sources = sources
        self._revision = sources.revision()
        self._engine: regorus.Engine | None = None
        self._owner: int | None = None

    @classmethod
    def load(cls, path: Path) -> EmbeddedEngine:
        """Read, compile and check the policy directory ``path``; raise ``PolicyLoadError`` naming the file."""
        return cls(checked_files(path))

    @classmethod
    def from_bundle(cls, bundle: Bundle) -> EmbeddedEngine:
        """Compile and check a loaded OPA bundle; the revision is the bundle's."""
        return cls(check_files(PolicyFiles.of_bundle(bundle)))

    @property
    def revision(self) -> str:
        """``sha256:`` and 16 hex digits over the policies' and data's paths and contents, or the bundle's revision."""
        return self._revision

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        """Evaluate one decision."""
        return self._evaluate(stage, input)

    async def decide_many(self, stage: Stage, inputs: Sequence[PolicyInput]) -> list[Decision]:
        """Evaluate one decision per input, in order."""
        return [self._evaluate(stage, item) for item in inputs]

    def _evaluate(self, stage: Stage, input: PolicyInput) -> Decision:
        rule = RULES[stage]
        try:
            engine = self._bound_engine()
            engine.set_input_json(input.json)
            value = engine.eval_rule(rule)
        except Exception as exc:
            raise PolicyEvaluationError(f"{rule}: {clean_regorus_error(exc)}") from exc
        return parse_decision(stage, value)

    async def audit_masks(self) -> dict[str, tuple[str, ...]]:
        """``data.toolbooth.audit.mask``, checked (a data key or a rule that does not read the input)."""
        return _audit_masks_of(self._bound_engine())

    async def aclose(self) -> None:
        """Drop the compiled engine here, on its thread: left to the garbage collector, it
        could be dropped by whichever thread collects it, which regorus forbids."""
        if self._owner == threading.get_ident():
            self._engine = self._owner = None

    def _bound_engine(self) -> regorus.Engine:
        """The evaluating engine: built by the first thread that decides, usable only by that thread."""
        if self._engine is None:
            self._engine, self._owner = self._sources.build(), threading.get_ident()
        elif self._owner != threading.get_ident():
            raise RuntimeError("the embedded engine evaluates on the thread of its first decision only")
        return self._engine
