"""The input document every policy decision sees (documented in ``docs/policies.md``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sidecar.contract import CallRequest, Principal
from sidecar.plugin import ToolDefinition
from sidecar.policy import Stage


def policy_input(
    principal: Principal,
    defn: ToolDefinition[Any, Any],
    stage: Stage,
    *,
    arguments: dict[str, Any] | None = None,
    request: CallRequest | None = None,
    conversation_id: str | None = None,
) -> dict[str, Any]:
    """Build the input for ``stage``; ``call`` is present once arguments are validated."""
    conversation = request.conversation_id if request is not None else conversation_id
    document: dict[str, Any] = {
        "principal": principal.model_dump(mode="json"),
        "tool": {
            "name": defn.name,
            "version": defn.version,
            "side_effect": defn.side_effect.value,
            "permissions": list(defn.permissions),
            "plugin": defn.plugin,
        },
        "context": {
            "stage": stage.value,
            "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "conversation_id": conversation,
        },
    }
    if arguments is not None and request is not None:
        document["call"] = {
            "arguments": arguments,
            "conversation_id": request.conversation_id,
            "idempotency_key": request.idempotency_key,
        }
    return document
