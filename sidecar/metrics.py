"""The sidecar's Prometheus metrics (``metrics.listen``): every family, in one ``CollectorRegistry`` per sidecar.

``Metrics`` owns the families; the parts that count take it from the composition root
(``sidecar.bootstrap``), and nothing counts when metrics are off (no ``Metrics`` is made, and no
counting part is put in place). The per-call paths use meters with their label children bound once
and cached (``rpc``, ``tool``, ``decision``), so a call costs a few increments and observations.

Every label value is bounded: methods and codes come from the proto and the enums, tools from the
registry (a call that never resolved to a tool, unknown or hidden, counts as ``UNKNOWN_TOOL``),
stages from ``sidecar.policy.Stage``. Names follow Go's grpc-prometheus for the gRPC families
(``grpc_code`` spelled as Go spells ``codes.Code``: ``OK``, ``InvalidArgument``, ``Canceled``...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from google.protobuf import descriptor_pool
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["NO_CODE", "UNKNOWN_TOOL", "DecisionMeter", "Metrics", "RpcMeter", "ToolMeter", "go_code"]

UNKNOWN_TOOL = "_unknown"  # the tool label of a call that never resolved to a registered tool it may see
NO_CODE = "none"  # the code label of a result without an error

# Sub-millisecond buckets: a cached decision or a validation error is answered in microseconds.
_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_CALL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_GO_NAMES = {grpc.StatusCode.OK: "OK", grpc.StatusCode.CANCELLED: "Canceled"}


def go_code(code: grpc.StatusCode) -> str:
    """``code`` as Go's ``codes.Code.String()`` spells it (``INVALID_ARGUMENT`` -> ``InvalidArgument``)."""
    return _GO_NAMES.get(code) or "".join(part.capitalize() for part in code.name.split("_"))


@dataclass(slots=True)
class RpcMeter:
    """The gRPC families of one method, its children bound."""

    started: Counter
    seconds: Histogram
    _handled: Callable[[str], Counter]
    _by_code: dict[grpc.StatusCode, Counter] = field(default_factory=dict)

    def handled(self, code: grpc.StatusCode, seconds: float) -> None:
        """One call of the method ended with ``code`` after ``seconds``."""
        counter = self._by_code.get(code)
        if counter is None:
            counter = self._by_code[code] = self._handled(go_code(code))
        counter.inc()
        self.seconds.observe(seconds)


@dataclass(slots=True)
class ToolMeter:
    """The call families of one tool (or of ``UNKNOWN_TOOL``), its children bound."""

    seconds: Histogram
    _calls: Callable[[str, str], Counter]
    _by_outcome: dict[tuple[str, str], Counter] = field(default_factory=dict)

    def ended(self, status: str, code: str, seconds: float) -> None:
        """One call ended with ``status`` and error ``code`` (``NO_CODE``) after ``seconds``."""
        counter = self._by_outcome.get((status, code))
        if counter is None:
            counter = self._by_outcome[status, code] = self._calls(status, code)
        counter.inc()
        self.seconds.observe(seconds)


@dataclass(frozen=True, slots=True)
class DecisionMeter:
    """The decision families of one policy stage: ``allow`` ``true``/``false``/``error``, and the seconds."""

    allowed: Counter
    denied: Counter
    failed: Counter
    seconds: Histogram


