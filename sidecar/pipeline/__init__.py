"""One call through every stage, with no transport code (DESIGN.md, stages 1-9).

Authentication happens before the pipeline (the server hands it a ``Principal``).
Then: resolve + availability, validate, authorize, approval, idempotency, dispatch,
shape the result, audit. Denials and failures are ``ToolResult``s; the only
exceptions that leave ``list_tools`` and ``get_operation`` are ``DependencyError``s (fail closed).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
import logging
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from sidecar.canonical import canonical_json, sha256_hex
from sidecar.config import Limits, Settings
from sidecar.contract import (
    CallRequest,
    ErrorCode,
    ErrorInfo,
    Operation,
    OperationState,
    Preview,
    Principal,
    ResultMeta,
    Status,
    ToolListing,
    ToolResult,
)
from sidecar.errors import ArgumentError, MalformedDecisionError, PolicyEvaluationError, StoreUnavailableError
from sidecar.pipeline.approvals import Approvals, CallToApprove
from sidecar.pipeline.operations import find_operation
from sidecar.policy import Decision, PolicyEngine, Stage, audit_masks
from sidecar.policy.factory import close_engine, open_reloading, with_cache
from sidecar.policy.input import InputParts, call_json, now_utc, principal_json, tool_json
from sidecar.state import AuditEvent, Expiry, KeyScope, Store
from sidecar.state.factory import open_store
from sidecar.tools.definition import NAME_PATTERN, ToolContext, ToolDefinition
from sidecar.tools.dispatch import Dispatcher
from sidecar.tools.masking import Masker, reveal
from sidecar.tools.registry import Registry
from sidecar.tools.validation import parse_arguments

log = logging.getLogger("toolbooth.pipeline")
MAX_IDEMPOTENCY_KEY_CHARS = 256


class _Stop(Exception):
    """Ends a call early with an error result (``errors[0]`` is the primary error)."""

    def __init__(self, *errors: ErrorInfo, status: Status = Status.ERROR, preview: Preview | None = None) -> None:
        super().__init__(errors[0].message)
        self.errors, self.status, self.preview = errors, status, preview


@dataclass(slots=True)
class _Call:
    """What one call accumulates on its way through the stages."""

    principal: Principal
    request: CallRequest
    request_id: str
    started: float
    policy_revision: str
    defn: ToolDefinition[Any, Any] | None = None
    args: BaseModel | None = None
    arguments: dict[str, Any] | None = None  # ``args`` as JSON data, for policies and hashes (secrets in clear)
    sensitive: frozenset[str] = frozenset()  # JSON pointers of the sensitive values in ``arguments``
    inputs: InputParts | None = None  # the policy input's shared parts, once the tool is known
    call_json: str | None = None  # ``input.call``, once the arguments are valid
    request_hash: str | None = None  # see ``Pipeline._request_hash``
    decisions: dict[str, Any] = field(default_factory=dict)
    scope: KeyScope | None = None
    deadline: float | None = None  # ``time.monotonic()`` by which the handler must end, once known
    attempts: int = 0
    detached: bool = False  # a started write: it records its own outcome, even if the caller leaves


class Pipeline:
    """Gates, runs and audits tool calls."""

    def __init__(self, *, registry: Registry, policy: PolicyEngine, store: Store, limits: Limits,
                 mask_key: bytes | None = None, retention_hours: float = 24.0) -> None:
        """``mask_key`` masks sensitive values in the audit log (default: a random key of this pipeline);
        finished idempotency records older than ``retention_hours`` are deleted."""
        self.registry, self.policy, self.store, self.limits = registry, policy, store, limits
        self._expiry = Expiry(store, retention_hours * 3600)
        self._masker = Masker(mask_key or secrets.token_bytes(32))
        self._policy_masks: tuple[str, dict[str, tuple[str, ...]]] = ("", {})  # (revision, masks)
        self.approvals = Approvals(store, policy)
        self._dispatcher = Dispatcher(sync_threads=limits.sync_handler_threads)
        self._detached: set[asyncio.Task[ToolResult]] = set()
        self._tool_json = {defn.name: tool_json(defn) for defn in registry}

    async def list_tools(self, principal: Principal, *, conversation_id: str | None = None) -> ToolListing:
        """The tools the availability policy shows ``principal``, decided in one pass."""
        revision = self.policy.revision
        tools = list(self.registry)
        who, now = principal_json(principal), now_utc()
        inputs = [InputParts(who, self._tool_json[d.name], now, conversation_id).build(Stage.AVAILABILITY)
                  for d in tools]
        try:
            decisions = await self.policy.decide_many(Stage.AVAILABILITY, inputs)
        except PolicyEvaluationError as exc:
            log.error("availability policy failed during ListTools: %s", exc)
            raise
        shown = tuple(self.registry.descriptor(d.name) for d, dec in zip(tools, decisions, strict=True) if dec.allow)
        return ToolListing(tools=shown, policy_revision=revision)

    async def execute(self, principal: Principal, request: CallRequest, *,
                      caller_deadline: float | None = None) -> ToolResult:
        """Run ``request`` through every stage and return its typed result."""
        call = _Call(principal, request, uuid.uuid4().hex, time.monotonic(), self.policy.revision)
        try:
            result = await self._stages(call, caller_deadline)
        except _Stop as stop:
            result = self._result(call, stop.status, errors=stop.errors, preview=stop.preview)
        except asyncio.CancelledError:
            if not call.detached:
                self.store.queue_audit(self._event(call, "cancelled", None))
            raise
        if not call.detached:
            self._audit(call, result)
        return result

    async def get_operation(self, principal: Principal, *, tool: str | None = None, key: str | None = None,
                            request_id: str | None = None) -> Operation:
        """Where ``principal``'s keyed call stands, by ``request_id`` or by ``tool`` and ``key``."""
        try:
            return await find_operation(self.store, principal, tool=tool, key=key, request_id=request_id)
        except StoreUnavailableError as exc:
            log.error("store unavailable during GetOperation: %s", exc)
            raise

    async def aclose(self) -> None:
        """Let started writes finish and be recorded, then release the handler pool, the store and the policy
        engine (each write is bounded by its own deadline)."""
        if self._detached:
            log.info("waiting for %d started write(s) to finish", len(self._detached))
            await asyncio.gather(*self._detached, return_exceptions=True)
        self._dispatcher.close()
        await self._expiry.aclose()
        await self.store.aclose()
        await close_engine(self.policy)

    async def _stages(self, call: _Call, caller_deadline: float | None) -> ToolResult:
        defn = await self._resolve(call)
        call.args = self._validate(defn, call.request.arguments_json)
        revealed = reveal(call.args)
        sensitive = revealed.sensitive | set(await self._masked_by_policy(call, defn.name))
        call.arguments, call.sensitive = revealed.data, sensitive
        call.call_json = call_json(call.arguments, call.request)
        await self._authorize(call)
        await self._check_approval(call)
        if not defn.requires_idempotency_key:
            return await self._dispatch(call, caller_deadline)
        # From its claim on, a keyed call runs to its end and is recorded even if the caller goes
        # away: a claimed key is always completed or released, never left "in progress".
        call.detached = True
        task = asyncio.create_task(self._keyed(call, caller_deadline))
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)
        return await asyncio.shield(task)

    async def _keyed(self, call: _Call, caller_deadline: float | None) -> ToolResult:
        """Claim the key, record the dispatch, run the handler, store and audit the outcome."""
        try:
            result = await self._claim(call, caller_deadline)
            if result is None:
                await self._audit_before_dispatch(call)
                result = await self._dispatch(call, caller_deadline)
        except _Stop as stop:
            result = self._result(call, stop.status, errors=stop.errors)
        self._audit(call, result)
        return result

    async def _resolve(self, call: _Call) -> ToolDefinition[Any, Any]:
        """The tool, if it exists and availability allows it. An unknown name is decided too (on a
        stand-in tool, answer ignored), so that a failing engine or its latency tells nothing apart."""
        defn = self.registry.get(call.request.tool)
        if defn is None and not NAME_PATTERN.match(call.request.tool):  # cannot name any tool, hidden or not
            raise _Stop(ErrorInfo.of(ErrorCode.TOOL_UNAVAILABLE, f"tool {call.request.tool[:64]!r} is not available"))
        tool = self._tool_json[defn.name] if defn is not None else _unknown_tool_json(call.request.tool)
        call.inputs = InputParts(principal_json(call.principal), tool, now_utc(), call.request.conversation_id)
        decision = await self._decide(call, Stage.AVAILABILITY)
        if defn is not None and decision.allow:
            call.defn = defn
            return defn
        raise _Stop(ErrorInfo.of(ErrorCode.TOOL_UNAVAILABLE, f"tool {call.request.tool!r} is not available"))

    def _validate(self, defn: ToolDefinition[Any, Any], arguments_json: str) -> BaseModel:
        try:
            return parse_arguments(arguments_json, defn.input_model, max_bytes=self.limits.max_argument_bytes,
                                   max_depth=self.limits.max_argument_depth)
        except ArgumentError as exc:
            raise _Stop(*exc.errors) from None

    async def _authorize(self, call: _Call) -> None:
        decision = await self._decide(call, Stage.AUTHZ)
        if not decision.allow:
            code = decision.code or ErrorCode.PERMISSION_DENIED
            raise _Stop(ErrorInfo.of(code, decision.reason or "the call is not permitted"))

    async def _check_approval(self, call: _Call) -> None:
        """Run only approved calls: redeem ``approval_id`` (see ``sidecar.pipeline.approvals``), or answer
        ``APPROVAL_REQUIRED`` with a new preview when the policy requires approval."""
        decision = await self._decide(call, Stage.APPROVAL)
        if call.request.approval_id:
            call.decisions["approval_id"] = call.request.approval_id
            key = call.request.idempotency_key if call.defn and call.defn.requires_idempotency_key else None
            refusal = await self.approvals.redeem(call.request.approval_id, self._to_approve(call), decision, key=key)
            if refusal is not None:
                status = Status.APPROVAL_REQUIRED if refusal.preview is not None else Status.ERROR
                raise _Stop(refusal.error, status=status, preview=refusal.preview)
        elif decision.required:
            preview = await self._store(self.approvals.open_preview(self._to_approve(call), decision))
            raise _Stop(ErrorInfo.of(ErrorCode.APPROVAL_REQUIRED, preview.reason), status=Status.APPROVAL_REQUIRED,
                        preview=preview)

    def _to_approve(self, call: _Call) -> CallToApprove:
        """The call to preview or compare, its sensitive values masked: the keyed hash binds an approval to
        them without a preview (shown to approvers, stored) ever holding them in clear."""
        assert call.defn is not None and call.arguments is not None
        arguments = self._masker.mask(call.arguments, call.sensitive)
        return CallToApprove(call.principal, call.defn.name, call.defn.version, arguments, call.policy_revision)

    async def _decide(self, call: _Call, stage: Stage) -> Decision:
        assert call.inputs is not None
        try:
            decision = await self.policy.decide(stage, call.inputs.build(stage, call.call_json))
        except MalformedDecisionError as exc:
            log.error("malformed %s decision for request %s: %s", stage, call.request_id, exc)
            call.decisions[stage.value] = {"error": str(exc)}
            raise _Stop(ErrorInfo.of(ErrorCode.INTERNAL_ERROR, "the policy returned a malformed decision; "
                                     "the call was denied")) from None
        except PolicyEvaluationError as exc:
            log.error("policy %s failed for request %s: %s", stage, call.request_id, exc)
            call.decisions[stage.value] = {"error": str(exc)}
            raise _Stop(ErrorInfo.of(ErrorCode.SERVICE_UNAVAILABLE, "policy evaluation failed; "
                                     "the call was denied")) from None
        call.decisions[stage.value] = decision.document()
        return decision

    async def _claim(self, call: _Call, caller_deadline: float | None) -> ToolResult | None:
        assert call.defn is not None and call.args is not None
        key = call.request.idempotency_key
        if not key or len(key) > MAX_IDEMPOTENCY_KEY_CHARS:
            raise _Stop(ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, f"tool {call.defn.name!r} has side effects: an "
                                     f"idempotency_key of 1-{MAX_IDEMPOTENCY_KEY_CHARS} characters is required",
                                     field="idempotency_key"))
        call.scope = KeyScope(call.principal.tenant, call.principal.id, call.defn.name, key)
        call.deadline = _deadline(call.defn, caller_deadline)
        deadline_at = time.time() + (call.deadline - time.monotonic())
        claim = await self._store(self.store.claim(call.scope, self._request_hash(call), call.request_id,
                                                   deadline_at=deadline_at))
        if claim.record is None:
            self._expiry.poke()
            return None
        call.scope = None  # not ours: never complete or release it
        if claim.reused:
            raise _Stop(ErrorInfo.of(ErrorCode.IDEMPOTENCY_KEY_REUSED, "this idempotency key was used for a "
                                     "different request", field="idempotency_key"))
        if claim.record.state is OperationState.IN_PROGRESS:
            raise _Stop(ErrorInfo.of(ErrorCode.OPERATION_IN_PROGRESS, "a call with this idempotency key is still "
                                     "running", field="idempotency_key"))
        if claim.record.state is OperationState.UNKNOWN:
            raise _Stop(ErrorInfo.of(ErrorCode.OPERATION_IN_PROGRESS, "the outcome of the call with this "
                                     "idempotency key is unknown (its sidecar stopped while it ran); it is not run "
                                     "again until an operator resolves it (toolbooth operations resolve)",
                                     field="idempotency_key"))
        assert claim.record.result_json is not None  # completed or failed: replay the stored result
        stored = ToolResult.model_validate_json(claim.record.result_json)
        meta = stored.meta.model_copy(update={"request_id": call.request_id, "idempotency_replayed": True})
        return stored.model_copy(update={"meta": meta})

    async def _audit_before_dispatch(self, call: _Call) -> None:
        try:
            await self.store.record_audit(self._event(call, "dispatching", None))
        except StoreUnavailableError as exc:
            await self._release(call)
            log.error("audit write failed before dispatch of request %s: %s", call.request_id, exc)
            raise _Stop(ErrorInfo.of(ErrorCode.SERVICE_UNAVAILABLE, "the audit log is unavailable; "
                                     "nothing was executed")) from None

    async def _dispatch(self, call: _Call, caller_deadline: float | None) -> ToolResult:
        defn, args = call.defn, call.args
        assert defn is not None and args is not None
        deadline = call.deadline if call.deadline is not None else _deadline(defn, caller_deadline)
        outcome = await self._dispatcher.run(defn, args, self._context(call, deadline))
        call.attempts = outcome.attempts
        if outcome.error is not None:
            result = self._result(call, Status.ERROR, errors=(outcome.error,))
        else:
            assert outcome.output is not None
            result = self._success(call, outcome.output.model_dump(mode="json"))
        await self._finish_key(call, result)
        return result

    def _success(self, call: _Call, data: Any) -> ToolResult:
        size = len(json.dumps(data, separators=(",", ":")).encode())
        if size > self.limits.max_result_bytes:
            log.error("tool %r returned %d bytes (limit %d)", call.request.tool, size, self.limits.max_result_bytes)
            error = ErrorInfo.of(ErrorCode.INTERNAL_ERROR, f"the tool's result is {size} bytes, above the "
                                 f"limit of {self.limits.max_result_bytes}; it was not returned")
            return self._result(call, Status.ERROR, errors=(error,))
        return self._result(call, Status.SUCCESS, data=data)

    async def _finish_key(self, call: _Call, result: ToolResult) -> None:
        """Store the outcome of a keyed call; forget it if the tool said nothing happened."""
        if call.scope is None:
            return
        if result.error is not None and result.error.retryable and result.error.code is not ErrorCode.TIMEOUT:
            await self._release(call)
            return
        try:
            await self.store.complete(call.scope, result.model_dump_json())
        except StoreUnavailableError as exc:
            log.error("could not store the result of request %s under its key: %s", call.request_id, exc)

    async def _release(self, call: _Call) -> None:
        if call.scope is not None:
            try:
                await self.store.release(call.scope)
            except StoreUnavailableError as exc:
                log.error("could not release idempotency key of request %s: %s", call.request_id, exc)

    async def _store(self, operation: Any) -> Any:
        try:
            return await operation
        except StoreUnavailableError as exc:
            log.error("store unavailable: %s", exc)
            raise _Stop(ErrorInfo.of(ErrorCode.SERVICE_UNAVAILABLE, "state store unavailable; "
                                     "nothing was executed")) from None

    def _context(self, call: _Call, deadline: float) -> ToolContext:
        logger = logging.LoggerAdapter(_tool_logger(call.request.tool), {"request_id": call.request_id})
        return ToolContext(principal=call.principal, request_id=call.request_id, deadline=deadline,
                           idempotency_key=call.request.idempotency_key, attempt=1, logger=logger)

    def _request_hash(self, call: _Call) -> str:
        """Hash of the canonical request: equal for equal arguments in any key order or spacing.

        Before the arguments are valid, the raw text is hashed instead.
        """
        if call.request_hash is None:
            arguments = call.request.arguments_json if call.arguments is None else call.arguments
            version = call.defn.version if call.defn else ""
            call.request_hash = sha256_hex({"tool": call.request.tool, "version": version, "arguments": arguments})
        return call.request_hash

    def _result(self, call: _Call, status: Status, *, data: Any = None, errors: tuple[ErrorInfo, ...] = (),
                preview: Preview | None = None) -> ToolResult:
        error = errors[0] if errors else None
        return ToolResult(status=status, data=data, error=error, errors=errors, meta=self._meta(call), preview=preview)

    def _meta(self, call: _Call) -> ResultMeta:
        defn = call.defn
        return ResultMeta(
            request_id=call.request_id, tool=call.request.tool, tool_version=defn.version if defn else "",
            duration_ms=round((time.monotonic() - call.started) * 1000), attempt=call.attempts,
            policy_revision=call.policy_revision,
        )

    def _audit(self, call: _Call, result: ToolResult) -> None:
        """Queue the outcome event (the event before a write's dispatch was already durable)."""
        code = result.error.code.value if result.error else None
        self.store.queue_audit(self._event(call, result.status.value, code))

    def _event(self, call: _Call, status: str, error_code: str | None) -> AuditEvent:
        defn, request = call.defn, call.request
        return AuditEvent(
            request_id=call.request_id, time=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            principal_id=call.principal.id, tenant=call.principal.tenant,
            tool=request.tool, tool_version=defn.version if defn else "",
            input_hash=self._request_hash(call),
            decisions_json=json.dumps(call.decisions, sort_keys=True), policy_revision=call.policy_revision,
            idempotency_key=request.idempotency_key, call_id=request.call_id,
            conversation_id=request.conversation_id, status=status, error_code=error_code,
            duration_ms=round((time.monotonic() - call.started) * 1000), arguments_json=self._recorded_arguments(call),
        )

    async def _masked_by_policy(self, call: _Call, tool: str) -> tuple[str, ...]:
        """The pointers ``data.toolbooth.audit.mask`` lists for ``tool``, read once per policy revision."""
        revision = self.policy.revision
        if self._policy_masks[0] != revision:
            try:
                self._policy_masks = (revision, await audit_masks(self.policy))
            except PolicyEvaluationError as exc:
                log.error("audit masks could not be read for request %s: %s", call.request_id, exc)
                raise _Stop(ErrorInfo.of(ErrorCode.SERVICE_UNAVAILABLE, "policy evaluation failed; "
                                         "the call was denied")) from None
        return self._policy_masks[1].get(tool, ())

    def _recorded_arguments(self, call: _Call) -> str | None:
        """The valid arguments as the audit log records them, sensitive values masked."""
        if call.arguments is None:
            return None
        return canonical_json(self._masker.mask(call.arguments, call.sensitive))


