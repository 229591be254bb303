"""Tool definitions: ``@tool``, ``ToolContext``, ``RetryPolicy`` (re-exported by ``sidecar.plugin``; ``ToolError``
and ``Partial`` are ``sidecar.tools.outcomes``').

A tool is a typed function::

    @tool(name="calculate", version="1.0.0", side_effect=SideEffect.NONE, timeout=0.5)
    async def calculate(args: CalculateInput, ctx: ToolContext) -> CalculateOutput: ...

Its input and output are pydantic models; the JSON schema shown to the model
comes from the input model. A definition is checked when the decorator runs:
a bad one raises ``ToolDefinitionError`` naming the plugin, the tool and the field.
Decorating registers nothing globally; a plugin exposes its tools through the
``toolbooth.tools`` entry-point group (see ``sidecar.tools.registry``). The definition stays callable:
``await calculate(args, ctx)`` runs the handler (``ToolDefinition.__call__``).

The handler may return ``Partial[Out]`` (annotated ``-> Out | Partial[Out]``) for a result with failed
parts. An output model that declares top-level ``next_cursor`` (``str | None``), ``has_more`` or
``truncated`` (``bool``) has them mirrored into the result's ``meta`` (``PAGE_FIELDS``). ``preview=``
names a renderer, ``(args, ctx) -> dict | BaseModel`` (sync or async), whose rendering of the call an
approver sees and approves, and the handler then gets as ``ctx.approved_preview`` (``sidecar.tools.preview``).

A handler reports progress with ``await ctx.report_progress(done, total=..., message=...)`` (a sync
handler, in its worker thread, with ``ctx.report_progress_sync``); the reports reach a caller that
streams the call (``ExecuteToolStream``), through the call's ``ProgressSink``. On any other call there
is no sink and a report does nothing, but its values are checked all the same.
"""

from __future__ import annotations

import inspect
import logging
import re
import time
import types
import typing
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from sidecar.contract import ErrorCode, Principal, Progress, SideEffect
from sidecar.tools.outcomes import Partial, ToolError

__all__ = [
    "NAME_PATTERN",
    "PAGE_FIELDS",
    "Handler",
    "ProgressSink",
    "Renderer",
    "RetryPolicy",
    "ToolContext",
    "ToolDefinition",
    "ToolDefinitionError",
    "ToolError",
    "tool",
]

NAME_PATTERN = re.compile(r"^[a-z0-9](?:[a-z0-9_-]{0,62}[a-z0-9])?\Z")
_MAX_TITLE = 128
_RETRYABLE_BY_DEFAULT = frozenset({ErrorCode.SERVICE_UNAVAILABLE, ErrorCode.RATE_LIMITED, ErrorCode.TIMEOUT})
# Output fields mirrored into ``ResultMeta``, with the types they must have there.
PAGE_FIELDS: Mapping[str, frozenset[type]] = {"next_cursor": frozenset({str, types.NoneType}),
                                              "has_more": frozenset({bool}), "truncated": frozenset({bool})}

In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out", bound=BaseModel)
S = TypeVar("S", bound=BaseModel)


