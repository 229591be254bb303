"""Opening the configured policy engine, and closing it."""

from __future__ import annotations

from sidecar.config import PolicyEngineKind, PolicySettings
from sidecar.policy import PolicyEngine
from sidecar.policy.embedded import EmbeddedEngine


async def open_engine(settings: PolicySettings) -> PolicyEngine:
    """The engine ``policy.engine`` names, over ``policy.path``; ``PolicyLoadError`` when it cannot start."""
    if settings.engine is PolicyEngineKind.OPA:
        from sidecar.policy.opa import OpaEngine  # aiohttp is only imported when OPA is configured

        assert settings.opa is not None  # config validation requires the section for this engine
        return await OpaEngine.open(settings.opa, settings.path)
    return EmbeddedEngine.load(settings.path)


async def close_engine(engine: PolicyEngine) -> None:
    """Release what ``engine`` holds (the OPA engine's HTTP session); engines without ``aclose`` hold nothing."""
    aclose = getattr(engine, "aclose", None)
    if aclose is not None:
        await aclose()
