"""The inbox's ``shown`` template filter: a value as HTML, isolated and with every hidden character marked.

Each value a page shows as text (an argument, a label, who asked, a reason, a comment) goes through
``shown``: escaped, each character ``sidecar.display`` marks replaced by its mark in a
``<span class="mark">`` (so a bidirectional control or a zero-width space is seen, never obeyed), and the
whole in ``<bdi>`` (isolated: a right-to-left value cannot reorder the text around it). Attribute values
(ids, hashes, links) are not shown text and do not go through it.
"""

from __future__ import annotations

from markupsafe import Markup, escape

from sidecar.display import segments

__all__ = ["shown"]

_MARK = Markup('<span class="mark" title="a character that would not be seen, shown by its code point">{}</span>')


def shown(value: object) -> Markup:
    """``value`` (its ``str``) as isolated, escaped HTML with its hidden characters marked."""
    parts = (_MARK.format(run) if marked else escape(run) for run, marked in segments(str(value)))
    return Markup("<bdi>{}</bdi>").format(Markup("").join(parts))
