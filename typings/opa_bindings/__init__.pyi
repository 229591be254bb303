"""Types of opa-golib-python-bindings 0.4.4 (OPA v1.20.2 in-process through ctypes), which ships no stubs."""

from types import TracebackType
from typing import Any

__all__ = ["OpaEngine", "OpaError", "OpaUndefinedError"]

class OpaError(Exception):
    """``code``: ``parse_error`` (``add_policy``), ``prepare_error`` (compiling, at the first evaluation),
    ``eval_error``, ...; ``message``: OPA's text, ``file:row: code: message`` for each error."""

    code: str
    message: str
    def __init__(self, code: str, message: str) -> None: ...

class OpaUndefinedError(OpaError):
    def __init__(self, what: str) -> None: ...

class OpaEngine:
    """Policies, data and input in, values out; evaluations are serialized by the engine's own lock."""

    last_coverage: dict[str, Any] | None
    def __init__(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> OpaEngine: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None: ...
    def add_policy(self, path: str, source: str) -> None:
        """Parse a module (``OpaError`` ``parse_error``); it is compiled with the others at the next evaluation."""
    def add_data(self, value: Any, path: str = "") -> None:
        """Deep-merge ``value`` into ``data`` (at the dotted ``path``)."""
    def eval_query(self, query: str, input: Any = None, *, coverage: bool = False,
                   trace: bool = False) -> list[dict[str, Any]]:
        """The bindings of each result (``[]``: undefined)."""
    def eval_document(self, path: str, input: Any = None, *, coverage: bool = False, trace: bool = False) -> Any:
        """The value of ``data.<path>``; ``OpaUndefinedError`` when it is undefined."""
