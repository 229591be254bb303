"""What the sidecar tells operators about its calls beyond the audit log: traces (``tracing``), the trace
context callers send (``propagation``) and log lines (``logs``, with each call's fields from ``call_log``)."""
