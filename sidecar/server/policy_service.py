"""The thin ``PolicyService`` servicer: which policy revision is in force and how the last reload went."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import grpc

from sidecar.api import convert
from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.contract import Principal, ReloadStatus
from sidecar.server.interceptors import current_principal

__all__ = ["REFUSED_WITHOUT_DETAILS", "RELOAD_HEALTH_NAME", "SERVICE_NAME", "PolicyServicer", "StatusProvider"]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["PolicyService"].full_name
# Health of this name: SERVING while the policy source's latest content is in force,
# NOT_SERVING while a change is refused (the previous revision still serves every call).
RELOAD_HEALTH_NAME = "toolbooth.policy"
REFUSED_WITHOUT_DETAILS = "a policy change was refused; the reason is in the sidecar's log"


class StatusProvider(Protocol):
    """What the servicer needs: the reloading engine's status."""

    @property
    def status(self) -> ReloadStatus: ...


class PolicyServicer(pb_grpc.PolicyServiceServicer):
    """Answers ``GetPolicyStatus`` for any authenticated caller; why a change was refused (policy
    source excerpts, test names) only for operators."""

    def __init__(self, provider: StatusProvider, is_operator: Callable[[Principal], bool]) -> None:
        self._provider, self._is_operator = provider, is_operator

    async def GetPolicyStatus(self, request: pb.GetPolicyStatusRequest,
                              context: grpc.aio.ServicerContext[Any, Any]) -> pb.PolicyStatus:
        status = self._provider.status
        if status.last_error is not None and not self._is_operator(current_principal()):
            status = replace(status, last_error=REFUSED_WITHOUT_DETAILS)
        return convert.status_to_pb(status)
