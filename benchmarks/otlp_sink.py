#!/usr/bin/env python
"""A collector that keeps nothing: accepts OTLP/gRPC trace exports, counts their spans, discards them.

    python benchmarks/otlp_sink.py ADDRESS COUNT_FILE

``bench_observability.py`` starts one per OTLP variant, in a child process, so that the sidecar exports
to a real OTLP/gRPC endpoint (as to a collector on the node) and the benchmark can check that the spans
arrived: after each export request, before answering it, the total number of spans received so far is
written to ``COUNT_FILE`` (replaced atomically; it first appears, as 0, once the sink listens). Needs the
``otlp`` extra (``opentelemetry-proto``).
SIGTERM or SIGINT stops it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as trace_grpc

__all__ = ["SpanSink"]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # the SDK's batches (512 spans by default) stay far below


class SpanSink(trace_grpc.TraceServiceServicer):
    """Counts the spans of every export request into ``count_file``."""

    def __init__(self, count_file: Path) -> None:
        self._count_file, self._spans = count_file, 0

    async def Export(self, request: trace_pb.ExportTraceServiceRequest,
                     context: grpc.aio.ServicerContext[trace_pb.ExportTraceServiceRequest,
                                                       trace_pb.ExportTraceServiceResponse],
                     ) -> trace_pb.ExportTraceServiceResponse:
        self._spans += sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)
        self.publish()
        return trace_pb.ExportTraceServiceResponse()

    def publish(self) -> None:
        """Write the count so far (first once listening: the file's existence says the sink is ready)."""
        partial = self._count_file.with_name(f"{self._count_file.name}.partial")
        partial.write_text(str(self._spans))
        os.replace(partial, self._count_file)


async def _serve(address: str, count_file: Path) -> None:
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    server, sink = grpc.aio.server(options=options), SpanSink(count_file)
    trace_grpc.add_TraceServiceServicer_to_server(sink, server)  # type: ignore[no-untyped-call]  # untyped stubs
    server.add_insecure_port(address)
    await server.start()
    sink.publish()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    await stop.wait()
    await server.stop(1.0)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    asyncio.run(_serve(argv[0], Path(argv[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
