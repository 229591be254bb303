"""The stages of one call, one module each, numbered in the order a real call meets them (``sidecar.pipeline.order``):
0 the observers ``trace``, ``log_context``, ``metrics``; 1 ``audit`` (sees every result); 2 ``request``;
3 ``resolve`` (+ availability); 4 ``validate``; 5 ``authorize``; 6 ``approval``; 7 ``idempotency``;
8 ``consume_approval``; 9 ``dispatch`` (last: runs the handler and ends the call with its result)."""

from __future__ import annotations

__all__: list[str] = []
