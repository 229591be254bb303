"""The tool concept in one package: definitions (``definition``), the registry of installed plugins
(``registry``), argument validation (``validation``), masking of sensitive values (``masking``) and
running a handler (``dispatch``). Plugin authors import from ``sidecar.plugin`` instead."""

from __future__ import annotations

__all__: list[str] = []
