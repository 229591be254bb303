"""Masking sensitive argument values before they are recorded (audit log), never before they are used.

A tool marks a field sensitive by its type, ``SecretStr`` or ``SecretBytes``, or by its metadata,
``Field(json_schema_extra={"sensitive": True})`` (``SENSITIVE``); the policy may list more JSON
pointers per tool in ``data.toolbooth.audit.mask``. ``reveal`` turns validated arguments into
JSON data with the real values (for policies, hashes and previews: pydantic would dump secrets as
``**********``) and the pointers of their sensitive values; ``Masker.mask`` replaces the values at
those pointers by ``hmac-sha256:<hex>``, a keyed hash of their canonical JSON, so equal values mask
equally under one key and a reader without the key learns nothing from them.
"""

from __future__ import annotations

import collections.abc
import copy
import datetime as dt
import decimal
import enum
import functools
import hashlib
import hmac
import types
import typing
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, SecretBytes, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from sidecar.canonical import canonical_json

__all__ = ["MASK_PREFIX", "SENSITIVE", "Masker", "Revealed", "reveal"]

SENSITIVE = {"sensitive": True}  # ``Field(json_schema_extra=SENSITIVE)`` marks a field sensitive
MASK_PREFIX = "hmac-sha256:"


@dataclass(frozen=True, slots=True)
class Revealed:
    """Arguments as JSON data with real values, and the JSON pointers of the sensitive ones."""

    data: dict[str, Any]
    sensitive: frozenset[str]


def reveal(args: BaseModel) -> Revealed:
    """``args`` dumped as JSON data, secrets included in clear, with the pointers of sensitive values."""
    data = args.model_dump(mode="json")
    if _plain(type(args)):  # nothing of that model can be sensitive: no walk
        return Revealed(data, frozenset())
    secrets: list[tuple[str, Any]] = []
    marked: list[str] = []
    _walk(args, "", secrets, marked)
    for pointer, value in secrets:
        _replace(data, pointer, lambda _old, value=value: value)
    return Revealed(data, frozenset([*marked, *(pointer for pointer, _ in secrets)]))


class Masker:
    """Masks values at JSON pointers with HMAC-SHA256 under one key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def mask_value(self, value: Any) -> str:
        """``hmac-sha256:`` and the hex HMAC of ``value``'s canonical JSON."""
        digest = hmac.new(self._key, canonical_json(value).encode(), hashlib.sha256).hexdigest()
        return MASK_PREFIX + digest

    def mask(self, data: Any, pointers: Iterable[str]) -> Any:
        """A copy of ``data`` with the value at each pointer masked; pointers to nothing are ignored."""
        masked = copy.deepcopy(data)
        for pointer in sorted(set(pointers), key=len, reverse=True):  # inner values before their containers
            if pointer == "":
                return self.mask_value(masked)
            _replace(masked, pointer, self.mask_value)
        return masked


def _walk(value: Any, pointer: str, secrets: list[tuple[str, Any]], marked: list[str]) -> None:
    """Collect the secrets (pointer, real value) and the marked fields' pointers under ``value``."""
    if isinstance(value, SecretStr | SecretBytes):
        secrets.append((pointer, to_jsonable_python(value.get_secret_value())))
    elif isinstance(value, BaseModel):
        for name, info in type(value).model_fields.items():
            child = f"{pointer}/{_escape(name)}"
            if _is_marked(info):
                marked.append(child)
            _walk(getattr(value, name), child, secrets, marked)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _walk(item, f"{pointer}/{index}", secrets, marked)
    elif isinstance(value, dict):
        for key, item in value.items():
            _walk(item, f"{pointer}/{_escape(str(key))}", secrets, marked)


_PLAIN_TYPES = (str, int, float, bool, bytes, type(None), enum.Enum, decimal.Decimal, uuid.UUID, dt.date, dt.time,
                dt.timedelta)


@functools.cache
def _plain(model: type[BaseModel]) -> bool:
    """Whether no instance of ``model`` can hold a secret or a marked field, judged by its fields' types: plain
    values (``_PLAIN_TYPES``), models that are plain themselves, and lists, tuples, sets, dicts, unions,
    ``Literal`` and ``Annotated`` of those. Anything else (``Any``, a type it does not know) is not plain:
    its values are walked."""
    return _plain_model(model, set())


def _plain_model(model: type[BaseModel], seen: set[type[BaseModel]]) -> bool:
    if model in seen:  # a model inside itself: judged by its other fields
        return True
    seen.add(model)
    return all(not _is_marked(info) and _plain_type(info.annotation, seen) for info in model.model_fields.values())


def _plain_type(annotation: Any, seen: set[type[BaseModel]]) -> bool:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return True
    if origin is typing.Annotated:
        return _plain_type(typing.get_args(annotation)[0], seen)
    if origin in (list, tuple, set, frozenset, dict, typing.Union, types.UnionType, collections.abc.Sequence,
                  collections.abc.Mapping):
        return all(arg is Ellipsis or _plain_type(arg, seen) for arg in typing.get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _plain_model(annotation, seen)
    return isinstance(annotation, type) and issubclass(annotation, _PLAIN_TYPES) and not issubclass(
        annotation, SecretStr | SecretBytes)


def _is_marked(info: FieldInfo) -> bool:
    extra = info.json_schema_extra
    return isinstance(extra, dict) and extra.get("sensitive") is True


def _replace(data: Any, pointer: str, new: Any) -> None:
    """Set the value at ``pointer`` (RFC 6901, not ``""``) in ``data`` to ``new(old value)``, if it exists."""
    *path, last = [_unescape(token) for token in pointer.split("/")[1:]]
    parent = data
    for token in path:
        parent = _child(parent, token)
        if parent is None:
            return
    if isinstance(parent, dict) and last in parent:
        parent[last] = new(parent[last])
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        parent[int(last)] = new(parent[int(last)])


def _child(parent: Any, token: str) -> Any:
    if isinstance(parent, dict):
        return parent.get(token)
    if isinstance(parent, list) and token.isdigit() and int(token) < len(parent):
        return parent[int(token)]
    return None


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")
