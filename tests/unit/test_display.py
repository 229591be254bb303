"""What a person deciding on a text sees of it: every hidden or reordering character marked by its code point."""

from __future__ import annotations

import pytest

from sidecar.display import is_blank, is_marked, segments, visible
from sidecar.server.approvals_ui.shown import shown


@pytest.mark.parametrize(("text", "seen"), [
    ("\u202e9876\u202c", "⟦U+202E⟧9876⟦U+202C⟧"),  # reads "6789" when obeyed
    ("10\u200b0", "10⟦U+200B⟧0"),  # reads "100" when unseen
    ("\u2066a\u2069 \u200e\u200f\u061c", "⟦U+2066⟧a⟦U+2069⟧ ⟦U+200E⟧⟦U+200F⟧⟦U+061C⟧"),
    ("pay\u00a0\u3000\u2028\u2029", "pay⟦U+00A0⟧⟦U+3000⟧⟦U+2028⟧⟦U+2029⟧"),  # spaces that are not the space
    ("\x1b[31mred\r", "⟦U+001B⟧[31mred⟦U+000D⟧"),  # a terminal would obey them
    ("tag\U000e0041\ufeff\u00ad", "tag⟦U+E0041⟧⟦U+FEFF⟧⟦U+00AD⟧"),  # tag characters smuggle text unseen
    ("\u3164\u2800\ufe0f\U000f0000\U0010ffff", "⟦U+3164⟧⟦U+2800⟧⟦U+FE0F⟧⟦U+F0000⟧⟦U+10FFFF⟧"),
    ("⟦U+0030⟧", "⟦U+27E6⟧U+0030⟦U+27E7⟧"),  # a text cannot spell a mark
])
def test_hidden_characters_are_marked(text: str, seen: str) -> None:
    assert visible(text) == seen


def test_what_is_seen_as_it_is_stays_as_it_is() -> None:
    hebrew, arabic = "\u05e9\u05dc\u05d5\u05dd", "\u0645\u0631\u062d\u0628\u0627"  # letters: shown, isolated
    text = f"Hello, José!\n\t{hebrew} · {arabic} · 日本語 · é (e\u0301) 👍 a\u200db"
    assert visible(text) == text.replace("\u200d", "⟦U+200D⟧")
    assert not any(is_marked(char) for char in f"\n\t azAZ09é日👍\u0301{hebrew}{arabic}")


def test_segments_tell_marks_from_text() -> None:
    assert list(segments("a\u202eb")) == [("a", False), ("⟦U+202E⟧", True), ("b", False)]
    assert list(segments("")) == [] and list(segments("\u200b")) == [("⟦U+200B⟧", True)]


def test_the_inbox_isolates_escapes_and_marks() -> None:
    assert shown("<b>\u202e9876</b>") == ('<bdi>&lt;b&gt;<span class="mark" title="a character that would not be '
                                         'seen, shown by its code point">⟦U+202E⟧</span>9876&lt;/b&gt;</bdi>')
    assert shown(None) == "<bdi>None</bdi>"


def test_blank_is_what_shows_nothing() -> None:
    assert all(is_blank(text) for text in ("", " \n\t", "\u200b\u200b", "\ufeff", "\u00a0\u3000\u2028", "\u2060\u180e"))
    assert not any(is_blank(text) for text in ("no", " \u200bx", "\u27e6", "\u0301\u200b", "👍"))
