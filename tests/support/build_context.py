"""What ``docker build`` would send as its context: the repository's files less those ``.dockerignore`` excludes.

The patterns are read as Docker reads them, for the forms ``.dockerignore`` uses: a path relative to the
context root, ``*`` within one path element, ``?`` one character, ``[...]`` a class, ``**`` any number of
elements; ``!`` re-includes; the last pattern that matches a file, or one of its directories, decides.
Anything else (``\\`` escapes, patterns starting with ``/``) is refused rather than guessed at. And the versions
the build installs, from ``constraints.txt``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from packaging.utils import canonicalize_name

__all__ = ["context_files", "pinned_versions"]


def _regex(pattern: str) -> re.Pattern[str]:
    if "\\" in pattern or pattern.startswith("/"):
        raise ValueError(f"{pattern!r}: a .dockerignore form these tests do not read")
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i:end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def _rules(dockerignore: Path) -> tuple[list[tuple[bool, re.Pattern[str]]], list[str]]:
    """The rules in order, and the literal beginnings of the re-including ones (to skip what none can reach)."""
    rules, reachable = [], []
    for line in dockerignore.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep, pattern = line.startswith("!"), line.removeprefix("!").rstrip("/")
        rules.append((keep, _regex(pattern)))
        if keep:
            reachable.append(re.split(r"[*?\[]", pattern)[0])
    return rules, reachable


def _excluded(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for keep, regex in rules:
        if any(regex.match(prefix) for prefix in prefixes):
            excluded = not keep
    return excluded


def context_files(root: Path) -> list[str]:
    """The files under ``root`` in the build context: every file (git-ignored ones too, as Docker reads no
    ``.gitignore``: a virtualenv, caches, a local database) less what ``.dockerignore`` excludes."""
    rules, reachable = _rules(root / ".dockerignore")
    found = []
    for directory, subdirectories, names in os.walk(root):
        here = Path(directory).relative_to(root).as_posix()
        # An excluded directory no re-including rule reaches holds nothing of the context (.git, .venv).
        subdirectories[:] = [name for name in subdirectories if not (
            _excluded(path := (f"{here}/{name}" if here != "." else name), rules)
            and not any(start.startswith(path + "/") or path.startswith(start) for start in reachable))]
        for name in names:
            path = (Path(directory) / name).relative_to(root).as_posix()
            if not _excluded(path, rules):
                found.append(path)
    return sorted(found)


def pinned_versions(root: Path) -> dict[str, str]:
    """The versions ``constraints.txt`` of ``root`` pins (``name==version`` lines), by canonical name."""
    lines = [line for line in (root / "constraints.txt").read_text().splitlines() if not line.startswith("#")]
    return {canonicalize_name(name): version for name, version in (line.split("==") for line in lines)}
