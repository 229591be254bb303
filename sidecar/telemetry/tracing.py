"""``Tracing``: one sidecar's OpenTelemetry tracer provider, configured from the standard ``OTEL_*`` variables.

``OTEL_TRACES_EXPORTER`` names the exporters (comma-separated; ``console`` is the SDK's, writing one JSON
object per line to stdout; ``otlp`` needs the ``otlp`` extra), found by the entry points every exporter
package registers (group ``opentelemetry_traces_exporter``); each gets a ``BatchSpanProcessor``. As in the
SDK's own configuration, ``otlp`` is the entry point of the protocol ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``
(or ``OTEL_EXPORTER_OTLP_PROTOCOL``) names: ``otlp_proto_grpc`` for ``grpc`` (the default),
``otlp_proto_http`` for ``http/protobuf``. Unset,
``none`` or ``OTEL_SDK_DISABLED=true``: the sidecar does not trace at all (``Tracing.enabled`` is false and
no span is ever made). Everything else is the SDK's own reading of the environment: the sampler
(``OTEL_TRACES_SAMPLER``, ``OTEL_TRACES_SAMPLER_ARG``), the resource (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``; the service is ``toolbooth`` unless they name one), the batching
(``OTEL_BSP_*``) and each exporter's own variables (``OTEL_EXPORTER_OTLP_*``).

The provider is this sidecar's, never the process-wide global one, so that two sidecars (or a test's
in-memory exporter) trace apart; ``aclose`` flushes the spans still queued and stops the exporters.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING

from opentelemetry.environment_variables import OTEL_TRACES_EXPORTER

from sidecar.errors import ConfigError

if TYPE_CHECKING:  # the SDK loads only when traces are exported (OTEL_TRACES_EXPORTER set)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

__all__ = ["EXPORTER_ENTRY_POINTS", "SERVICE", "Tracing", "check_exporters"]

EXPORTER_ENTRY_POINTS = "opentelemetry_traces_exporter"
SERVICE = "toolbooth"
_UNNAMED_SERVICE = "unknown_service"  # the SDK's service.name when the environment names none
_OFF = ("", "none")
_OTLP = "otlp"
_OTLP_BY_PROTOCOL = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}
# The SDK's variables (opentelemetry.sdk.environment_variables), named here so that reading them loads no SDK.
_OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"
_OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
_OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"


@dataclass(frozen=True, slots=True)
class Tracing:
    """A sidecar's tracer (``None``: it does not trace), the provider to flush at shutdown and the names of its
    exporters (for the start-up log)."""

    tracer: Tracer | None = None
    provider: TracerProvider | None = None
    exporters: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        """Whether this sidecar makes spans."""
        return self.tracer is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Tracing:
        """The tracing ``OTEL_TRACES_EXPORTER`` asks for (``ConfigError`` for an exporter that is not installed);
        off when it is unset or ``none``, or when ``OTEL_SDK_DISABLED`` is true."""
        env = os.environ if env is None else env
        names = _named(env)
        if not names:
            return cls()
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        return cls.exporting(*(BatchSpanProcessor(_exporter(name, env)) for name in names), exporters=tuple(names))

    @classmethod
    def exporting(cls, *processors: SpanProcessor, exporters: tuple[str, ...] = ()) -> Tracing:
        """Tracing whose spans go to ``processors`` (the sampler and resource from the environment)."""
        from opentelemetry.sdk.trace import TracerProvider

        provider = TracerProvider(resource=_resource())
        for processor in processors:
            provider.add_span_processor(processor)
        return cls(provider.get_tracer(SERVICE), provider, exporters)

    async def aclose(self) -> None:
        """Export the spans still queued, then stop the exporters (in a thread: an exporter may block)."""
        if self.provider is not None:
            await asyncio.to_thread(self.provider.shutdown)


def _resource() -> Resource:
    """The SDK's resource from the environment, named ``toolbooth`` unless that names the service."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith(_UNNAMED_SERVICE):
        resource = resource.merge(Resource({SERVICE_NAME: SERVICE}))
    return resource


def _entry_point(name: str, env: Mapping[str, str]) -> str:
    """The entry point ``name`` stands for: itself, unless it is ``otlp`` (then: that of the OTLP protocol)."""
    if name != _OTLP:
        return name
    for variable in (_OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, _OTEL_EXPORTER_OTLP_PROTOCOL):
        protocol = env.get(variable, "").strip()
        if protocol:
            if protocol not in _OTLP_BY_PROTOCOL:
                raise ConfigError(f"{variable}={protocol!r}: not an OTLP protocol of traces; expected one of "
                                  f"{', '.join(_OTLP_BY_PROTOCOL)}")
            return _OTLP_BY_PROTOCOL[protocol]
    return _OTLP_BY_PROTOCOL["grpc"]


def check_exporters(env: Mapping[str, str] | None = None) -> None:
    """Raise the ``ConfigError`` ``Tracing.from_env`` would for an exporter ``OTEL_TRACES_EXPORTER`` names that is
    not installed (or an OTLP protocol that is none), making no exporter (``toolbooth config validate``)."""
    env = os.environ if env is None else env
    for name in _named(env):
        _registered(name, env)


def _named(env: Mapping[str, str]) -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names; none when it is unset or ``none``, or the SDK is disabled."""
    if env.get(_OTEL_SDK_DISABLED, "").strip().lower() == "true":
        return []
    names = [name.strip() for name in env.get(OTEL_TRACES_EXPORTER, "").split(",")]
    return [name for name in names if name.lower() not in _OFF]


def _registered(name: str, env: Mapping[str, str]) -> EntryPoint:
    """The entry point of the exporter ``name`` (``otlp``: see ``_entry_point``); ``ConfigError`` if none is."""
    entry = _entry_point(name, env)
    found = entry_points(group=EXPORTER_ENTRY_POINTS, name=entry)
    if not found:
        known = sorted({point.name for point in entry_points(group=EXPORTER_ENTRY_POINTS)})
        meant = "" if entry == name else f" (for it: {entry})"
        hint = " (toolbooth[otlp] installs otlp_proto_grpc)" if entry.startswith(_OTLP) else ""
        raise ConfigError(f"{OTEL_TRACES_EXPORTER}={name!r}: no such span exporter is installed{meant}{hint}; "
                          f"installed: {', '.join([*known, 'none'])}")
    return next(iter(found))


def _exporter(name: str, env: Mapping[str, str]) -> SpanExporter:
    """A new exporter of the package that registered ``name``."""
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter

    exporter_class = _registered(name, env).load()
    exporter = exporter_class(formatter=_one_line) if exporter_class is ConsoleSpanExporter else exporter_class()
    if not isinstance(exporter, SpanExporter):
        raise ConfigError(f"{OTEL_TRACES_EXPORTER}={name!r}: {exporter_class!r} is not a span exporter")
    return exporter


def _one_line(span: ReadableSpan) -> str:
    """A span as the console exporter writes it: one JSON object per line (the SDK's default indents it)."""
    return f"{span.to_json(indent=None)}\n"
