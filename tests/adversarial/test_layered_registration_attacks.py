"""Attacks on the services as ``Layered.add`` registers them (no ``grpc.aio.ServerInterceptor``): every method of
every ``toolbooth.v1`` service, taken from the proto descriptor, on a real server with JWT auth, metrics and the
access log on.

A call without valid credentials is UNAUTHENTICATED and never reaches a gateway, whether it comes through a stub
or a raw channel calling the method by its full name; request bytes that do not decode are INVALID_ARGUMENT before
authentication; an unknown method is UNIMPLEMENTED; health and reflection need no token and are neither counted
nor logged as Toolbooth calls; a servicer's exception still ends with its status; every Toolbooth call is counted
and logged. The same holds with ``server.workers: 2`` (both workers reached, each counting on its own endpoint).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor as _descriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.client import AsyncClient, ClientError
from sidecar.config import Settings
from sidecar.errors import StoreUnavailableError
from sidecar.metrics import Metrics
from sidecar.server import Sidecar, create_server
from sidecar.server.interceptors.access import ACCESS_LOGGER
from sidecar.server.interceptors.unary import UNDECODABLE_DETAILS
from tests.integration.test_interceptors import CALLS, Fakes
from tests.integration.test_metrics import scrape, value
from tests.integration.test_workers import Workers
from tests.support.sidecar_process import appended
from tests.support.waiting import until

pytestmark = pytest.mark.integration

# Every method of every Toolbooth service, from the descriptor: (full path, its descriptor).
METHODS = [(f"/{service.full_name}/{method.name}", method)
           for service in pb.DESCRIPTOR.services_by_name.values() for method in service.methods]
SERVICES = sorted(service.full_name for service in pb.DESCRIPTOR.services_by_name.values())
IDS = [path for path, _ in METHODS]
# A length-delimited field 1 that claims 5 bytes and has 2: no message of any method decodes it.
UNDECODABLE = b"\x0a\x05ab"
UNKNOWN_METHODS = ["/toolbooth.v1.ToolService/NoSuchMethod", "/toolbooth.v1.NoSuchService/ExecuteTool",
                   "/toolbooth.v1.toolservice/executetool", "/toolbooth.v1.ToolService/ExecuteTool/extra",
                   "/toolbooth.v1.ToolService/", "/toolbooth.v1.ToolService//ExecuteTool",
                   "/grpc.health.v1.Health/ExecuteTool", "/toolbooth.v2.ToolService/ExecuteTool"]
STATUS_LABELS = {grpc.StatusCode.OK: "OK", grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated",
                 grpc.StatusCode.INVALID_ARGUMENT: "InvalidArgument", grpc.StatusCode.UNAVAILABLE: "Unavailable",
                 grpc.StatusCode.INTERNAL: "Internal"}


def bad_credentials(make_token: Callable[..., str]) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """Calls' metadata that must not authenticate, by name."""
    return [
        ("no metadata", ()),
        ("no token", (("authorization", "Bearer "),)),
        ("not a jwt", (("authorization", "Bearer not-a-jwt"),)),
        ("another scheme", (("authorization", f"Basic {make_token()}"),)),
        ("expired", (("authorization", f"Bearer {make_token(exp=1)}"),)),
        ("wrong audience", (("authorization", f"Bearer {make_token(aud='someone-else')}"),)),
        ("two tokens", (("authorization", f"Bearer {make_token()}"), ("authorization", f"Bearer {make_token()}"))),
    ]


def message_class(method: _descriptor.MethodDescriptor, side: str = "input") -> Any:
    return GetMessageClass(method.input_type if side == "input" else method.output_type)


async def raw_call(channel: grpc.aio.Channel, path: str, request: bytes, *, streaming: bool = False,
                   metadata: tuple[tuple[str, str], ...] = ()) -> list[bytes]:
    """Call ``path`` by its full name with ``request`` as bytes; every reply's bytes."""
    if streaming:
        stream = channel.unary_stream(path, request_serializer=None, response_deserializer=None)
        return [reply async for reply in stream(request, metadata=metadata, timeout=10)]
    unary = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
    return [await unary(request, metadata=metadata, timeout=10)]


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


