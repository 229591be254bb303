"""The sidecar's Prometheus metrics (``metrics.listen``): every family, in one ``CollectorRegistry`` per sidecar.

``Metrics`` owns the families; the parts that count take it from the composition root
(``sidecar.bootstrap``), and nothing counts when metrics are off (no ``Metrics`` is made, and no
counting part is put in place). The per-call paths use meters with their label children bound once
and cached (``rpc``, ``tool``, ``decision``), so a call costs a few additions.

The values are plain numbers kept by ``Metrics`` itself and handed to prometheus_client as metric
families at each scrape (a custom collector: the library still writes every exposition format).
Everything that counts runs on the sidecar's event loop, and so does a scrape (``sidecar.server.
metrics_http``), so no value is ever read while it changes: the per-value locks of the library's own
``Counter`` and ``Histogram`` would be pure cost, several microseconds per call.

Every label value is bounded: methods and codes come from the proto and the enums, tools from the
registry (a call that never resolved to a tool, unknown or hidden, counts as ``UNKNOWN_TOOL``),
stages from ``sidecar.policy.Stage``. Names follow Go's grpc-prometheus for the gRPC families
(``grpc_code`` spelled as Go spells ``codes.Code``: ``OK``, ``InvalidArgument``, ``Canceled``...).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING

import grpc
from google.protobuf import descriptor_pool

if TYPE_CHECKING:  # prometheus_client loads when a ``Metrics`` is made: with metrics on (``metrics.listen``)
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

__all__ = ["NO_CODE", "UNKNOWN_TOOL", "Count", "DecisionMeter", "Metrics", "Observed", "RpcMeter", "ToolMeter",
           "go_code"]

UNKNOWN_TOOL = "_unknown"  # the tool label of a call that never resolved to a registered tool it may see
NO_CODE = "none"  # the code label of a result without an error

# Sub-millisecond buckets: a cached decision or a validation error is answered in microseconds.
_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_CALL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_GO_NAMES = {grpc.StatusCode.OK: "OK", grpc.StatusCode.CANCELLED: "Canceled"}


def go_code(code: grpc.StatusCode) -> str:
    """``code`` as Go's ``codes.Code.String()`` spells it (``INVALID_ARGUMENT`` -> ``InvalidArgument``)."""
    return _GO_NAMES.get(code) or "".join(part.capitalize() for part in code.name.split("_"))


class Count:
    """One counter child: a number that only goes up."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Observed:
    """One histogram child: how many observations fell in each bucket (not cumulative), and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds, self.counts, self.sum = bounds, [0] * (len(bounds) + 1), 0.0  # the last: above every bound

    def observe(self, amount: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, amount)] += 1  # the first bucket whose bound is >= amount
        self.sum += amount


