"""A local stand-in for an OPA server: the REST endpoints the opa engine uses, as OPA documents them.

- ``GET /v1/policies`` -> ``{"result": [{"id", "raw"}]}``; ``PUT /v1/policies/{id}`` (Rego text)
  -> ``{}``, or 400 ``invalid_parameter`` with each compile error; ``DELETE /v1/policies/{id}``;
- ``PUT /v1/data/{path}`` (a JSON document) -> 204;
- ``POST /v1/data/{path}`` (``{"input": ...}``) -> ``{"result": ...}``, no ``result`` when the
  document is undefined, 500 ``internal_error`` when evaluation fails.

Rego is evaluated by regorus on one worker thread that creates, uses and drops every
regorus engine (they are bound to their thread). With ``upstream`` the server evaluates
nothing and forwards each request to that (real) OPA instead. Either way ``inject``
breaks the transport on purpose: added latency, an error status, a dropped connection,
a fixed body (``deep_json`` and ``huge_json`` build hostile ones) or a redirect. With
``token``, requests without that bearer token get 401.
"""

from __future__ import annotations

import json
import re
import ssl
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

import regorus

from sidecar.policy.files import clean_regorus_error

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


class FakeOpa:
    """The server; ``with FakeOpa() as opa:`` serves at ``opa.url`` until the block ends."""

    def __init__(self, *, upstream: str | None = None, token: str | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.backend: _Regorus | _Upstream = _Upstream(upstream) if upstream else _Regorus()
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
                                        name="fake-opa", daemon=True)  # polled: shutdown() waits for the poll

    def __enter__(self) -> FakeOpa:
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

    def __init__(self, fake: FakeOpa) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fake = fake

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
        answer, headers = self.server.fake.answer(self.command, self.path, self.headers.get("Authorization"), body)
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
        """Quiet: tests read ``FakeOpa.seen`` instead."""


class _Regorus:
    """OPA's policy and data APIs over regorus; all regorus work runs on one worker thread."""

    def __init__(self) -> None:
        self.modules: dict[str, str] = {}
        self.data: dict[str, Any] = {}
        self._engine: regorus.Engine | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fake-opa-regorus")

    def answer(self, method: str, path: str, authorization: str | None, body: bytes) -> Answer:
        return self._worker.submit(self._route, method, urlsplit(path).path, body).result()

    def close(self) -> None:
        self._worker.submit(self._drop).result()
        self._worker.shutdown()

    def _drop(self) -> None:
        self._engine = None

    def _route(self, method: str, path: str, body: bytes) -> Answer:
        api, _, rest = path.removeprefix("/v1/").partition("/")
        rest = unquote(rest)
        match api, method, rest:
            case "policies", "GET", "":
                return ok({"result": [{"id": name, "raw": raw} for name, raw in sorted(self.modules.items())]})
            case "policies", "PUT", _ if rest:
                return self._replace({**self.modules, rest: body.decode()}, self.data) or ok({})
            case "policies", "DELETE", _ if rest in self.modules:
                others = {name: raw for name, raw in self.modules.items() if name != rest}
                return self._replace(others, self.data) or ok({})
            case "policies", "DELETE", _:
                return error(404, "resource_not_found", f"storage_not_found_error: policy id {rest!r}")
            case "data", "PUT", _ if rest:
                return self._put_data(rest.split("/"), body)
            case "data", "POST", _:
                return self._evaluate([part for part in rest.split("/") if part], body)
        return error(404, "resource_not_found", f"{method} {path} is not implemented by the fake")

    def _put_data(self, keys: list[str], body: bytes) -> Answer:
        try:
            value = json.loads(body)
        except ValueError as exc:
            return error(400, "invalid_parameter", f"body contains malformed JSON: {exc}")
        data = json.loads(json.dumps(self.data))
        node = data
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
        return self._replace(self.modules, data) or (204, b"")

    def _replace(self, modules: dict[str, str], data: dict[str, Any]) -> Answer | None:
        """Compile ``modules`` with ``data``; keep them, or answer OPA's 400 and keep the old ones."""
        engine = regorus.Engine()
        for name, raw in modules.items():
            try:
                engine.add_policy(name, raw)
            except Exception as exc:  # noqa: BLE001 - regorus raises plain RuntimeError/ValueError
                return _compile_error("rego_parse_error", name, exc)
        engine.add_data_json(json.dumps(data))
        try:
            engine.eval_query("true")  # regorus compiles on first evaluation
        except Exception as exc:  # noqa: BLE001
            return _compile_error("rego_compile_error", "", exc)
        self.modules, self.data, self._engine = modules, data, engine
        return None

    def _evaluate(self, keys: list[str], body: bytes) -> Answer:
        try:
            request = json.loads(body) if body else {}
        except ValueError as exc:
            return error(400, "invalid_parameter", f"body contains malformed input document: {exc}")
        engine = (self._engine or regorus.Engine()).clone()
        if "input" in request:
            engine.set_input_json(json.dumps(request["input"]))
        try:
            results = engine.eval_query("data" + "".join(f"[{json.dumps(key)}]" for key in keys))["result"]
        except Exception as exc:  # noqa: BLE001
            return error(500, "internal_error", clean_regorus_error(exc))
        return ok({"result": results[0]["expressions"][0]["value"]} if results else {})


def _compile_error(code: str, module: str, exc: Exception) -> Answer:
    message = clean_regorus_error(exc)
    where = re.search(r"--> ([^\n]*):(\d+):(\d+)", message)
    location = {"file": where[1], "row": int(where[2]), "col": int(where[3])} if where else {"file": module}
    detail = message.rsplit("error: ", 1)[-1]
    return error(400, "invalid_parameter", "error(s) occurred while compiling module(s)",
                 errors=[{"code": code, "message": detail, "location": location}])


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
