"""The thin ``PolicyService`` servicer: which policy revision is in force and how the last reload went."""

from __future__ import annotations

from typing import Any

import grpc

from sidecar.api import convert
from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.server.interceptors import current_principal
from sidecar.server.roles import PolicyStatusView

__all__ = ["RELOAD_HEALTH_NAME", "SERVICE_NAME", "PolicyServicer"]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["PolicyService"].full_name
# Health of this name: SERVING while the policy source's latest content is in force,
# NOT_SERVING while a change is refused (the previous revision still serves every call).
RELOAD_HEALTH_NAME = "toolbooth.policy"


class PolicyServicer(pb_grpc.PolicyServiceServicer):
    """Answers ``GetPolicyStatus`` for any authenticated caller, as a ``PolicyStatusView`` shows it to them."""

    def __init__(self, view: PolicyStatusView) -> None:
        self._view = view

    async def GetPolicyStatus(self, request: pb.GetPolicyStatusRequest,
                              context: grpc.aio.ServicerContext[Any, Any]) -> pb.PolicyStatus:
        return convert.status_to_pb(self._view.status_for(current_principal()))
