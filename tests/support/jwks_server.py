"""A real HTTP server on 127.0.0.1 serving a JSON Web Key Set, counting its fetches; and keys to put in it.

Besides a slow server (``hold``) it can be a dripping one (``drip``): it answers 200 at once and then sends
the body one byte at a time, each well within any read timeout, so only a bound on the whole fetch ends it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

__all__ = ["JwksServer", "SigningKey", "jwks_server"]

PATH = "/.well-known/jwks.json"


@dataclass(frozen=True)
class SigningKey:
    """An RSA key named ``kid``: its public JWK for the set, and tokens it signs."""

    kid: str
    private: rsa.RSAPrivateKey = field(default_factory=lambda: rsa.generate_private_key(65537, 2048))
    alg: str | None = "RS256"

    @property
    def jwk(self) -> dict[str, Any]:
        key = RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        return {**key, "kid": self.kid, "use": "sig", **({"alg": self.alg} if self.alg else {})}

    def sign(self, claims: dict[str, Any], *, algorithm: str = "RS256", kid: str | None = None) -> str:
        return jwt.encode(claims, self.private, algorithm=algorithm, headers={"kid": kid or self.kid})


@dataclass
class JwksServer:
    """What ``PATH`` answers: the ``keys`` as a set, or ``body`` with ``status`` instead; ``hold`` makes each
    request wait until it is set (a slow server); with ``drip`` (seconds) a request answered meanwhile gets
    its status and headers at once, then one byte of its body each ``drip`` seconds until the server stops,
    whatever ``drip`` becomes later (a recovered server drips on the connections it had).
    ``fetches`` counts the requests."""

    url: str
    keys: list[SigningKey] = field(default_factory=list)
    status: int = 200
    body: bytes | None = None
    hold: threading.Event | None = None
    drip: float | None = None
    fetches: int = 0
    agents: list[str] = field(default_factory=list)


@contextmanager
def jwks_server() -> Iterator[JwksServer]:
    """Serve a ``JwksServer`` until the block ends (a held request is let go then)."""
    state = JwksServer(url="")
    stopping = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.fetches += 1
            state.agents.append(self.headers.get("User-Agent", ""))
            if state.hold is not None:
                state.hold.wait(30)
            body = state.body if state.body is not None else json.dumps(
                {"keys": [key.jwk for key in state.keys]}).encode()
            self.send_response(state.status if self.path == PATH else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if state.drip is None:
                self.wfile.write(body)
                return
            drip = state.drip
            try:
                for byte in body:
                    self.wfile.write(bytes([byte]))
                    if stopping.wait(drip):
                        return
            except OSError:
                return  # the client gave up on it

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}{PATH}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        stopping.set()
        if state.hold is not None:
            state.hold.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)