class ToolDefinitionError(ValueError):
    """A tool definition is invalid. The message names plugin, tool and field."""

    def __init__(self, plugin: str, tool: str, field_name: str, problem: str) -> None:
        super().__init__(f"plugin {plugin!r}, tool {tool!r}, field {field_name!r}: {problem}")
        self.plugin, self.tool, self.field = plugin, tool, field_name


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries for read-only tools: exponential backoff between attempts, on the retryable errors of
    ``retry_on`` (any collection of codes; kept as a frozenset), while the call's deadline allows.

    ``attempt_timeout``: seconds one attempt may take (``None``: all the time left), so that an attempt that
    hangs is cancelled in time for the next, within the tool's ``timeout``; it ends with ``TIMEOUT``, which
    is retried when ``retry_on`` holds it. "Retry once on a network failure" is
    ``RetryPolicy(max_attempts=2, attempt_timeout=1.0, retry_on={ErrorCode.TIMEOUT, ErrorCode.SERVICE_UNAVAILABLE})``.
    """

    max_attempts: int = 1
    initial_backoff: float = 0.05
    max_backoff: float = 1.0
    retry_on: Collection[ErrorCode] = _RETRYABLE_BY_DEFAULT
    attempt_timeout: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "retry_on", frozenset(ErrorCode(code) for code in self.retry_on))

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return min(self.max_backoff, self.initial_backoff * 2.0 ** (attempt - 1))


class ProgressSink(Protocol):
    """Where a call's progress reports go (a streamed call's caller); set by the sidecar, not by handlers."""

    def report(self, update: Progress) -> None:
        """Take one report without waiting; called on the event loop or from a sync handler's thread."""
        ...


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a handler may know about its call. Never holds the caller's token."""

    principal: Principal
    request_id: str
    deadline: float
    idempotency_key: str | None
    attempt: int
    logger: logging.LoggerAdapter[logging.Logger]
    progress_sink: ProgressSink | None = field(default=None, repr=False, compare=False)
    approved_preview: dict[str, Any] | None = None  # the rendering an approver approved; None without approval
    conversation_id: str | None = None  # the call's conversation (``ExecuteRequest.conversation_id``), if any
    settings: BaseModel | None = None  # the plugin's validated settings (``Plugin(settings=...)``); None without
    declared_labels: frozenset[str] = frozenset()  # the labels the tool declares (``tool(labels=...)``)
    labels: set[str] = field(default_factory=set, repr=False, compare=False)  # those this result carries

    def add_label(self, label: str) -> None:
        """Mark this call's result with ``label`` (one the tool declares): the sidecar records it in the
        conversation's history, where policies read it (``input.conversation.labels``), e.g. ``restricted`` for a
        restricted document, ``untrusted`` for content fetched from outside. ``ValueError`` for an undeclared one:
        a misspelt label would silently escape the policies that look for it."""
        if label not in self.declared_labels:
            declared = ", ".join(sorted(self.declared_labels)) or "none"
            raise ValueError(f"label {label!r} is not one the tool declares (tool(labels=...); this context holds "
                             f"{declared}: a ToolContext built by hand takes them as declared_labels=...)")
        self.labels.add(label)

    def plugin_settings(self, model: type[S]) -> S:
        """``settings``, typed as the model the plugin declared; ``TypeError`` if they are not one (a test
        that built the context without ``settings=``, or a plugin registered without ``settings=model``)."""
        if not isinstance(self.settings, model):
            raise TypeError(f"the call's context holds no {model.__qualname__} settings (it holds "
                            f"{type(self.settings).__qualname__}): register the plugin as Plugin(tools, "
                            f"settings={model.__qualname__}), or pass settings= to ToolContext in a test")
        return self.settings

    def time_remaining(self) -> float:
        """Seconds until the call's deadline (``time.monotonic`` based)."""
        return max(0.0, self.deadline - time.monotonic())

    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """Report how far the call is (``progress`` of ``total``, if known), with an optional short ``message``
        that the caller sees: never put a secret in it. The caller gets the latest report at a bounded rate,
        and always the last one before the result. Does nothing unless the call is streamed; raises
        ``ValueError`` for a value that is not a finite number or a message over 1000 characters."""
        self.report_progress_sync(progress, total, message)

    def report_progress_sync(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """``report_progress`` for sync handlers: callable from their worker thread (thread-safe)."""
        update = Progress(progress=progress, total=total, message=message)
        if self.progress_sink is not None:
            self.progress_sink.report(update)


Handler = Callable[[Any, ToolContext], Awaitable[BaseModel | Partial[Any]] | BaseModel | Partial[Any]]
Renderer = Callable[[Any, ToolContext], Awaitable[BaseModel | dict[str, Any]] | BaseModel | dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ToolDefinition(Generic[In, Out]):
    """A validated tool: metadata plus its typed handler."""

    name: str
    version: str
    description: str
    handler: Handler
    input_model: type[In]
    output_model: type[Out]
    side_effect: SideEffect
    permissions: tuple[str, ...]
    timeout: float
    retry: RetryPolicy
    plugin: str
    is_async: bool = field(default=False)
    title: str = ""
    preview: Renderer | None = None  # renders the call for its approver (``sidecar.tools.preview``)
    settings: BaseModel | None = None  # its plugin's validated settings, bound at load (``sidecar.tools.plugins``)
    labels: frozenset[str] = frozenset()  # the labels its results may carry (``ToolContext.add_label``)

    async def __call__(self, args: In, ctx: ToolContext) -> Out | Partial[Out]:
        """Run the handler on ``args`` as they are, so that a decorated tool stays callable in a test:
        ``await calculate(args, ctx)``. An async handler is awaited, a sync one runs here, in this thread; no
        validation, policy or timeout applies (the gate's: ``sidecar.plugin.testing.open_gate``)."""
        returned = self.handler(args, ctx)
        if inspect.isawaitable(returned):
            returned = await returned
        return typing.cast("Out | Partial[Out]", returned)

    @property
    def requires_idempotency_key(self) -> bool:
        """Tools with side effects must be called with an idempotency key."""
        return self.side_effect is not SideEffect.NONE

    @property
    def page_fields(self) -> tuple[str, ...]:
        """The ``PAGE_FIELDS`` the output model declares: mirrored into the result's ``meta``."""
        return tuple(name for name in PAGE_FIELDS if name in self.output_model.model_fields)


def tool(
    *,
    name: str,
    version: str,
    side_effect: SideEffect | str,
    permissions: tuple[str, ...] = (),
    timeout: float = 10.0,
    description: str | None = None,
    retry: RetryPolicy | None = None,
    title: str = "",
    preview: Renderer | None = None,
    labels: Collection[str] = (),
) -> Callable[[Handler], ToolDefinition[Any, Any]]:
    """Turn a typed handler into a validated ``ToolDefinition``; ``title`` is a display name for people
    (e.g. in an MCP client), at most 128 characters on one line; without it clients show ``name``;
    ``preview``: the renderer of its calls for their approvers, ``(args, ctx) -> dict | BaseModel``, sync
    or async; ``labels``: those its results may carry, each added per result by its handler
    (``ctx.add_label``), names as tools have."""

    def decorate(handler: Handler) -> ToolDefinition[Any, Any]:
        plugin = getattr(handler, "__module__", "?")
        check = _Checker(plugin, name if isinstance(name, str) else repr(name))
        check.that(isinstance(name, str) and bool(NAME_PATTERN.match(name)), "name",
                   "must be 1-64 chars of lowercase letters, digits and inner '_' or '-'")
        check.that(isinstance(version, str) and bool(version.strip()), "version", "must be a non-empty string")
        effect = check.side_effect(side_effect)
        check.that(isinstance(timeout, int | float) and not isinstance(timeout, bool) and 0 < timeout < float("inf"),
                   "timeout", f"must be a positive number of seconds, got {timeout!r}")
        check.that(isinstance(title, str) and len(title) <= _MAX_TITLE and title.isprintable(), "title",
                   f"must be a string of at most {_MAX_TITLE} printable characters on one line")
        check.that(isinstance(permissions, tuple | list) and all(isinstance(p, str) and p for p in permissions),
                   "permissions", "must be a tuple of non-empty strings")
        declared = check.labels(labels)
        policy = retry or RetryPolicy()
        check.retry(policy, effect, timeout)
        input_model, output_model = check.signature(handler)
        check.page_fields(output_model)
        if preview is not None:
            check.that(callable(preview) and _takes_two(preview), "preview",
                       "must be a function taking exactly two positional parameters: (args, ctx)")
        doc = description if description is not None else inspect.getdoc(handler) or ""
        return ToolDefinition(
            name=name, version=version, description=doc.strip(), handler=handler,
            input_model=input_model, output_model=output_model, side_effect=effect,
            permissions=tuple(permissions), timeout=float(timeout), retry=policy, plugin=plugin,
            is_async=inspect.iscoroutinefunction(handler), title=title.strip(), preview=preview,
            labels=declared,
        )

    return decorate


@dataclass(frozen=True, slots=True)
class _Checker:
    plugin: str
    tool: str

    def that(self, ok: bool, field_name: str, problem: str) -> None:
        if not ok:
            raise ToolDefinitionError(self.plugin, self.tool, field_name, problem)

    def side_effect(self, value: SideEffect | str) -> SideEffect:
        try:
            return SideEffect(value)
        except ValueError:
            allowed = ", ".join(e.value for e in SideEffect)
            raise ToolDefinitionError(self.plugin, self.tool, "side_effect",
                                      f"unknown side effect {value!r}; expected one of {allowed}") from None

    def labels(self, labels: object) -> frozenset[str]:
        names = tuple(labels) if isinstance(labels, Iterable) and not isinstance(labels, str | bytes) else None
        self.that(names is not None and all(isinstance(label, str) and bool(NAME_PATTERN.match(label))
                                            for label in names),
                  "labels", "must be a collection of names of 1-64 chars of lowercase letters, digits and inner '_' "
                  f"or '-', got {labels!r}")
        return frozenset(names or ())

    def retry(self, policy: RetryPolicy, effect: SideEffect, timeout: float) -> None:
        self.that(policy.max_attempts >= 1, "retry", "max_attempts must be at least 1")
        self.that((policy.max_attempts == 1 and policy.attempt_timeout is None) or effect is SideEffect.NONE,
                  "retry", f"tools with side effect {effect.value!r} are never retried; use max_attempts=1 "
                  "without an attempt_timeout")
        limit = policy.attempt_timeout
        self.that(limit is None or (isinstance(limit, int | float) and not isinstance(limit, bool)
                                    and 0 < limit <= timeout),
                  "retry", f"attempt_timeout must be a positive number of seconds up to the tool's timeout "
                  f"({timeout}), got {limit!r}")

    def signature(self, handler: Handler) -> tuple[type[BaseModel], type[BaseModel]]:
        self.that(callable(handler) and not isinstance(handler, ToolDefinition), "handler",
                  "must be a function (not a tool already decorated with @tool)")
        self.that(_takes_two(handler), "handler", "must take exactly two positional parameters: (args, ctx)")
        params = list(inspect.signature(handler).parameters.values())
        try:
            hints = typing.get_type_hints(handler)
        except Exception as exc:  # unresolvable annotations: report, do not guess
            raise ToolDefinitionError(self.plugin, self.tool, "handler", f"cannot resolve type hints: {exc}") from exc
        input_model, returned = hints.get(params[0].name), hints.get("return")
        self.that(_is_model(input_model), "input", f"must be annotated with a pydantic model, got {input_model!r}")
        output_model = _output_model(returned)
        self.that(output_model is not None, "output", "return type must be a pydantic model Out, Partial[Out] or "
                  f"Out | Partial[Out], got {returned!r}")
        return input_model, output_model  # type: ignore[return-value]

    def page_fields(self, output_model: type[BaseModel]) -> None:
        for name, allowed in PAGE_FIELDS.items():
            declared = output_model.model_fields.get(name)
            if declared is not None:
                options = set(typing.get_args(declared.annotation)) or {declared.annotation}
                self.that(options <= allowed, "output", f"field {name!r} is mirrored into the result's meta, so "
                          f"it must be {' | '.join(sorted(_name(t) for t in allowed))}, got {declared.annotation!r}")


def _name(annotation: type) -> str:
    return "None" if annotation is types.NoneType else annotation.__name__


def _takes_two(function: Callable[..., object]) -> bool:
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # a callable without a signature
        return False
    return len(params) == 2 and all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _output_model(annotation: object) -> type[BaseModel] | None:
    """The output model of a return annotation ``Out``, ``Partial[Out]`` or ``Out | Partial[Out]``."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    models = set()
    for option in typing.get_args(annotation) if union else (annotation,):
        if typing.get_origin(option) is Partial:
            option = typing.get_args(option)[0]
        if not _is_model(option):
            return None
        models.add(option)
    return models.pop() if len(models) == 1 else None


def _is_model(annotation: object) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


