"""The health-only listener (``server.health_listen``): ``grpc.health.v1.Health`` and nothing else, for probes.

A kubelet's gRPC probe connects to the pod's IP, in plaintext, without a token. This second server
answers it from the same health servicer as the main listeners (so it says what they say: NOT_SERVING
until the sidecar is up, again from the start of a shutdown) but serves no Toolbooth service and no
reflection: a caller that reaches it can learn whether the sidecar is healthy, nothing more. That is why
it may listen beyond loopback in dev mode, where ``server.listen`` may not.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from sidecar.server.listeners import bind_all

__all__ = ["open_probes"]


async def open_probes(address: str, servicer: health.aio.HealthServicer, *,
                      reuse_port: bool = False) -> tuple[grpc.aio.Server, tuple[str, ...]]:
    """A bound, not started server of ``servicer`` alone on the TCP ``address``, and its addresses as bound;
    with ``reuse_port`` (a worker process) sharing the port with the other workers."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", int(reuse_port))])
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    addresses, _ = await bind_all(server, [address], reuse_port=reuse_port)
    return server, addresses
