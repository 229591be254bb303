"""A real HTTP server on 127.0.0.1 that serves one bundle with an ETag and answers 304 Not Modified.

With ``drip`` (seconds) it sends the status and headers at once, then one byte of the body each ``drip``
seconds until the server stops.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATH = "/bundles/toolbooth.tar.gz"


@dataclass
class BundleServer:
    """What the server serves at ``PATH``, and the ``If-None-Match`` and ``Authorization`` of each request."""

    url: str
    content: bytes = b""
    delay: float = 0.0
    drip: float | None = None
    seen: list[tuple[str | None, str | None]] = field(default_factory=list)

    @property
    def etag(self) -> str:
        return f'"{hashlib.sha256(self.content).hexdigest()[:16]}"'


@contextmanager
def bundle_server() -> Iterator[BundleServer]:
    """Serve ``BundleServer.content`` at ``PATH`` until the block ends."""
    state = BundleServer(url="")
    stopping = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.seen.append((self.headers.get("If-None-Match"), self.headers.get("Authorization")))
            time.sleep(state.delay)
            if self.path != PATH:
                self.send_error(404)
            elif self.headers.get("If-None-Match") == state.etag:
                self.send_response(304)
                self.send_header("ETag", state.etag)
                self.end_headers()
            else:
                self.send_response(200)
                self.send_header("Content-Type", "application/gzip")
                self.send_header("ETag", state.etag)
                self.send_header("Content-Length", str(len(state.content)))
                self.end_headers()
                self._body(state.content)

        def _body(self, content: bytes) -> None:
            if state.drip is None:
                self.wfile.write(content)
                return
            try:
                for byte in content:
                    self.wfile.write(bytes([byte]))
                    if stopping.wait(state.drip):
                        return
            except OSError:
                return  # the client gave up on it

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield state
    stopping.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join()
