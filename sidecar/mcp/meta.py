"""A ``tools/call`` as a ``CallRequest``: the arguments as JSON, the call's own fields from the request's ``_meta``.

MCP has no field for what Toolbooth asks of a call besides its tool and arguments, so they travel in
the request's ``_meta`` under these keys (``META_KEYS``), each a string:

==================================  ===========================================================
``toolbooth/idempotency_key``       required by tools with side effects; scoped to (principal, tool)
``toolbooth/approval_id``           the ``preview_id`` of an approved preview: runs exactly that call
``toolbooth/call_id``               the model's own id for this call, echoed in the audit log
``toolbooth/conversation_id``       the conversation, for the policies (also read by ``tools/list``)
==================================  ===========================================================

A value that is not a string breaks the request (``InvalidRequestError``, as a field of the wrong
type would over gRPC); everything else about the values (a missing key, its size, its characters) is
checked by the pipeline, exactly as for ``ExecuteTool``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from sidecar.api.schemas import META_PREFIX
from sidecar.contract import CallRequest
from sidecar.errors import InvalidRequestError

__all__ = ["META_KEYS", "call_request", "conversation_id"]

META_KEYS = MappingProxyType({name: f"{META_PREFIX}{name}"
                              for name in ("idempotency_key", "approval_id", "call_id", "conversation_id")})


def call_request(tool: str, arguments: Mapping[str, Any] | None, meta: Mapping[str, Any] | None) -> CallRequest:
    """The call ``tools/call`` asks for; ``InvalidRequestError`` for a ``_meta`` value that is not a string or
    arguments too deeply nested to write as JSON."""
    fields = {name: _string(meta, key) for name, key in META_KEYS.items()}
    return CallRequest(tool=tool, arguments_json=_arguments_json(arguments), **fields)


def conversation_id(meta: Mapping[str, Any] | None) -> str | None:
    """The conversation a request's ``_meta`` names, if any."""
    return _string(meta, META_KEYS["conversation_id"])


def _string(meta: Mapping[str, Any] | None, key: str) -> str | None:
    value = None if meta is None else meta.get(key)
    if value is None or isinstance(value, str):
        return value or None
    raise InvalidRequestError(f"_meta {key} must be a string")


def _arguments_json(arguments: Mapping[str, Any] | None) -> str:
    """The arguments as the JSON text the pipeline validates (sizes, depth, canonical form, the input model)."""
    try:
        return json.dumps(dict(arguments or {}), ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        raise InvalidRequestError("arguments are nested too deeply") from None
