"""Every exception Toolbooth raises on purpose, and the one mapping of failures to ``ErrorInfo``.

::

    ToolboothError
     ├── ConfigError                 the configuration is invalid (names the key)           -> exit 2
     ├── PluginLoadError             a plugin cannot be loaded (names entry point, dist)    -> start-up fails
     ├── PolicyLoadError             a policy source cannot be loaded (names the file)      -> start-up / reload refused
     │    └── BundleError
     │         ├── BundleFetchError      the bytes could not be obtained
     │         ├── BundleFormatError     not a bundle this sidecar can load
     │         └── BundleSignatureError  signature verification refused it
     ├── AuthenticationError         the caller is not authenticated (constant message)    -> gRPC UNAUTHENTICATED
     ├── InvalidRequestError         a request breaks the API contract (constant message)  -> gRPC INVALID_ARGUMENT
     ├── DependencyError             a dependency failed mid-call: fail closed, nothing runs
     │    ├── StoreUnavailableError      the store cannot be read or written               -> SERVICE_UNAVAILABLE
     │    │    └── StoreRefusedError         the store refuses the data itself (not worth retrying)
     │    └── PolicyEvaluationError      a policy could not be evaluated                   -> SERVICE_UNAVAILABLE
     │         └── MalformedDecisionError  a decision of the wrong shape (a policy bug)    -> INTERNAL_ERROR
     └── CallRefused                 a stage ends a call with typed errors (a normal result, not a failure)
          └── ArgumentError              the arguments are invalid                         -> INVALID_ARGUMENT

A handler's ``ToolError`` (``sidecar.plugin``) is not here: it belongs to plugin authors and
becomes an ``ErrorInfo`` in dispatch. ``refusal`` is the only place a ``DependencyError``
becomes an ``ErrorInfo``; ``sidecar.faults.classify`` is the only place an exception that ends a
request outside a call becomes what the caller is told (a kind, whose gRPC status, JSON-RPC error or
HTTP status each transport has in one table).
"""

from __future__ import annotations

from sidecar.contract import ErrorCode, ErrorInfo, Preview, Status

__all__ = [
    "ArgumentError",
    "AuthenticationError",
    "BundleError",
    "BundleFetchError",
    "BundleFormatError",
    "BundleSignatureError",
    "CallRefused",
    "ConfigError",
    "DependencyError",
    "InvalidRequestError",
    "MalformedDecisionError",
    "PluginLoadError",
    "PolicyEvaluationError",
    "PolicyLoadError",
    "StoreRefusedError",
    "StoreUnavailableError",
    "ToolboothError",
    "refusal",
]


class ToolboothError(Exception):
    """The root of every exception Toolbooth raises on purpose."""


class ConfigError(ToolboothError, ValueError):
    """The configuration is invalid; the message names the offending key."""


class PluginLoadError(ToolboothError, RuntimeError):
    """A plugin cannot be loaded; the message names entry points and distributions."""


class PolicyLoadError(ToolboothError, ValueError):
    """The policy source cannot be loaded; the message names the file."""


class BundleError(PolicyLoadError):
    """A bundle cannot be used (a bad bundle is refused like a bad policy directory)."""


class BundleFetchError(BundleError):
    """The bundle's bytes could not be obtained (HTTP status, network, unreadable file)."""


class BundleFormatError(BundleError):
    """The bytes are not a bundle this sidecar can load (archive, member, size, manifest, data, Rego)."""


class BundleSignatureError(BundleError):
    """Signature verification refused the bundle (unsigned, wrong key, hash mismatch, missing file)."""


class AuthenticationError(ToolboothError):
    """The caller is not authenticated; the message is constant and safe to return."""


class InvalidRequestError(ToolboothError):
    """A request breaks the API contract (e.g. a required field is empty); the message is constant and safe to send.

    Raised by the servicers, and by the pipeline's entries for a malformed string field
    (``sidecar.pipeline.fields``), before anything reads the request; a malformed call is not a ``ToolResult``.
    """


class DependencyError(ToolboothError):
    """A dependency (store, policy engine) failed; whatever needed it was refused, nothing ran."""


class StoreUnavailableError(DependencyError, RuntimeError):
    """The store cannot be read or written; nothing may execute."""


class StoreRefusedError(StoreUnavailableError):
    """The store refuses the data of a write itself (e.g. a value its type cannot hold): writing it again
    fails again, so it is neither retried nor kept for later."""


class PolicyEvaluationError(DependencyError):
    """A policy could not be evaluated (runtime error, engine unreachable or too slow)."""


class MalformedDecisionError(PolicyEvaluationError):
    """A policy answered with a decision of the wrong shape; the message names the rule."""


class CallRefused(ToolboothError):
    """A stage ends a call early with ``errors`` (``errors[0]`` is the primary one)."""

    def __init__(self, *errors: ErrorInfo, status: Status = Status.ERROR, preview: Preview | None = None) -> None:
        super().__init__("; ".join(error.message for error in errors))
        self.errors, self.status, self.preview = errors, status, preview


class ArgumentError(CallRefused):
    """The arguments are invalid; ``errors`` says where and why."""

    def __init__(self, errors: list[ErrorInfo]) -> None:
        super().__init__(*errors)


def refusal(exc: DependencyError, *, consequence: str = "the call was denied", part: str | None = None) -> ErrorInfo:
    """The typed error a caller gets when ``exc`` stopped its request; ``consequence`` says what that meant,
    ``part`` names the part of the store that failed when that tells the caller more (``"the audit log"``).

    A malformed decision is a policy bug (``INTERNAL_ERROR``, retrying cannot fix it); anything else is
    a dependency that may recover (``SERVICE_UNAVAILABLE``, retry with backoff). The details of ``exc``
    go to the log, never to the caller.
    """
    if isinstance(exc, MalformedDecisionError):
        return ErrorInfo.of(ErrorCode.INTERNAL_ERROR, f"the policy returned a malformed decision; {consequence}")
    if part is not None:
        what = f"{part} is unavailable"
    else:
        what = "state store unavailable" if isinstance(exc, StoreUnavailableError) else "policy evaluation failed"
    return ErrorInfo.of(ErrorCode.SERVICE_UNAVAILABLE, f"{what}; {consequence}")
