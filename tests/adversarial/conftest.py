"""The real-server fixtures of the integration tests, shared rather than copied."""

from __future__ import annotations

from tests.integration.conftest import make_settings, serve_in_background, socket_path

__all__ = ["make_settings", "serve_in_background", "socket_path"]
