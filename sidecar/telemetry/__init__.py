"""What the sidecar tells operators about its calls beyond the audit log: traces (``tracing``, ``spans``), the trace
context callers send (``propagation``) and log lines (``logs``, with each call's fields from ``call_log``)."""

from __future__ import annotations

__all__: list[str] = []
