"""A search query as words: the same words for both backends, never the backends' own query syntax.

The query is plain text: its words (letters and digits; anything else separates them) are looked up,
all of them (AND), stemmed by each backend (Porter in SQLite, the ``english`` configuration in PostgreSQL).
Common English words are dropped first — the list is PostgreSQL's ``english`` stop words, so that both
backends ignore the same ones. Operators, quotes and column filters mean nothing: a query cannot reach
what the index does not offer (such as the body of a restricted document).
"""

from __future__ import annotations

import re

__all__ = ["STOP_WORDS", "fts5_query", "query_words"]

STOP_WORDS = frozenset("""
i me my myself we our ours ourselves you your yours yourself yourselves he him his himself she her hers herself
it its itself they them their theirs themselves what which who whom this that these those am is are was were be
been being have has had having do does did doing a an the and but if or because as until while of at by for with
about against between into through during before after above below to from up down in out on off over under
again further then once here there when where why how all any both each few more most other some such no nor not
only own same so than too very s t can will just don should now
""".split())

_WORD = re.compile(r"[^\W_]+")


def query_words(query: str) -> tuple[str, ...]:
    """The distinct words of ``query`` to look up, lower case, in order; empty if it has none but stop words."""
    found: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        if word not in STOP_WORDS:
            found.setdefault(word)
    return tuple(found)


def fts5_query(words: tuple[str, ...]) -> str:
    """An FTS5 MATCH expression requiring every word (each a quoted string: no operator can slip in)."""
    return " AND ".join(f'"{word}"' for word in words)