def _deadline(defn: ToolDefinition[Any, Any], caller_deadline: float | None) -> float:
    """When a call of ``defn`` must end (``time.monotonic()``): its timeout from now, or the caller's deadline."""
    deadline = time.monotonic() + defn.timeout
    return deadline if caller_deadline is None else min(deadline, caller_deadline)


def _unknown_tool_json(name: str) -> str:
    return json.dumps({"name": name, "version": "", "side_effect": "none", "permissions": [], "plugin": ""})


@functools.cache
def _tool_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"toolbooth.tool.{name}")


async def build_pipeline(settings: Settings, *, registry: Registry | None = None,
                         policy: PolicyEngine | None = None) -> Pipeline:
    """Load plugins (unless ``registry`` is given) and policies (unless ``policy`` is), open the store."""
    if registry is None:
        registry = Registry.from_entry_points(allow=settings.plugins.allow)
    engine = policy or with_cache(await open_reloading(settings.policy), settings.policy)
    try:
        store = await open_store(settings.store)
    except BaseException:
        await close_engine(engine)
        raise
    mask_key = await _mask_key(settings, store, engine)
    return Pipeline(registry=registry, policy=engine, store=store, limits=settings.limits, mask_key=mask_key,
                    retention_hours=settings.store.idempotency_retention_hours)


async def _mask_key(settings: Settings, store: Store, engine: PolicyEngine) -> bytes:
    """The configured ``audit.mask_key``, else the store's own key (generated the first time)."""
    try:
        return settings.audit.read_mask_key() or await store.audit_mask_key(secrets.token_bytes(32))
    except BaseException:
        await store.aclose()
        await close_engine(engine)
        raise
