"""Toolbooth email plugin: ``send_email_preview`` and ``send_email``, real SMTP delivery of approved drafts.

Exposed to the sidecar through the ``toolbooth.tools`` entry point ``email``, which names ``TOOLS``.
Configuration: ``toolbooth_email.settings`` (a TOML file named by ``TOOLBOOTH_EMAIL_CONFIG``, and the
environment); the rules: ``toolbooth_email.rules``; what a failed delivery means: ``toolbooth_email.delivery``.
"""

from __future__ import annotations

from typing import Any

from sidecar.plugin import ToolDefinition
from toolbooth_email.tools import render_send_email, send_email, send_email_preview

__all__ = ["TOOLS", "render_send_email", "send_email", "send_email_preview"]

TOOLS: list[ToolDefinition[Any, Any]] = [send_email_preview, send_email]
