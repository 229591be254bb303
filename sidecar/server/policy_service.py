"""``PolicyService``: which policy revision is in force and how the last reload went."""

from __future__ import annotations

from typing import Protocol

import grpc

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.policy.reload import ReloadStatus
from sidecar.server import convert
from sidecar.server.auth import Authenticator
from sidecar.server.service import authenticate

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["PolicyService"].full_name
# Health of this name: SERVING while the policy source's latest content is in force,
# NOT_SERVING while a change is refused (the previous revision still serves every call).
RELOAD_HEALTH_NAME = "toolbooth.policy"


class StatusProvider(Protocol):
    """What the servicer needs: the reloading engine's status."""

    @property
    def status(self) -> ReloadStatus: ...


class PolicyServicer(pb_grpc.PolicyServiceServicer):
    """Answers ``GetPolicyStatus`` for any authenticated caller."""

    def __init__(self, provider: StatusProvider, authenticator: Authenticator) -> None:
        self._provider, self._authenticator = provider, authenticator

    async def GetPolicyStatus(self, request: pb.GetPolicyStatusRequest,
                              context: grpc.aio.ServicerContext) -> pb.PolicyStatus:
        await authenticate(self._authenticator, context)
        return convert.status_to_pb(self._provider.status)
