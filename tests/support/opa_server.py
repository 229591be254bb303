"""A local OPA server: the REST endpoints the opa engine uses, as OPA documents them, over OPA's own engine.

- ``GET /v1/policies`` -> ``{"result": [{"id", "raw"}]}``; ``PUT /v1/policies/{id}`` (Rego text)
  -> ``{}``, or 400 ``invalid_parameter`` with each compile error and its location; ``DELETE /v1/policies/{id}``;
- ``PUT /v1/data/{path}`` (a JSON document) -> 204;
- ``POST /v1/data/{path}`` (``{"input": ...}``) -> ``{"result": ...}``, no ``result`` when the
  document is undefined, 500 ``internal_error`` with each evaluation error when evaluation fails.

Rego is compiled and evaluated by OPA v1.20.2 itself, in this process (``tests.support.real_opa``;
a test using the server is skipped, or fails under ``CI=true``, without it). Built-in errors are
always strict, as the opa engine asks (``?strict-builtin-errors=true``). Locations are OPA's, with
the column where the engine shows one (parse errors). With ``upstream`` the server evaluates
nothing and forwards each request to that OPA server instead. Either way ``inject`` breaks the
transport on purpose: added latency, an error status, a dropped connection, a fixed body
(``deep_json`` and ``huge_json`` build hostile ones) or a redirect. With ``token``, requests
without that bearer token get 401.
"""

from __future__ import annotations

import json
import ssl
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from tests.support.real_opa import bindings, compiled, rego_errors

Answer = tuple[int, bytes]
ALLOW = b'{"result": {"allow": true}}'  # what a hostile server answers to any decision


@dataclass(frozen=True)
class Fault:
    """What to break, for requests whose path starts with ``path``."""

    latency: float = 0.0  # seconds before anything else happens
    status: int | None = None  # answer with this status and an OPA-style error
    body: bytes | None = None  # answer 200 with exactly these bytes
    close: bool = False  # close the connection without answering
    redirect: str | None = None  # answer ``status`` (307 if unset) to this base URL + the request's path
    path: str = "/"


@dataclass(frozen=True)
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    authorization: str | None
    body: bytes


def error(status: int, code: str, message: str, **extra: Any) -> Answer:
    """An OPA error answer."""
    return status, json.dumps({"code": code, "message": message, **extra}).encode()


def ok(document: Any) -> Answer:
    return 200, json.dumps(document).encode()


def deep_json(depth: int) -> bytes:
    """An allowing decision whose answer nests ``depth`` deep (arrays in ``nested``): valid JSON, hostile
    to recursive parsers."""
    arrays = depth - 2  # the answer and the decision are the first two levels
    return b'{"result": {"allow": true, "nested": ' + b"[" * arrays + b"]" * arrays + b"}}"


def huge_json(size: int) -> bytes:
    """An allowing decision of ``size`` bytes, padded with a long ``reason``."""
    head, tail = b'{"result": {"allow": true, "reason": "', b'"}}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


