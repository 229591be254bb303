"""The fenced blocks of the Markdown docs, and the ``toolbooth`` command lines of their shell blocks.

``doc_blocks(path)`` reads every fenced block (indented ones in lists too) with its language, section and
line; a ``Listed`` table names blocks by a piece of their text, so that an entry keeps naming its block when
the doc above it changes, and ``unmatched`` says which entries name no block or more than one.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Block", "Listed", "doc_blocks", "listed", "shell_commands", "toolbooth_words", "unmatched"]

_FENCE = re.compile(r"^(?P<indent> *)```(?P<language>\S*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                    re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^#{2,4} (.+)$", re.MULTILINE)
_HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
_SEPARATORS = {"&&", "||", "|", ";", "&", "(", ")", ">", ">>", "<", "<<", "$"}

# (doc file name, a piece of a block's text): an entry of a table that names blocks
Listed = tuple[str, str]


@dataclass(frozen=True)
class Block:
    """One fenced block: its doc, first line (of the fence), language (``""``: unlabelled), section and text."""

    doc: str
    line: int
    language: str
    section: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    def names(self, entry: Listed) -> bool:
        return entry[0] == self.doc and entry[1] in self.text


def doc_blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, in order; an indented block's text is dedented by its fence's indent."""
    markdown = path.read_text()
    headings = [(match.start(), match.group(1)) for match in _HEADING.finditer(markdown)]
    found = []
    for match in _FENCE.finditer(markdown):
        indent = len(match.group("indent"))
        text = "".join(line[indent:] if line[:indent].isspace() else line
                       for line in match.group("body").splitlines(keepends=True))
        section = next((title for start, title in reversed(headings) if start < match.start()), "")
        found.append(Block(path.name, markdown.count("\n", 0, match.start()) + 1, match.group("language"),
                           section, text))
    return found


def listed(block: Block, table: Mapping[Listed, object]) -> Listed | None:
    """The entry of ``table`` that names ``block``, if any."""
    return next((entry for entry in table if block.names(entry)), None)


def unmatched(table: Iterable[Listed], blocks: list[Block]) -> list[str]:
    """The entries of ``table`` that name no block of ``blocks`` or more than one."""
    problems = []
    for entry in table:
        count = sum(block.names(entry) for block in blocks)
        if count != 1:
            problems.append(f"{entry!r} names {count} blocks")
    return problems


def shell_commands(text: str) -> list[str]:
    """The logical command lines of a shell block: continuation lines joined, lines joined while a quote is open,
    here-document bodies left out."""
    lines = text.splitlines()
    commands: list[str] = []
    pending = ""
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on on the next line
            continue
        heredoc = _HEREDOC.search(pending)
        if heredoc is not None:
            while index < len(lines) and lines[index].strip() != heredoc.group(1):
                index += 1
            index += 1
        commands.append(pending)
        pending = ""
    if pending:
        commands.append(pending)
    return commands


def toolbooth_words(command: str, variables: Mapping[str, str]) -> list[list[str]]:
    """The arguments of each ``toolbooth`` (or ``.../bin/toolbooth``) invocation in ``command``, up to the next
    shell operator, each ``$NAME`` or ``${NAME}`` replaced by ``variables[NAME]`` (``KeyError``: not given)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words = list(lexer)
    invocations = []
    for start, word in enumerate(words):
        if (word != "toolbooth" and not word.endswith("/bin/toolbooth")) or not _command_position(words, start):
            continue
        end = next((i for i in range(start + 1, len(words)) if words[i] in _SEPARATORS), len(words))
        invocations.append([_substitute(arg, variables) for arg in words[start + 1:end]])
    return invocations


def _command_position(words: list[str], index: int) -> bool:
    """Whether ``words[index]`` is a command's name: first, after an operator, or after ``env``, ``--`` or an
    assignment (``kubectl exec POD -- env TOKEN=x toolbooth ...``), not an option's value."""
    before = words[index - 1] if index else None
    return before is None or before in _SEPARATORS or before in ("env", "--") or _ASSIGNMENT.match(before) is not None


def _substitute(word: str, variables: Mapping[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda match: variables[match.group(1)], word)
