"""Stage 3, resolve + availability: the tool, if it exists and the availability policy shows it.

Availability is decided here at discovery too (``listing``), so a tool is checked by the same
code when it is listed and again when it is called.

Unknown tools and hidden ones get the same ``TOOL_UNAVAILABLE``. A well-formed unknown name is
decided too (on a stand-in tool, the answer ignored), so that a failing engine or its latency
tells a guessed name apart from a hidden one by nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging

from sidecar.contract import ErrorCode, ErrorInfo, Principal, ToolListing, ToolResult
from sidecar.errors import CallRefused, PolicyEvaluationError
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Next
from sidecar.pipeline.decisions import Decider
from sidecar.policy import Stage
from sidecar.policy.input import InputBatch, InputParts, now_utc, principal_json, tool_json
from sidecar.policy.reload import new_pin
from sidecar.tools.definition import NAME_PATTERN
from sidecar.tools.registry import Registry

__all__ = ["ResolveStage", "unavailable"]

log = logging.getLogger("toolbooth.pipeline")


class ResolveStage:
    """Sets ``call.tool`` and ``call.inputs``, or ends the call with ``TOOL_UNAVAILABLE``."""

    def __init__(self, registry: Registry, decider: Decider) -> None:
        self._registry, self._decider = registry, decider
        self._tool_json = {defn.name: tool_json(defn) for defn in registry}
        self._listed = tuple(self._tool_json.values())  # every tool's ``input.tool``, in the registry's order
        self._descriptors = tuple(registry.descriptor(defn.name) for defn in registry)
        self._listed_key = hashlib.sha256("\n".join(self._listed).encode()).hexdigest()

    async def run(self, call: Call, next: Next) -> ToolResult:
        name = call.request.tool
        defn = self._registry.get(name)
        if defn is None and not NAME_PATTERN.match(name):  # cannot name any tool, hidden or not
            raise CallRefused(unavailable(name[:64]))
        tool = self._tool_json[defn.name] if defn is not None else _stand_in(name)
        call.inputs = InputParts(principal_json(call.principal), tool, call.time, call.request.conversation_id)
        decision = await self._decider.decide(call, Stage.AVAILABILITY)
        if defn is None or not decision.allow:
            raise CallRefused(unavailable(name))
        call.tool = defn
        return await next(call)

    async def listing(self, principal: Principal, *, conversation_id: str | None = None) -> ToolListing:
        """The tools the availability policy shows ``principal``, decided in one pass."""
        inputs = InputBatch(Stage.AVAILABILITY, principal_json(principal), self._listed, now_utc(), conversation_id,
                            self._listed_key)
        pin = new_pin()  # the listing's revision and its decisions come from one policy set
        pin.deciding = True
        try:
            revision = self._decider.policy.revision
            decisions = await self._decider.policy.decide_many(Stage.AVAILABILITY, inputs)
        except PolicyEvaluationError as exc:
            log.error("availability policy failed during ListTools: %s", exc)
            raise
        finally:
            pin.deciding = False
        shown = tuple(d for d, decision in zip(self._descriptors, decisions, strict=True) if decision.allow)
        return ToolListing(tools=shown, policy_revision=revision)


def unavailable(name: str) -> ErrorInfo:
    """The one answer for a tool that does not exist or that the caller may not see."""
    return ErrorInfo.of(ErrorCode.TOOL_UNAVAILABLE, f"tool {name!r} is not available")


def _stand_in(name: str) -> str:
    return json.dumps({"name": name, "version": "", "side_effect": "none", "permissions": [], "plugin": ""})