class Watched(Fakes):
    """``Fakes`` that also count the reads of the policy status (what ``GetPolicyStatus`` serves)."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__(error)
        self.status_reads = 0

    @property
    def status(self) -> Any:
        self.status_reads += 1
        return Fakes.status.fget(self)  # type: ignore[attr-defined]


@dataclass
class Served:
    address: str
    fakes: Watched
    metrics: Metrics
    log: pytest.LogCaptureFixture

    def reached(self) -> bool:
        """Whether any servicer got to its gateway since the server started."""
        return bool(self.fakes.principals) or self.fakes.status_reads > 0

    def started(self, path: str) -> float:
        return self._sample("grpc_server_started_total", path)

    def handled(self, path: str, code: grpc.StatusCode) -> float:
        return self._sample("grpc_server_handled_total", path, grpc_code=STATUS_LABELS[code])

    def _sample(self, name: str, path: str, **more: str) -> float:
        service, method = path.lstrip("/").split("/")
        labels = {"grpc_service": service, "grpc_method": method, **more}
        return sum(self.metrics.registry.get_sample_value(name, {"grpc_type": kind, **labels}) or 0.0
                   for kind in ("unary", "server_stream"))

    def services_counted(self) -> set[str]:
        return {sample.labels["grpc_service"] for family in self.metrics.registry.collect()
                for sample in family.samples if sample.name == "grpc_server_started_total"}

    def access_lines(self) -> list[str]:
        return [record.getMessage() for record in self.log.records if record.name == ACCESS_LOGGER]

    def logged(self, path: str, code: grpc.StatusCode | None = None) -> int:
        """The access lines of ``path`` (ending with ``code``, if given)."""
        start = f"{path} {code.name} " if code is not None else f"{path} "
        return sum(line.startswith(start) for line in self.access_lines())

    async def settled(self, path: str, code: grpc.StatusCode, count: int) -> None:
        """Wait until ``count`` calls of ``path`` ended with ``code`` are counted and logged (both layers finish
        after the caller got the status), then check that no more are."""
        await until(lambda: self.handled(path, code) >= count and self.logged(path, code) >= count,
                    what=f"{count} calls of {path} ending {code.name} counted and logged")
        assert (self.handled(path, code), self.logged(path, code)) == (count, count)

    async def nothing_else_seen(self) -> None:
        """Check that no Toolbooth call was counted or logged before now: one unauthenticated call of a known
        method, waited for, is the only one the metrics and the access log have."""
        path = "/toolbooth.v1.ToolService/ListTools"
        async with grpc.aio.insecure_channel(self.address) as channel:
            await refused(raw_call(channel, path, b""))
        await self.settled(path, grpc.StatusCode.UNAUTHENTICATED, 1)
        assert self.services_counted() == {"toolbooth.v1.ToolService"}
        assert len(self.access_lines()) == 1, self.access_lines()


@pytest.fixture
async def served(make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
                 caplog: pytest.LogCaptureFixture) -> AsyncIterator[Callable[..., Any]]:
    """``await served(fakes)``: a started server, JWT auth, reflection on, metrics and the access log on, every
    service backed by ``fakes`` (a fresh ``Watched`` by default)."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)  # the access log layer is only added when it writes
    started: list[Sidecar] = []

    async def start(fakes: Watched | None = None) -> Served:
        fakes = fakes or Watched()
        settings = make_settings(auth=jwt_auth, server={"reflection": True}, logging={"access": True})
        metrics = Metrics()
        _, sidecar = await create_server(settings, fakes, policy=fakes, approvals=fakes, metrics=metrics)
        started.append(sidecar)
        await sidecar.start()
        fakes.status_reads = 0
        return Served(sidecar.addresses[-1], fakes, metrics, caplog)

    yield start
    for sidecar in started:
        await sidecar.stop(None)


def test_the_descriptor_lists_the_services_the_server_is_built_with() -> None:
    assert SERVICES and all(service.startswith("toolbooth.v1.") for service in SERVICES)
    assert any(method.server_streaming for _, method in METHODS)
    for _, method in METHODS:  # the bytes the undecodable tests send are no message of any method
        with pytest.raises(DecodeError):
            message_class(method)().ParseFromString(UNDECODABLE)