class Metrics:
    """Every family of one sidecar, registered in its own ``registry`` (never the process-wide default, so
    that two sidecars in one process keep apart)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry = registry or CollectorRegistry()
        rpc = ["grpc_type", "grpc_service", "grpc_method"]
        self._grpc_started = Counter("grpc_server_started", "RPCs started on the server.", rpc, registry=registry)
        self._grpc_handled = Counter("grpc_server_handled", "RPCs completed on the server, whatever their status.",
                                     [*rpc, "grpc_code"], registry=registry)
        self._grpc_seconds = Histogram("grpc_server_handling_seconds", "Time the server took to handle each RPC "
                                       "until it ended.", rpc, buckets=_CALL_BUCKETS, registry=registry)
        self._calls = Counter("toolbooth_tool_calls", "Tool calls, by tool, result status and error code.",
                              ["tool", "status", "code"], registry=registry)
        self._call_seconds = Histogram("toolbooth_tool_call_duration_seconds", "Time each tool call took through "
                                       "the pipeline, from arrival to result.", ["tool"], buckets=_CALL_BUCKETS,
                                       registry=registry)
        self._decisions = Counter("toolbooth_policy_decisions", "Policy decisions, by stage and answer (allow: "
                                  "true, false or error; for approval, true when none is required).",
                                  ["stage", "allow"], registry=registry)
        self._decision_seconds = Histogram("toolbooth_policy_decision_seconds", "Time each policy evaluation took "
                                           "(decision cache included).", ["stage"], buckets=_FAST_BUCKETS,
                                           registry=registry)
        self._reloads = Counter("toolbooth_policy_reloads", "Changed policy sets seen by hot reload, by result "
                                "(loaded, refused, or error: the source could not be read).", ["result"],
                                registry=registry)
        self._approvals = Counter("toolbooth_approvals", "Approvers' decisions on previews (approved, denied, or "
                                  "refused: not allowed, expired, wrong hash, ...).", ["decision"], registry=registry)
        self._store_errors = Counter("toolbooth_store_errors", "Store statements that failed, by statement.", ["op"],
                                     registry=registry)
        self.audit_queue_depth = Gauge("toolbooth_audit_queue_depth", "Audit events queued and not yet written.",
                                       registry=registry)
        self._rpcs: dict[str, RpcMeter] = {}
        self._tools: dict[str, ToolMeter] = {}
        self._stages: dict[str, DecisionMeter] = {}

    def rpc(self, method: str) -> RpcMeter:
        """The meter of the full gRPC ``method`` (``/package.Service/Method``)."""
        meter = self._rpcs.get(method)
        if meter is None:
            service, _, name = method.lstrip("/").partition("/")
            labels = (_rpc_type(service, name), service, name)
            meter = self._rpcs[method] = RpcMeter(
                self._grpc_started.labels(*labels), self._grpc_seconds.labels(*labels),
                lambda code: self._grpc_handled.labels(*labels, code))
        return meter

    def tool(self, name: str) -> ToolMeter:
        """The meter of the registered tool ``name`` (or ``UNKNOWN_TOOL``: never a name from a request)."""
        meter = self._tools.get(name)
        if meter is None:
            meter = self._tools[name] = ToolMeter(self._call_seconds.labels(name),
                                                  lambda status, code: self._calls.labels(name, status, code))
        return meter

    def decision(self, stage: str) -> DecisionMeter:
        """The meter of the policy ``stage`` (a ``sidecar.policy.Stage`` value)."""
        meter = self._stages.get(stage)
        if meter is None:
            meter = self._stages[stage] = DecisionMeter(
                self._decisions.labels(stage, "true"), self._decisions.labels(stage, "false"),
                self._decisions.labels(stage, "error"), self._decision_seconds.labels(stage))
        return meter

    def reloaded(self, result: str) -> None:
        """Hot reload saw a changed policy set: ``loaded``, ``refused`` or ``error``."""
        self._reloads.labels(result).inc()

    def approval(self, decision: str) -> None:
        """An approver's decision: ``approved``, ``denied`` or ``refused``."""
        self._approvals.labels(decision).inc()

    def store_error(self, op: str) -> None:
        """A store statement ``op`` (a ``StoreStatements`` name, or the kind of step) failed."""
        self._store_errors.labels(op).inc()


def _rpc_type(service: str, method: str) -> str:
    """grpc-prometheus's ``grpc_type`` of a method, from its proto descriptor."""
    try:
        described = descriptor_pool.Default().FindServiceByName(service).methods_by_name[method]
    except KeyError:
        return "unary"
    streams = (described.client_streaming, described.server_streaming)
    return {(False, False): "unary", (False, True): "server_stream", (True, False): "client_stream"}.get(
        streams, "bidi_stream")
