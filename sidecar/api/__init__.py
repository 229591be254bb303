"""Toolbooth's wire API: the generated ``toolbooth.v1`` modules and ``convert`` (domain types <-> messages)."""

from __future__ import annotations

__all__: list[str] = []
