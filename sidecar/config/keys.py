"""The keys of a config file seen through the settings models: its relative paths, and the key a misspelt one
was meant to be.

``anchor_paths`` makes every relative path a config file gives (a field typed ``Path``: ``server.tls.key_file``,
``auth.jwt.key_file``, ``policy.path``, ``store.sqlite_path``, ...) relative to the file's directory, so the file
means the same from any working directory; paths from ``TOOLBOOTH_*`` variables stay relative to the working
directory, where the shell that set them is. ``path_note`` says, in an error about such a path, which base
was used. ``close_key`` finds the known key nearest an unknown one (``difflib``).
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from collections.abc import Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

__all__ = ["Anchored", "anchor_paths", "close_key", "path_note", "working_directory_note"]

# The key path of each relative path a config file gave, with the text it gave and the directory it was read
# against.
Anchored = Mapping[tuple[str, ...], tuple[str, Path]]

_PATH_ERRORS = frozenset({"path_not_file", "path_not_directory", "path_type"})


def anchor_paths(raw: MutableMapping[str, Any], model: type[BaseModel],
                 base: Path) -> dict[tuple[str, ...], tuple[str, Path]]:
    """Rewrite in ``raw`` (a config file's mapping for ``model``) every relative path as ``base / path``, ``..``
    taken off lexically (the directory the file was named in, even through a symbolic link), and a leading ``~``
    as the home directory (never a directory named ``~`` in ``base``); return what was read against ``base``."""
    anchored: dict[tuple[str, ...], tuple[str, Path]] = {}
    for loc, holder, key, value in _path_values(raw, model, ()):
        if not isinstance(value, str) or not value:
            continue
        home = os.path.expanduser(value) if value.startswith("~") else value  # ~/x, ~user/x: as a shell reads it
        if Path(home).is_absolute():
            holder[key] = home
        else:
            holder[key] = os.path.normpath(base / value)
            anchored[loc] = (value, base)
    return anchored


def _path_values(raw: MutableMapping[str, Any], model: type[BaseModel],
                 at: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], MutableMapping[str, Any], str, Any]]:
    """Each value of ``raw`` whose field in ``model`` is a path: its key path, the mapping holding it, its key."""
    for key, value in list(raw.items()):
        field = model.model_fields.get(key)
        if field is None:
            continue
        types_ = _types(field.annotation)
        if Path in types_:
            yield (*at, key), raw, key, value
        elif isinstance(value, MutableMapping):
            for child, keyed in _models(types_):
                entries = value.items() if keyed else [(None, value)]
                for name, entry in list(entries):
                    if isinstance(entry, MutableMapping):
                        where = (*at, key) if name is None else (*at, key, str(name))
                        yield from _path_values(entry, child, where)


def close_key(model: type[BaseModel], loc: tuple[str, ...]) -> str | None:
    """The known key nearest the unknown last key of ``loc`` in ``model``, if one is near enough."""
    names = _field_names(model, loc[:-1])
    matches = difflib.get_close_matches(loc[-1], names, n=1, cutoff=0.6) if loc else []
    return matches[0] if matches else None


def _field_names(model: type[BaseModel], loc: tuple[str, ...]) -> list[str]:
    """The keys of the section at ``loc`` (mapping keys, e.g. a bundle key's name, skipped); none if unknown."""
    current: type[BaseModel] | None = model
    parts = list(loc)
    while parts and current is not None:
        field = current.model_fields.get(parts.pop(0))
        children = _models(_types(field.annotation)) if field is not None else []
        current = children[0][0] if children else None
        if children and children[0][1] and parts:
            parts.pop(0)
    return list(current.model_fields) if current is not None else []


def path_note(error_type: str, value: Any, anchored: tuple[str, Path] | None) -> str:
    """For an error about a path: which base a relative one was read against (``""`` for other errors)."""
    if anchored is not None:
        given, base = anchored
        return f" ({given!r} is read against {base}, the directory of the config file)"
    if error_type in _PATH_ERRORS and isinstance(value, str | Path):
        return working_directory_note(Path(value)) or f" ({value})"
    return ""


def working_directory_note(path: Path) -> str:
    """For an error about ``path``: the working directory it was read against, when it is relative."""
    return "" if path.is_absolute() else f" ({str(path)!r} is read against the working directory {Path.cwd()})"


def _types(annotation: Any) -> list[Any]:
    """The types an annotation admits: ``Optional``, unions and ``Annotated`` unwrapped."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _types(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return [kind for arg in typing.get_args(annotation) for kind in _types(arg)]
    return [annotation]


def _models(kinds: list[Any]) -> list[tuple[type[BaseModel], bool]]:
    """The sections among ``kinds``: a model, or a mapping of names to a model (``True``: keyed)."""
    found: list[tuple[type[BaseModel], bool]] = []
    for kind in kinds:
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            found.append((kind, False))
        elif typing.get_origin(kind) is dict:
            value = typing.get_args(kind)[1]
            if isinstance(value, type) and issubclass(value, BaseModel):
                found.append((value, True))
    return found