@pytest.mark.parametrize(("path", "method"), METHODS, ids=IDS)
async def test_every_method_refuses_bad_credentials_before_its_servicer(
        served: Callable[..., Any], make_token: Callable[..., str], path: str,
        method: _descriptor.MethodDescriptor) -> None:
    server: Served = await served()
    request = message_class(method)().SerializeToString()  # well-formed (empty): only authentication refuses it
    credentials = bad_credentials(make_token)
    async with grpc.aio.insecure_channel(server.address) as channel:
        for name, metadata in credentials:
            error = await refused(raw_call(channel, path, request, streaming=method.server_streaming,
                                           metadata=metadata))
            assert error.code() is grpc.StatusCode.UNAUTHENTICATED, (name, error)
    assert not server.reached()
    await server.settled(path, grpc.StatusCode.UNAUTHENTICATED, len(credentials))  # counted and logged, each
    assert server.started(path) == len(credentials)


@pytest.mark.parametrize(("path", "method"), METHODS, ids=IDS)
async def test_undecodable_bytes_are_an_invalid_argument_before_authentication(
        served: Callable[..., Any], make_token: Callable[..., str], path: str,
        method: _descriptor.MethodDescriptor) -> None:
    server: Served = await served()
    async with grpc.aio.insecure_channel(server.address) as channel:
        for metadata in ((), (("authorization", f"Bearer {make_token()}"),)):  # without a token, and with one
            error = await refused(raw_call(channel, path, UNDECODABLE, streaming=method.server_streaming,
                                           metadata=metadata))
            assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, UNDECODABLE_DETAILS)
    assert not server.reached()
    await server.settled(path, grpc.StatusCode.INVALID_ARGUMENT, 2)


@pytest.mark.parametrize("path", UNKNOWN_METHODS)
async def test_an_unknown_method_is_unimplemented_with_or_without_a_token(
        served: Callable[..., Any], make_token: Callable[..., str], path: str) -> None:
    server: Served = await served()
    async with grpc.aio.insecure_channel(server.address) as channel:
        for metadata in ((), (("authorization", f"Bearer {make_token()}"),)):
            for streaming in (False, True):
                error = await refused(raw_call(channel, path, b"", streaming=streaming, metadata=metadata))
                assert error.code() is grpc.StatusCode.UNIMPLEMENTED, (metadata, streaming, error)
    assert not server.reached()
    await server.nothing_else_seen()


async def test_the_raw_full_name_path_needs_a_token_and_serves_with_one(
        served: Callable[..., Any], make_token: Callable[..., str]) -> None:
    server: Served = await served()
    path = "/toolbooth.v1.ToolService/ExecuteTool"
    request = pb.ExecuteToolRequest(tool="echo", arguments_json=json.dumps({"text": "hi"})).SerializeToString()
    async with grpc.aio.insecure_channel(server.address) as channel:
        unary = channel.unary_unary(path)  # no serializers at all: bytes in, bytes out
        error = await refused(unary(request, timeout=10))
        assert (error.code(), error.details()) == (grpc.StatusCode.UNAUTHENTICATED, "missing bearer token")
        assert not server.reached()
        reply = await unary(request, metadata=(("authorization", f"Bearer {make_token(sub='raw-caller')}"),),
                            timeout=10)
    assert pb.ToolResult.FromString(reply).meta.tool == "echo"
    assert [principal.id for principal in server.fakes.principals] == ["raw-caller"]
    await server.settled(path, grpc.StatusCode.UNAUTHENTICATED, 1)
    await server.settled(path, grpc.StatusCode.OK, 1)


@pytest.mark.parametrize(("path", "method"), METHODS, ids=IDS)
async def test_every_method_serves_a_valid_token(served: Callable[..., Any], make_token: Callable[..., str],
                                                 path: str, method: _descriptor.MethodDescriptor) -> None:
    server: Served = await served()
    async with grpc.aio.insecure_channel(server.address) as channel:
        try:
            replies = await raw_call(channel, path, message_class(method)().SerializeToString(),
                                     streaming=method.server_streaming,
                                     metadata=(("authorization", f"Bearer {make_token()}"),))
        except grpc.aio.AioRpcError as exc:  # an empty request the servicer refuses: past authentication
            assert exc.code() is grpc.StatusCode.INVALID_ARGUMENT, exc
            replies = []
    for reply in replies:
        message_class(method, "output")().ParseFromString(reply)
    await until(lambda: server.logged(path) == 1, what="the call's access line")
    assert server.started(path) == 1 and len(server.access_lines()) == 1


