"""``PolicyService``: which policy revision is in force and how the last reload went."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import grpc

from sidecar.api import convert
from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.contract import Principal, ReloadStatus
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


REFUSED_WITHOUT_DETAILS = "a policy change was refused; the reason is in the sidecar's log"


class PolicyServicer(pb_grpc.PolicyServiceServicer):
    """Answers ``GetPolicyStatus`` for any authenticated caller; why a change was refused (policy
    source excerpts, test names) only for operators."""

    def __init__(self, provider: StatusProvider, authenticator: Authenticator,
                 is_operator: Callable[[Principal], bool]) -> None:
        self._provider, self._authenticator, self._is_operator = provider, authenticator, is_operator

    async def GetPolicyStatus(self, request: pb.GetPolicyStatusRequest,
                              context: grpc.aio.ServicerContext) -> pb.PolicyStatus:
        principal = await authenticate(self._authenticator, context)
        status = self._provider.status
        if status.last_error is not None and not self._is_operator(principal):
            status = replace(status, last_error=REFUSED_WITHOUT_DETAILS)
        return convert.status_to_pb(status)
