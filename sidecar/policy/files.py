"""The policy set as read from disk, compiled and checked once, and its revision.

A policy directory holds Rego modules (``**/*.rego``; ``*_test.rego`` files are
policy tests and are not loaded) and an optional ``data.json`` at its root,
which becomes ``data``. Hidden files and directories (a name starting with ``.``) are
skipped (``policy_paths``): among them the versions a Kubernetes ConfigMap volume keeps
(``..data``, ``..<timestamp>``), whose current one the visible files link to.
``checked_files`` reads one and checks it with a throwaway regorus engine: every
module compiles, no rule hides one of OPA's built-ins (``sidecar.policy.shadowing``),
the three entry packages exist, and ``data.toolbooth.audit.mask`` and ``data.toolbooth.history`` are well formed.
Every engine serves a ``PolicyFiles`` and reports its ``revision``, a content hash
(or the bundle's revision), so the embedded and the OPA engine name the same set alike.

A regorus engine must be dropped by the thread that made it: no function here keeps
one, or lets a traceback keep one alive, so they are safe on any thread.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sidecar.errors import PolicyEvaluationError, PolicyLoadError
from sidecar.policy._regorus import regorus
from sidecar.policy.decision import AUDIT_MASK_RULE, CALL_STAGES, RULES, parse_audit_masks
from sidecar.policy.history import HISTORY_RULE, HistoryNeeds, parse_history_needs
from sidecar.policy.reads import decision_reads
from sidecar.policy.shadowing import shadowing

__all__ = ["DATA_FILE", "TEST_SUFFIX", "PolicyFiles", "check_files", "checked_files", "clean_regorus_error",
           "content_revision", "policy_paths", "read_audit_masks", "read_history_needs"]

DATA_FILE = "data.json"
TEST_SUFFIX = "_test.rego"  # policy tests: never loaded to serve, only by the test runner


def clean_regorus_error(exc: BaseException) -> str:
    """The regorus message, without a Rust backtrace appended (none is captured: ``sidecar.policy._regorus``
    turns library backtraces off, but a process that imported regorus otherwise may still have them)."""
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
        files = [f.relative_to(root).as_posix() for f in policy_paths(root, "*.rego") if not _is_test(f)]
        if not files:
            raise PolicyLoadError(f"policy directory {root} contains no policies (*.rego)")
        data_file = root / DATA_FILE
        data = _read(data_file) if data_file.is_file() else None
        return cls(root, tuple((name, _read(root / name)) for name in files), data)

    def with_tests(self) -> PolicyFiles:
        """These files plus every ``*_test.rego`` under ``root``, sorted by path (what the test runner loads)."""
        tests = tuple((f.relative_to(self.root).as_posix(), _read(f)) for f in policy_paths(self.root, "*.rego")
                      if _is_test(f))
        return dataclasses.replace(self, modules=self.modules + tests)

    def files(self) -> list[tuple[str, str]]:
        """``(relative path, content)`` of every file, policies and data, sorted by path."""
        data = [(DATA_FILE, self.data)] if self.data is not None else []
        return sorted([*self.modules, *data])

    def mentions(self, word: str) -> bool:
        """Whether any policy module or the data contains ``word`` (a policy that may read an input field)."""
        return any(word in text for _, text in self.files())

    def revision(self) -> str:
        """The bundle's revision, else the ``content_revision`` of every file (any engine serving them)."""
        return self.bundle_revision or content_revision((name, text.encode()) for name, text in self.files())

    def build(self) -> regorus.Engine:
        """A compiled regorus engine holding these modules and data.

        On an error the engine is released before ``PolicyLoadError`` is raised: no frame in
        the traceback may keep it alive, since a regorus engine must be dropped by its thread.
        """
        engine = regorus.Engine()
        steps: list[tuple[Path, Callable[..., object], tuple[str, ...]]] = [
            (self.root / name, engine.add_policy, (str(self.root / name), text)) for name, text in self.modules]
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

    Load off the event loop as ``EmbeddedEngine(await compiled(checked_files, path))`` (``sidecar.policy.compiling``):
    the engine object itself should not pass through a worker thread, which might drop it last.
    """
    return check_files(PolicyFiles.read(Path(path)))


def check_files(files: PolicyFiles) -> PolicyFiles:
    """Compile ``files`` once; check no rule hides a built-in, the three entrypoints' packages exist,
    ``data.toolbooth.audit.mask`` and ``data.toolbooth.history``."""
    engine = files.build()
    hiding = shadowing(json.loads(engine.get_ast_as_json()))
    packages, data_problem = set(engine.get_packages()), _data_problem(engine, files)
    del engine  # gone before any raise
    if hiding:
        raise PolicyLoadError(hiding)
    _check_packages(packages, files.root)
    if data_problem is not None:
        raise PolicyLoadError(f"policy directory {files.root}: {data_problem}")
    return files


def policy_paths(root: Path, pattern: str) -> list[Path]:
    """The files under ``root`` matching ``pattern``, sorted, without hidden ones (in a hidden directory or
    named ``.*``): a ConfigMap volume's ``..<timestamp>`` versions are not loaded beside the files linking
    into the current one."""
    return sorted(path for path in root.rglob(pattern)
                  if not any(part.startswith(".") for part in path.relative_to(root).parts))


def content_revision(files: Iterable[tuple[str, bytes]]) -> str:
    """``sha256:`` and 16 hex digits over the ``(path, content)`` pairs, in the order given."""
    digest = hashlib.sha256()
    for name, content in files:
        for part in (name.encode(), content):
            digest.update(len(part).to_bytes(8, "big") + part)
    return f"sha256:{digest.hexdigest()[:16]}"


def read_audit_masks(engine: regorus.Engine) -> dict[str, tuple[str, ...]]:
    """``data.toolbooth.audit.mask`` of a compiled engine, checked; ``PolicyEvaluationError`` when it fails."""
    return parse_audit_masks(_value(engine, AUDIT_MASK_RULE))


def read_history_needs(engine: regorus.Engine, files: PolicyFiles) -> HistoryNeeds:
    """What of a call's history the compiled ``files`` read (``data.toolbooth.history``, checked, the words their
    modules and data mention, and what each decision's modules name: ``decision_reads``); ``PolicyEvaluationError``
    when it fails."""
    return parse_history_needs(_value(engine, HISTORY_RULE), files.mentions, decision_reads(files.modules))


def _value(engine: regorus.Engine, rule: str) -> object:
    """The value of a rule that does not read the input (``None``: undefined)."""
    answer, problem = None, None
    try:
        answer = engine.eval_query(rule)
    except Exception as exc:  # noqa: BLE001 - regorus raises plain RuntimeError
        problem = clean_regorus_error(exc)
    del engine  # no traceback from here on may keep it alive: a regorus engine must be dropped by its thread
    if problem is not None or not isinstance(answer, dict):
        raise PolicyEvaluationError(f"{rule}: {problem or 'no answer'}")
    results = answer.get("result") or []
    return results[0]["expressions"][0]["value"] if results else None


def _is_test(file: Path) -> bool:
    return file.name.endswith(TEST_SUFFIX)


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


def _data_problem(engine: regorus.Engine, files: PolicyFiles) -> str | None:
    try:
        read_audit_masks(engine)
        read_history_needs(engine, files)
    except PolicyEvaluationError as exc:
        return str(exc)
    return None


def _check_packages(packages: set[str], root: Path) -> None:
    missing = [package for stage in CALL_STAGES
               if (package := RULES[stage].removesuffix(".decision")) not in packages]
    if missing:
        raise PolicyLoadError(f"policy directory {root} does not define package(s) {', '.join(missing)}")