async def test_health_and_reflection_need_no_token_and_are_not_toolbooth_calls(
        served: Callable[..., Any]) -> None:
    server: Served = await served()
    async with grpc.aio.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "toolbooth.v1.ToolService"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = reflection.ServerReflectionInfo(timeout=10)
        await answers.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        listed = {service.name for service in (await answers.read()).list_services_response.service}
        await answers.write(reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICES[0]))
        described = (await answers.read()).file_descriptor_response.file_descriptor_proto
        await answers.done_writing()
    assert {name for name in listed if name.startswith("toolbooth.")} == set(SERVICES)
    assert described
    await server.nothing_else_seen()  # neither health nor reflection is metered or logged as a Toolbooth call


@pytest.mark.parametrize(("error", "code", "details"), [
    (StoreUnavailableError("disk at /secret is full"), grpc.StatusCode.UNAVAILABLE, "service unavailable"),
    (KeyError("password=hunter2"), grpc.StatusCode.INTERNAL, "internal error"),
], ids=["unavailable", "bug"])
@pytest.mark.parametrize(("name", "call"), CALLS, ids=[name for name, _ in CALLS])
async def test_a_servicers_exception_still_ends_with_its_status_and_is_counted(
        served: Callable[..., Any], make_token: Callable[..., str], error: Exception, code: grpc.StatusCode,
        details: str, name: str, call: Callable[[AsyncClient], Any]) -> None:
    server: Served = await served(Watched(error))
    async with AsyncClient(server.address, token=make_token(sub="approver-7"), timeout=10) as client:
        with pytest.raises(ClientError) as caught:
            await call(client)
    assert (caught.value.code, caught.value.details) == (code, details)
    assert [principal.id for principal in server.fakes.principals] == ["approver-7"]  # reached, authenticated
    [path] = [path for path, _ in METHODS if path.endswith(f"/{name}")]
    await server.settled(path, code, 1)


async def test_the_stream_is_refused_before_its_first_reply_and_fails_after_it(
        served: Callable[..., Any], make_token: Callable[..., str]) -> None:
    path = "/toolbooth.v1.ToolService/ExecuteToolStream"
    request = pb.ExecuteToolRequest(tool="echo", arguments_json="{}").SerializeToString()
    server: Served = await served(Watched(StoreUnavailableError("down")))
    async with grpc.aio.insecure_channel(server.address) as channel:
        stream = channel.unary_stream(path)
        received: list[bytes] = []
        error = await refused(_collect(stream(request, timeout=10), received))
        assert error.code() is grpc.StatusCode.UNAUTHENTICATED and received == []  # nothing sent before auth
        error = await refused(_collect(stream(request, metadata=(("authorization", f"Bearer {make_token()}"),),
                                              timeout=10), received))
    assert (error.code(), error.details()) == (grpc.StatusCode.UNAVAILABLE, "service unavailable")
    assert len(received) == 1  # the progress event the gateway sent before it failed
    await server.settled(path, grpc.StatusCode.UNAUTHENTICATED, 1)
    await server.settled(path, grpc.StatusCode.UNAVAILABLE, 1)


async def test_concurrent_callers_each_reach_their_servicer_as_themselves(
        served: Callable[..., Any], make_token: Callable[..., str]) -> None:
    server: Served = await served()
    path = "/toolbooth.v1.ToolService/ExecuteTool"
    request = pb.ExecuteToolRequest(tool="echo", arguments_json="{}").SerializeToString()
    callers = [f"caller-{n}" for n in range(24)]
    async with grpc.aio.insecure_channel(server.address) as channel:
        unary = channel.unary_unary(path)
        with_tokens = [unary(request, metadata=(("authorization", f"Bearer {make_token(sub=sub)}"),), timeout=10)
                       for sub in callers]
        without = [unary(request, metadata=(("authorization", "Bearer x"),), timeout=10) for _ in callers]
        outcomes = await asyncio.gather(*(call for pair in zip(with_tokens, without, strict=True) for call in pair),
                                        return_exceptions=True)
    served_ok = [outcome for outcome in outcomes if isinstance(outcome, bytes)]
    refusals = [outcome for outcome in outcomes if isinstance(outcome, grpc.aio.AioRpcError)]
    assert len(served_ok) == len(refusals) == len(callers)
    assert {refusal.code() for refusal in refusals} == {grpc.StatusCode.UNAUTHENTICATED}
    assert sorted(principal.id for principal in server.fakes.principals) == sorted(callers)  # each once, as itself
    await server.settled(path, grpc.StatusCode.OK, len(callers))
    await server.settled(path, grpc.StatusCode.UNAUTHENTICATED, len(callers))


