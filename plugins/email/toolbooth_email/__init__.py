"""Toolbooth email plugin: ``send_email_preview`` and ``send_email``, real SMTP delivery of approved drafts.

Exposed to the sidecar through the ``toolbooth.tools`` entry point ``email``, which names ``PLUGIN``: the tools
and their settings, ``plugins.config.email`` (``toolbooth_email.settings.EmailSettings``); the rules:
``toolbooth_email.rules``; what a failed delivery means: ``toolbooth_email.delivery``.
"""

from __future__ import annotations

from typing import Any

from sidecar.plugin import Plugin, ToolDefinition
from toolbooth_email.settings import EmailSettings
from toolbooth_email.tools import render_send_email, send_email, send_email_preview

__all__ = ["PLUGIN", "TOOLS", "EmailSettings", "render_send_email", "send_email", "send_email_preview"]

TOOLS: list[ToolDefinition[Any, Any]] = [send_email_preview, send_email]
PLUGIN = Plugin(TOOLS, settings=EmailSettings)
