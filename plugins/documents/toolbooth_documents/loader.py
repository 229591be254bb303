"""Documents from a directory of Markdown and text files, for the indexer.

Every ``*.md``, ``*.markdown`` and ``*.txt`` file below the directory (hidden files and directories
skipped) is one document, read as UTF-8:

- optional YAML front matter (between ``---`` lines at the very top) may set ``title``,
  ``updated_at`` (an ISO 8601 date or time; UTC if it has no offset) and ``restricted: true`` (the
  indexer's ``--restricted`` restricts every file);
  other keys are ignored, and the front matter is not part of the body;
- the title is the front matter's, else the first Markdown heading (``# Title`` or ``Title`` over
  ``===``), else the file name without its suffix (``-`` and ``_`` read as spaces);
- ``updated_at`` is the front matter's, else the file's modification time;
- the id is ``doc_`` and 24 hex digits of a hash of tenant, project and the path below the directory,
  so indexing the same tree again updates the same documents.

A file that cannot be used (not UTF-8, too large, bad front matter) is reported, never half-loaded.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import yaml

from toolbooth_documents.records import Document, document_id

__all__ = ["MAX_FILE_BYTES", "MAX_TITLE_CHARS", "SUFFIXES", "Skipped", "load_directory", "load_file"]

SUFFIXES = (".md", ".markdown", ".txt")
MAX_FILE_BYTES = 2 * 1024 * 1024
MAX_TITLE_CHARS = 300

_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)^(?:---|\.\.\.)[ \t]*(?:\r?\n|\Z)", re.DOTALL | re.MULTILINE)
_ATX = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(?:=+|-+)[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


@dataclass(frozen=True, slots=True)
class Skipped:
    """A file that was not loaded, and why."""

    path: Path
    reason: str


def load_directory(root: Path, *, tenant: str, project_id: str, restricted: bool = False,
                   progress: Callable[[int, int], None] | None = None) -> tuple[list[Document], list[Skipped]]:
    """The documents of the files below ``root``, by path; and the files that could not be loaded.
    ``progress`` is told, after each file, how many have been read of how many there are."""
    documents: list[Document] = []
    skipped: list[Skipped] = []
    paths = list(_files(root))
    for done, path in enumerate(paths, start=1):
        try:
            documents.append(load_file(path, root, tenant=tenant, project_id=project_id, restricted=restricted))
        except ValueError as exc:
            skipped.append(Skipped(path, str(exc)))
        if progress is not None:
            progress(done, len(paths))
    return documents, skipped


def load_file(path: Path, root: Path, *, tenant: str, project_id: str, restricted: bool = False) -> Document:
    """One file as a document, restricted if ``restricted`` or its front matter says so; ``ValueError`` if it
    cannot be used."""
    stat = path.stat()
    if stat.st_size > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start})") from None
    text = text.removeprefix("\ufeff")
    meta, body = _front_matter(text)
    markdown = path.suffix.lower() != ".txt"
    title = _text(meta, "title") or (_heading(body) if markdown else None) or _from_name(path)
    updated = _moment(meta["updated_at"]) if "updated_at" in meta else datetime.fromtimestamp(int(stat.st_mtime), UTC)
    flag = meta.get("restricted", False)
    if not isinstance(flag, bool):
        raise ValueError(f"front matter 'restricted' must be true or false, got {flag!r}")
    source = path.relative_to(root).as_posix()
    return Document(document_id=document_id(tenant, project_id, source), tenant=tenant, project_id=project_id,
                    source=source, title=title[:MAX_TITLE_CHARS], body=body, restricted=restricted or flag,
                    updated_at=updated)


def _files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).parts
        if path.is_file() and path.suffix.lower() in SUFFIXES and not any(p.startswith(".") for p in relative):
            yield path


def _front_matter(text: str) -> tuple[dict[str, Any], str]:
    found = _FRONT_MATTER.match(text)
    if found is None:
        return {}, text
    try:
        meta = yaml.safe_load(found.group(1))
    except yaml.YAMLError as exc:
        raise ValueError(f"front matter is not valid YAML: {' '.join(str(exc).split())}") from None
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise ValueError("front matter must be a mapping (key: value lines)")
    return meta, text[found.end():]


def _text(meta: dict[str, Any], key: str) -> str | None:
    value = meta.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"front matter {key!r} must be non-empty text, got {value!r}")
    return value.strip()


def _heading(body: str) -> str | None:
    lines = body.splitlines()
    fenced = False
    for number, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
        elif fenced:
            continue
        elif found := _ATX.match(line):
            return found.group(1).strip()
        elif (line.strip() and number + 1 < len(lines) and _SETEXT.match(lines[number + 1])
              and not line.lstrip().startswith(("-", "*", "+", ">"))):
            return line.strip()
    return None


def _from_name(path: Path) -> str:
    return re.sub(r"[-_]+", " ", path.stem).strip() or path.name


def _moment(value: Any) -> datetime:
    """A front matter date or time (YAML reads most of them itself) as an aware UTC datetime."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"front matter 'updated_at' is not an ISO 8601 date or time: {value!r}") from None
    else:
        raise ValueError(f"front matter 'updated_at' must be a date or time, got {value!r}")
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC).replace(microsecond=0)
