"""Tools for policy authors, behind ``toolbooth policy``: the Rego test runner (``runner``) and the
dry run of decisions (``dry_run``). Import them from their modules; nothing is re-exported here."""

from __future__ import annotations

__all__: list[str] = []
