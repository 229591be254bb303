"""The stages of one call, one module each, in the order a real call meets them (DESIGN.md, stages 2-9):
``audit`` (outermost: sees every result), ``resolve`` (+ availability), ``validate``, ``authorize``,
``approval``, ``idempotency``, ``dispatch`` (last: runs the handler and shapes its result)."""

from __future__ import annotations

__all__: list[str] = []
