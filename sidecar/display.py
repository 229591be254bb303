"""Text shown to a person who decides on it (an approver): every character it holds visible, in the order it runs.

A value a person approves may hold characters that change what it seems to say without being seen:
bidirectional controls reorder what follows (``"\\u202e9876\\u202c"`` reads "6789"), zero-width and
other format characters vanish (``"10\\u200b0"`` reads "100"), control characters move a terminal's
cursor, spaces other than U+0020 look like one. ``segments`` splits a text into what is shown as it
is and ``MARKED`` characters, each shown as its code point between ``⟦ ⟧`` (``⟦U+202E⟧``); ``visible``
joins them into one string (the command line), the inbox wraps each mark in an element of its own
and the whole value in ``<bdi>``. The brackets are marked themselves, so a text cannot spell a mark.

Marked: Unicode categories Cc (control characters, except line break and tab, which lay text out), Cf
(format: the bidirectional controls U+202A to U+202E, U+2066 to U+2069, U+200E/U+200F, U+061C, the
zero-width characters, the soft hyphen, the byte order mark, the tag characters), Zs other than the
space, Zl, Zp, Co, Cs and Cn (private, lone surrogate, unassigned: no one knows how they show), and the
blank letters and variation selectors of ``_BLANK``, which show as nothing. Letters, digits, combining
marks and symbols of every script are shown as they are.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator

__all__ = ["is_blank", "is_marked", "segments", "visible"]

_MARK = "⟦U+{:04X}⟧"
_KEPT = frozenset("\n\t ")
_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp", "Cn", "Co", "Cs"})
_BRACKETS = frozenset([0x27E6, 0x27E7])  # the marks' brackets, marked so that a text cannot spell a mark
_BLANK = frozenset([0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x2800, 0x3164, 0xFFA0,
                    *range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0), *range(0x180B, 0x1810)])


def is_marked(char: str) -> bool:
    """Whether ``char`` (one character) is shown as its mark rather than as itself."""
    return _hidden(char) or ord(char) in _BRACKETS


def is_blank(text: str) -> bool:
    """Whether ``text`` shows nothing: only spaces and characters marked for being invisible (``"\u200b"``)."""
    return all(char.isspace() or _hidden(char) for char in text)


def _hidden(char: str) -> bool:
    """Whether ``char`` shows as nothing, or not as itself: marked for that (the brackets are marked besides)."""
    return char not in _KEPT and (ord(char) in _BLANK or unicodedata.category(char) in _CATEGORIES)


def segments(text: str) -> Iterator[tuple[str, bool]]:
    """``text`` as runs shown as they are (``False``) and marks of single characters (``True``: its code point,
    ``⟦U+202E⟧``), in order."""
    start = 0
    for index, char in enumerate(text):
        if is_marked(char):
            if index > start:
                yield text[start:index], False
            yield _MARK.format(ord(char)), True
            start = index + 1
    if start < len(text):
        yield text[start:], False


def visible(text: str) -> str:
    """``text`` with every marked character replaced by its mark: what a terminal shows exactly as it runs."""
    return "".join(run for run, _ in segments(text))