class _Family:
    """A counter or histogram family: its children by label values, made on first use."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str], *,
                 buckets: Sequence[float] | None = None) -> None:
        self.name, self.documentation, self.labels, self.buckets = name, documentation, tuple(labels), buckets
        self.children: dict[tuple[str, ...], Count | Observed] = {}

    def count(self, *values: str) -> Count:
        child = self.children.setdefault(values, Count())
        assert isinstance(child, Count)
        return child

    def observed(self, *values: str) -> Observed:
        assert self.buckets is not None
        child = self.children.setdefault(values, Observed(self.buckets))
        assert isinstance(child, Observed)
        return child

    def collect(self) -> Metric:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        if self.buckets is None:
            counters = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
            for values, child in self.children.items():
                counters.add_metric(values, child.value)  # type: ignore[union-attr]
            return counters
        histograms = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        bounds = [*(repr(float(bound)) for bound in self.buckets), "+Inf"]  # as the library spells these bounds
        for values, child in self.children.items():
            assert isinstance(child, Observed)
            histograms.add_metric(values, list(zip(bounds, accumulate(child.counts), strict=True)), child.sum)
        return histograms


@dataclass(slots=True)
class RpcMeter:
    """The gRPC families of one method, its children bound."""

    started: Count
    seconds: Observed
    _handled: Callable[[str], Count]
    _by_code: dict[grpc.StatusCode, Count] = field(default_factory=dict)

    def handled(self, code: grpc.StatusCode, seconds: float) -> None:
        """One call of the method ended with ``code`` after ``seconds``."""
        counter = self._by_code.get(code)
        if counter is None:
            counter = self._by_code[code] = self._handled(go_code(code))
        counter.value += 1
        self.seconds.observe(seconds)


@dataclass(slots=True)
class ToolMeter:
    """The call families of one tool (or of ``UNKNOWN_TOOL``), its children bound."""

    seconds: Observed
    _calls: Callable[[str, str], Count]
    _by_outcome: dict[tuple[str, str], Count] = field(default_factory=dict)

    def ended(self, status: str, code: str, seconds: float) -> None:
        """One call ended with ``status`` and error ``code`` (``NO_CODE``) after ``seconds``."""
        counter = self._by_outcome.get((status, code))
        if counter is None:
            counter = self._by_outcome[status, code] = self._calls(status, code)
        counter.value += 1
        self.seconds.observe(seconds)


@dataclass(frozen=True, slots=True)
class DecisionMeter:
    """The decision families of one policy stage: ``allow`` ``true``/``false``/``error``, and the seconds."""

    allowed: Count
    denied: Count
    failed: Count
    seconds: Observed


class Metrics:
    """Every family of one sidecar, collected by its own ``registry`` (never the process-wide default, so that
    two sidecars in one process keep apart)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        rpc = ("grpc_type", "grpc_service", "grpc_method")
        self._grpc_started = _Family("grpc_server_started", "RPCs started on the server.", rpc)
        self._grpc_handled = _Family("grpc_server_handled", "RPCs completed on the server, whatever their status.",
                                     (*rpc, "grpc_code"))
        self._grpc_seconds = _Family("grpc_server_handling_seconds", "Time the server took to handle each RPC until "
                                     "it ended.", rpc, buckets=_CALL_BUCKETS)
        self._calls = _Family("toolbooth_tool_calls", "Tool calls, by tool, result status and error code.",
                              ("tool", "status", "code"))
        self._call_seconds = _Family("toolbooth_tool_call_duration_seconds", "Time each tool call took through the "
                                     "pipeline, to its result.", ("tool",), buckets=_CALL_BUCKETS)
        self._decisions = _Family("toolbooth_policy_decisions", "Policy decisions, by stage and answer (allow: true, "
                                  "false or error; for approval, true when none is required).", ("stage", "allow"))
        self._decision_seconds = _Family("toolbooth_policy_decision_seconds", "Time each policy evaluation took "
                                         "(decision cache included).", ("stage",), buckets=_FAST_BUCKETS)
        self._reloads = _Family("toolbooth_policy_reloads", "Changed policy sets seen by hot reload, by result "
                                "(loaded, refused, or error: the source could not be read).", ("result",))
        self._approvals = _Family("toolbooth_approvals", "Approvers' decisions on previews (approved, denied, or "
                                  "refused: not allowed, expired, wrong hash, ...).", ("decision",))
        self._store_errors = _Family("toolbooth_store_errors", "Store statements that failed, by statement.", ("op",))
        self._history = _Family("toolbooth_history_calls", "Calls whose policies read their history and stopped them, "
                                "by tool and outcome (rate_limited; label_held: held for approval, or label_refused: "
                                "refused, while their conversation carries labels).", ("tool", "outcome"))
        self._families = (self._grpc_started, self._grpc_handled, self._grpc_seconds, self._calls, self._call_seconds,
                          self._decisions, self._decision_seconds, self._reloads, self._approvals, self._store_errors,
                          self._history)
        self.audit_queue: Callable[[], int] | None = None  # read at each scrape (the store sets it)
        self._rpcs: dict[str, RpcMeter] = {}
        self._tools: dict[str, ToolMeter] = {}
        self._stages: dict[str, DecisionMeter] = {}
        from prometheus_client import CollectorRegistry

        self.registry = registry or CollectorRegistry()
        self.registry.register(self)

    def collect(self) -> Iterator[Metric]:
        """Every family as it stands (prometheus_client's collector interface, called at each scrape)."""
        from prometheus_client.core import GaugeMetricFamily

        yield from (family.collect() for family in self._families)
        depth = GaugeMetricFamily("toolbooth_audit_queue_depth", "Audit events queued and not yet written.")
        depth.add_metric((), 0 if self.audit_queue is None else self.audit_queue())
        yield depth

    def rpc(self, method: str) -> RpcMeter:
        """The meter of the full gRPC ``method`` (``/package.Service/Method``)."""
        meter = self._rpcs.get(method)
        if meter is None:
            service, _, name = method.lstrip("/").partition("/")
            labels = (_rpc_type(service, name), service, name)
            meter = self._rpcs[method] = RpcMeter(self._grpc_started.count(*labels),
                                                  self._grpc_seconds.observed(*labels),
                                                  lambda code: self._grpc_handled.count(*labels, code))
        return meter

    def tool(self, name: str) -> ToolMeter:
        """The meter of the registered tool ``name`` (or ``UNKNOWN_TOOL``: never a name from a request)."""
        meter = self._tools.get(name)
        if meter is None:
            meter = self._tools[name] = ToolMeter(self._call_seconds.observed(name),
                                                  lambda status, code: self._calls.count(name, status, code))
        return meter

    def decision(self, stage: str) -> DecisionMeter:
        """The meter of the policy ``stage`` (a ``sidecar.policy.Stage`` value)."""
        meter = self._stages.get(stage)
        if meter is None:
            meter = self._stages[stage] = DecisionMeter(
                self._decisions.count(stage, "true"), self._decisions.count(stage, "false"),
                self._decisions.count(stage, "error"), self._decision_seconds.observed(stage))
        return meter

    def reloaded(self, result: str) -> None:
        """Hot reload saw a changed policy set: ``loaded``, ``refused`` or ``error``."""
        self._reloads.count(result).inc()

    def approval(self, decision: str) -> None:
        """An approver's decision: ``approved``, ``denied`` or ``refused``."""
        self._approvals.count(decision).inc()

    def history(self, tool: str, outcome: str) -> None:
        """A call of the registered ``tool`` its history stopped: ``rate_limited``, ``label_held`` or
        ``label_refused``."""
        self._history.count(tool, outcome).inc()

    def store_error(self, op: str) -> None:
        """A store statement ``op`` (a ``StoreStatements`` name, or the kind of step) failed."""
        self._store_errors.count(op).inc()


def _rpc_type(service: str, method: str) -> str:
    """grpc-prometheus's ``grpc_type`` of a method, from its proto descriptor."""
    try:
        described = descriptor_pool.Default().FindServiceByName(service).methods_by_name[method]
    except KeyError:
        return "unary"
    streams = (described.client_streaming, described.server_streaming)
    return {(False, False): "unary", (False, True): "server_stream", (True, False): "client_stream"}.get(
        streams, "bidi_stream")