class OpaServer:
    """The server; ``with OpaServer() as opa:`` serves at ``opa.url`` until the block ends."""

    def __init__(self, *, upstream: str | None = None, token: str | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.backend: _Engine | _Upstream = _Upstream(upstream) if upstream else _Engine()
        self.token = token
        self.seen: list[Seen] = []
        self.stopping = threading.Event()
        self._fault = Fault()
        self._http = _HttpServer(self)
        if tls is not None:
            self._http.socket = tls.wrap_socket(self._http.socket, server_side=True)
        host, port = self._http.server_address[:2]
        self.url = f"{'https' if tls else 'http'}://{host}:{port}"
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="opa-server", daemon=True)  # polled: shutdown() waits for the poll

    def __enter__(self) -> OpaServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()
        self.backend.close()

    def inject(self, fault: Fault | None = None) -> None:
        """Break every later request matching ``fault.path`` that way (``None``: heal)."""
        self._fault = fault or Fault()

    def answer(self, method: str, path: str, authorization: str | None,
               body: bytes) -> tuple[Answer | None, dict[str, str]]:
        """The answer to one request (``None``: drop the connection) and the extra headers to send with it."""
        self.seen.append(Seen(method, path, authorization, body))
        fault = self._fault if path.startswith(self._fault.path) else Fault()
        if fault.latency and self.stopping.wait(fault.latency):
            return None, {}  # stopped meanwhile
        if fault.close:
            return None, {}
        if fault.redirect is not None:
            return (fault.status or 307, fault.body or ALLOW), {"Location": fault.redirect + path}
        return self._answer(fault, method, path, authorization, body), {}

    def _answer(self, fault: Fault, method: str, path: str, authorization: str | None, body: bytes) -> Answer:
        if fault.body is not None:
            return 200, fault.body
        if fault.status is not None:
            return error(fault.status, "internal_error", "injected fault")
        if self.token is not None and authorization != f"Bearer {self.token}":
            return error(401, "unauthorized", "request rejected by administrative policy")
        return self.backend.answer(method, path, authorization, body)


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many decisions connect at once (ListTools), as OPA allows

    def __init__(self, opa: OpaServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.opa = opa

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (e.g. timed out) is expected here; anything else is reported."""
        if not isinstance(sys.exc_info()[1], ConnectionError | ssl.SSLError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as OPA
    wbufsize = -1  # headers and body leave in one write, when the answer is complete
    disable_nagle_algorithm = True
    server: _HttpServer

    def do_GET(self) -> None:
        self._serve()

    do_PUT = do_POST = do_DELETE = do_GET

    def _serve(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        answer, headers = self.server.opa.answer(self.command, self.path, self.headers.get("Authorization"), body)
        if answer is None:
            self.close_connection = True
            return
        status, payload = answer
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if status != 204:
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if status != 204:
            self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read ``OpaServer.seen`` instead."""


class _Engine:
    """OPA's policy and data APIs over OPA's engine: each change compiles a new engine from every module and
    the data, and takes its place only if it compiles."""

    def __init__(self) -> None:
        self.modules: dict[str, str] = {}
        self.data: dict[str, Any] = {}
        self._engine = compiled([])
        self._changing = threading.Lock()

    def answer(self, method: str, path: str, authorization: str | None, body: bytes) -> Answer:
        api, _, rest = urlsplit(path).path.removeprefix("/v1/").partition("/")
        rest = unquote(rest)
        match api, method, rest:
            case "policies", "GET", "":
                return ok({"result": [{"id": name, "raw": raw} for name, raw in sorted(self.modules.items())]})
            case "policies", "PUT", _ if rest:
                return self._change(lambda: ({**self.modules, rest: body.decode()}, self.data)) or ok({})
            case "policies", "DELETE", _ if rest in self.modules:
                return self._change(lambda: ({k: v for k, v in self.modules.items() if k != rest}, self.data)) or ok({})
            case "policies", "DELETE", _:
                return error(404, "resource_not_found", f"storage_not_found_error: policy id {rest!r}")
            case "data", "PUT", _ if rest:
                return self._put_data(rest.split("/"), body)
            case "data", "POST", _:
                return self._evaluate([part for part in rest.split("/") if part], body)
        return error(404, "resource_not_found", f"{method} {path} is not implemented here")

    def close(self) -> None:
        """Nothing to release: an engine no request uses any more is closed when it is collected."""

    def _put_data(self, keys: list[str], body: bytes) -> Answer:
        try:
            value = json.loads(body)
        except ValueError as exc:
            return error(400, "invalid_parameter", f"body contains malformed JSON: {exc}")

        def changed() -> tuple[dict[str, str], dict[str, Any]]:
            data = json.loads(json.dumps(self.data))
            node = data
            for key in keys[:-1]:
                node = node.setdefault(key, {})
            node[keys[-1]] = value
            return self.modules, data

        return self._change(changed) or (204, b"")

    def _change(self, change: Callable[[], tuple[dict[str, str], dict[str, Any]]]) -> Answer | None:
        """Compile the modules and data ``change()`` makes of the current ones; keep them, or answer OPA's 400
        with each compile error and keep the old ones."""
        with self._changing:
            modules, data = change()
            try:
                engine = compiled(modules.items(), data)
            except bindings().OpaError as exc:
                return error(400, "invalid_parameter", "error(s) occurred while compiling module(s)",
                             errors=_located(exc.message))
            self.modules, self.data, self._engine = modules, data, engine
        return None

    def _evaluate(self, keys: list[str], body: bytes) -> Answer:
        try:
            request = json.loads(body) if body else {}
        except ValueError as exc:
            return error(400, "invalid_parameter", f"body contains malformed input document: {exc}")
        query = "x = data" + "".join(f"[{json.dumps(key)}]" for key in keys)
        try:
            results = self._engine.eval_query(query, request.get("input"))
        except bindings().OpaError as exc:
            return error(500, "internal_error", "error(s) occurred while evaluating query",
                         errors=_located(exc.message))
        return ok({"result": results[0]["x"]} if results else {})


def _located(message: str) -> list[dict[str, Any]]:
    """The errors of an engine's message as OPA's API lists them (the whole message when it names none)."""
    return [found.as_json() for found in rego_errors(message)] or [{"code": "internal_error", "message": message}]


@dataclass(frozen=True)
class _Upstream:
    """Forwards every request to a real OPA."""

    url: str

    def answer(self, method: str, path: str, authorization: str | None, body: bytes) -> Answer:
        rego = path.startswith("/v1/policies/") and method == "PUT"
        headers = {"Content-Type": "text/plain" if rego else "application/json"}
        if authorization:
            headers["Authorization"] = authorization
        request = urllib.request.Request(self.url + path, data=body or None, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def close(self) -> None:
        """Nothing to release."""