async def _collect(stream: Any, into: list[bytes]) -> None:
    async for reply in stream:
        into.append(reply)


# --- server.workers: 2, a real ``toolbooth serve`` ---------------------------------------------------------------

_METRICS_URL = re.compile(r"\[worker (\d)\]: metrics \(Prometheus\) on (http://127\.0\.0\.1:\d+/metrics)")


@pytest.fixture
def workers(tmp_path: Path, jwt_auth: dict[str, Any]) -> Iterator[Workers]:
    """``toolbooth serve`` with two workers, JWT auth, metrics (a port per worker) and reflection."""
    with Workers.serving(tmp_path, {
        "server": {"listen": ["127.0.0.1:0"], "workers": 2, "shutdown_grace_seconds": 5, "reflection": True},
        "auth": jwt_auth,
        "metrics": {"listen": "127.0.0.1:0"},
        "plugins": {"allow": ["append"]},
        "policy": {"reload_interval_seconds": 0},
        "store": {"sqlite_path": str(tmp_path / "state" / "toolbooth.db")},
    }) as running:
        yield running


@pytest.mark.slow
async def test_two_workers_refuse_every_method_without_a_token_and_count_it(
        workers: Workers, make_token: Callable[..., str]) -> None:
    await until(lambda: len(set(_METRICS_URL.findall(workers.output()))) == 2, what="both workers' metrics URLs")
    urls = dict(_METRICS_URL.findall(workers.output()))
    token = (("authorization", f"Bearer {make_token()}"),)
    connections = 16
    for _ in range(connections):  # a connection each: the kernel picks the worker
        async with grpc.aio.insecure_channel(workers.target,
                                             options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            for path, method in METHODS:
                request = message_class(method)().SerializeToString()
                error = await refused(raw_call(channel, path, request, streaming=method.server_streaming))
                assert error.code() is grpc.StatusCode.UNAUTHENTICATED, (path, error)
                error = await refused(raw_call(channel, path, UNDECODABLE, streaming=method.server_streaming,
                                               metadata=token))
                assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, (path, error)
            error = await refused(raw_call(channel, UNKNOWN_METHODS[0], b"", metadata=token))
            assert error.code() is grpc.StatusCode.UNIMPLEMENTED
            [listing] = await raw_call(channel, "/toolbooth.v1.ToolService/ListTools", b"", metadata=token)
            assert "append_line" in {tool.name for tool in pb.ListToolsResponse.FromString(listing).tools}
    assert appended(workers.executions) == []

    def labels(path: str, method: _descriptor.MethodDescriptor) -> dict[str, str]:
        service, name = path.lstrip("/").split("/")
        return {"grpc_type": "server_stream" if method.server_streaming else "unary", "grpc_service": service,
                "grpc_method": name}

    scrapes: dict[str, dict[str, Any]] = {}

    async def all_counted() -> bool:  # the metrics layer counts a call after its caller got the status
        scrapes.update({index: await scrape(url) for index, url in urls.items()})
        return all(sum(value(samples, "grpc_server_handled_total", **labels(path, method), grpc_code=code)
                       for samples in scrapes.values() for code in ("Unauthenticated", "InvalidArgument"))
                   == 2 * connections for path, method in METHODS)

    await until(all_counted, what="every call counted by one worker or the other")
    per_worker = {index: sum(value(samples, "grpc_server_handled_total", grpc_type="unary",
                                   grpc_service="toolbooth.v1.ToolService", grpc_method="ExecuteTool",
                                   grpc_code=code) for code in ("Unauthenticated", "InvalidArgument"))
                  for index, samples in scrapes.items()}
    assert sum(per_worker.values()) == 2 * connections and all(per_worker.values()), per_worker  # both reached
    for path, method in METHODS:
        for code in ("Unauthenticated", "InvalidArgument"):
            assert sum(value(samples, "grpc_server_handled_total", **labels(path, method), grpc_code=code)
                       for samples in scrapes.values()) == connections, (path, code)
    for samples in scrapes.values():
        counted = {dict(labels)["grpc_service"] for labels in samples.get("grpc_server_started_total", {})}
        assert counted <= set(SERVICES), counted  # never health, never an unknown method
