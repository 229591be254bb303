"""The policy engines by kind: the one table (``ENGINES``) saying how each value of ``policy.engine`` opens.

A row (``EngineFactory``) names its engine for people, says whether the engine decides on local policy
files (``policy.path`` or a bundle, which it compiles or uploads) or on what its server manages itself,
whether opening it contacts a server, and opens it: over a policy directory, over a set of files already
read and checked (a reloaded set, a bundle, a candidate of ``policy replay``), or over the policies its
server manages. ``sidecar.policy.factory`` (what ``serve`` runs), ``toolbooth config validate`` and the
dev tools (``policy check``, ``eval``, ``replay``) read this table and nothing else about the kind: a new
engine is a value of ``PolicyEngineKind`` with its settings section, one engine module and one row here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from sidecar.config import OpaSettings, PolicyEngineKind, PolicySettings
from sidecar.errors import PolicyLoadError
from sidecar.policy.compiling import compiled
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.engine import PolicyEngine
from sidecar.policy.files import PolicyFiles, check_files, checked_files

__all__ = ["ENGINES", "UPLOAD_FLAG", "EngineFactory", "engine_for", "may_send", "open_candidate", "open_engine"]


class EngineFactory(Protocol):
    """How one kind of engine is described and opened, from the ``policy`` settings."""

    @property
    def contacts_server(self) -> bool:
        """Whether opening the engine talks to a server (``config validate`` then compiles the files here)."""
        ...

    def label(self, settings: PolicySettings) -> str:
        """The engine for people: ``embedded``, ``opa http://opa:8181``."""
        ...

    def managed(self, settings: PolicySettings) -> str | None:
        """What its server serves, when the engine decides on policies the server manages itself (nothing is
        read or uploaded here); ``None`` when it decides on local policy files."""
        ...

    async def open_directory(self, settings: PolicySettings, path: Path) -> PolicyEngine:
        """The engine deciding on the policy directory ``path``; ``PolicyLoadError`` naming the file."""
        ...

    async def open_files(self, settings: PolicySettings, files: PolicyFiles) -> PolicyEngine:
        """The engine deciding on ``files``, read and checked already."""
        ...

    async def open_managed(self, settings: PolicySettings) -> PolicyEngine:
        """The engine deciding on what its server manages (only when ``managed`` says so)."""
        ...


class _Embedded:
    """Rego evaluated in this process by regorus (``sidecar.policy.embedded``)."""

    contacts_server = False

    def label(self, settings: PolicySettings) -> str:
        return "embedded"

    def managed(self, settings: PolicySettings) -> str | None:
        return None

    async def open_directory(self, settings: PolicySettings, path: Path) -> PolicyEngine:
        return EmbeddedEngine(await compiled(checked_files, path))

    async def open_files(self, settings: PolicySettings, files: PolicyFiles) -> PolicyEngine:
        return EmbeddedEngine(files)

    async def open_managed(self, settings: PolicySettings) -> PolicyEngine:
        raise PolicyLoadError("the embedded engine decides on local policy files only")


class _Opa:
    """An OPA server over its REST API (``sidecar.policy.opa``), which OPA compiles the uploaded files for."""

    contacts_server = True

    def label(self, settings: PolicySettings) -> str:
        return f"opa {_opa(settings).url}"

    def managed(self, settings: PolicySettings) -> str | None:
        opa = _opa(settings)
        return None if opa.upload_policies else f"OPA-managed policies at {opa.url}"

    async def open_directory(self, settings: PolicySettings, path: Path) -> PolicyEngine:
        return await self._open(settings, PolicyFiles.read(Path(path)))  # OPA's own compile errors name the file

    async def open_files(self, settings: PolicySettings, files: PolicyFiles) -> PolicyEngine:
        return await self._open(settings, files)

    async def open_managed(self, settings: PolicySettings) -> PolicyEngine:
        return await self._open(settings, None)

    @staticmethod
    async def _open(settings: PolicySettings, files: PolicyFiles | None) -> PolicyEngine:
        from sidecar.policy.opa import OpaEngine  # aiohttp is only imported when OPA is configured

        return await OpaEngine.open(_opa(settings), files)


def _opa(settings: PolicySettings) -> OpaSettings:
    assert settings.opa is not None  # config validation requires the section for this engine
    return settings.opa


ENGINES: dict[PolicyEngineKind, EngineFactory] = {PolicyEngineKind.EMBEDDED: _Embedded(),
                                                  PolicyEngineKind.OPA: _Opa()}


UPLOAD_FLAG = "--upload"  # the dev tools' word that the configured server may be sent what they try


def may_send(settings: PolicySettings, *, upload: bool) -> None:
    """``PolicyLoadError`` when a dev tool (check, eval, replay) would send policies to a server that serves what it
    is sent (OPA uploading) and ``upload`` does not say that server is one to try them on."""
    factory = engine_for(settings)
    if factory.contacts_server and factory.managed(settings) is None and not upload:
        raise PolicyLoadError(f"{factory.label(settings)} would be sent these policies in place of those it serves, "
                              f"to every sidecar deciding there: pass {UPLOAD_FLAG} if none does (a scratch server), "
                              "or name the embedded engine")


def engine_for(settings: PolicySettings) -> EngineFactory:
    """The row of ``policy.engine``."""
    return ENGINES[settings.engine]


async def open_engine(settings: PolicySettings, path: Path | None = None) -> PolicyEngine:
    """The engine ``policy.engine`` names, over the policy directory ``path`` (default ``policy.path``) or, with
    no ``path``, the policies its server manages; ``PolicyLoadError`` when it cannot start."""
    factory = engine_for(settings)
    if path is None and factory.managed(settings) is not None:
        return await factory.open_managed(settings)
    root = settings.path if path is None else path
    return await _sending(settings, root).open_directory(settings, root)


async def open_candidate(settings: PolicySettings, path: Path) -> PolicyEngine:
    """The configured engine deciding on the policy directory or bundle file ``path`` (the bundle's signature is
    not checked); ``PolicyLoadError`` saying why it cannot."""
    if path.is_dir():
        return await open_engine(settings, path)
    if not path.exists():
        raise PolicyLoadError(f"no policy directory or bundle at {path}")
    return await _sending(settings, path).open_files(settings, await compiled(_bundle_files, path))


def _sending(settings: PolicySettings, path: Path) -> EngineFactory:
    """The configured engine's row, if it can be given the policies at ``path``."""
    factory = engine_for(settings)
    if factory.managed(settings) is not None:
        raise PolicyLoadError(f"{factory.label(settings)} decides on the policies its server manages "
                              f"(upload_policies: false): {path} cannot be sent to it")
    return factory


def _bundle_files(path: Path) -> PolicyFiles:
    from sidecar.policy.bundle.format import load_bundle  # only for a bundle file

    return check_files(load_bundle(path, skip_verification=True).policy_files())
