"""The Prometheus exporter: a small HTTP/1.1 server on one thread of its own, off the event loop.

`GET /metrics` (also `HEAD`) answers the text exposition format; the `routes` given (the health endpoints
`/healthz` and `/readyz`, broker/health.py) answer JSON from a function called on this thread, without the
bearer token (an orchestrator's probe carries none, and they tell nothing a scrape would not); any other
path is 404, any other method 405.

Bounded: one thread whatever the number of clients (a selector over non-blocking sockets), at most
`max_connections` open connections (the next one gets 503 and is closed), requests up to
`max_request_bytes`, and a connection that sends no request or takes no bytes for `idle_seconds` is
closed. The rendering is shared: a scrape within `duty`-bounded distance of the last rendering gets that
body (gzip-compressed when asked), the next rendering waits until the thread has been idle for
(1 / duty - 1) times what the last one took (at least `min_cache_seconds`). So however many scrapers there
are, rendering takes at most `duty` of one core's time (10%), and the event loop keeps the GIL for the
rest; with few series the body is never more than a few milliseconds old.

Optionally over TLS (`tls`: an `ssl` context re-read when the certificate files change; handshakes are
non-blocking, in the same loop) and behind a bearer token (`bearer_token_file`, re-read when it changes):
a request without `Authorization: Bearer <token>`, or with another token, gets 401 with
`WWW-Authenticate: Bearer`, whatever its path, as Prometheus' `authorization` scrape setting expects.
Tokens are compared in constant time and never logged.
"""

from __future__ import annotations

import contextlib
import gzip
import hmac
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, disable_created_metrics, generate_latest

from ister import buildinfo
from ister.config import TlsFiles
from ister.errors import ConfigError
from ister.limits import (
    METRICS_IDLE_SECONDS,
    METRICS_MAX_CONNECTIONS,
    METRICS_MAX_REQUEST_BYTES,
    METRICS_MIN_CACHE_SECONDS,
    METRICS_RENDER_DUTY,
)
from ister.security.files import WatchedFiles
from ister.server.tls import ReloadingSslContext, is_loopback

log = logging.getLogger(__name__)

# No `<name>_created` series: they double what counters and histograms export and no dashboard reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]  # (untyped in prometheus_client)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"
METRICS_PATH = "/metrics"
# A path answered by a function of this thread: (HTTP status, JSON body). It must not block.
Route = Callable[[], tuple[int, bytes]]
_READ_CHUNK = 4096


def render_registry() -> bytes:
    return generate_latest(REGISTRY)


class BearerToken:
    """The token scrapes must send, from a file re-read when it changes (surrounding whitespace stripped)."""

    def __init__(self, path: str) -> None:
        self.watched = WatchedFiles([path])
        self._token = self._load()

    def _load(self) -> bytes:
        token = self.watched.read()[0].strip()
        if not token:
            raise ConfigError(f"security.metrics.bearer_token_file {self.watched.paths[0]} is empty")
        return token

    def check(self, authorization: str | None) -> str | None:
        """None when `authorization` carries the token, else what is wrong (for the 401)."""
        if self.watched.changed():
            try:
                self._token = self._load()
            except ConfigError as exc:
                log.error("metrics server: keeping the previous bearer token: %s", exc)
        if not authorization:
            return "missing"
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return "missing"
        presented = value.strip().encode("latin-1", "replace")
        return None if hmac.compare_digest(presented, self._token) else "invalid"


@dataclass(slots=True)
class _Conn:
    sock: socket.socket
    last_active: float
    inbox: bytearray = field(default_factory=bytearray)
    outbox: memoryview | None = None
    close_after: bool = False
    handshaking: bool = False  # a TLS connection whose handshake is not done


class MetricsServer:
    def __init__(
        self,
        host: str,
        port: int,
        render: Callable[[], bytes] = render_registry,
        *,
        max_connections: int = METRICS_MAX_CONNECTIONS,
        idle_seconds: float = METRICS_IDLE_SECONDS,
        max_request_bytes: int = METRICS_MAX_REQUEST_BYTES,
        duty: float = METRICS_RENDER_DUTY,
        min_cache_seconds: float = METRICS_MIN_CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        tls: ReloadingSslContext | None = None,
        bearer_token: BearerToken | None = None,
        routes: Mapping[str, Route] | None = None,
    ) -> None:
        self._render = render
        self._routes = dict(routes or {})
        self._tls = tls
        self._bearer = bearer_token
        self.max_connections = max_connections
        self.idle_seconds = idle_seconds
        self.max_request_bytes = max_request_bytes
        self.duty = duty
        self.min_cache_seconds = min_cache_seconds
        self._cache_for = min_cache_seconds  # how long the current body is served
        self._clock = clock
        self._listener = socket.create_server((host, port), backlog=64)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._conns: dict[int, _Conn] = {}
        self._stopping = False
        self._body: bytes = b""
        self._gzipped: bytes | None = None
        self._rendered_at: float | None = None
        self.renders = 0  # how many times the body was rendered (for tests and the benchmark)
        self._thread = threading.Thread(target=self._serve, name="ister-metrics", daemon=True)

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop serving, close every connection and the listening socket; waits for the thread."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(5.0)
        else:
            self._close_all()

    # -- the loop --------------------------------------------------------------------------------------------
    def _serve(self) -> None:
        try:
            while not self._stopping:
                for key, events in self._sel.select(self._next_timeout()):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(64)
                    else:
                        conn = self._conns.get(key.fd)
                        if conn is None:
                            continue
                        if conn.handshaking and not self._handshake(conn):
                            continue
                        if events & selectors.EVENT_READ or _pending(conn.sock):
                            self._read(conn)
                        if events & selectors.EVENT_WRITE and key.fd in self._conns:
                            self._write(conn)
                self._expire()
        except Exception:
            log.exception("metrics server failed; Prometheus scrapes are no longer answered")
        finally:
            self._close_all()

    def _next_timeout(self) -> float | None:
        if not self._conns:
            return None
        oldest = min(c.last_active for c in self._conns.values())
        return max(0.0, oldest + self.idle_seconds - self._clock())

    def _expire(self) -> None:
        now = self._clock()
        for conn in [c for c in self._conns.values() if now - c.last_active >= self.idle_seconds]:
            self._close(conn)

    def _accept(self) -> None:
        for _ in range(64):  # take what is waiting, without starving the open connections
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("metrics server: accept failed: %s", exc)
                return
            if len(self._conns) >= self.max_connections:
                # Over the limit: a short answer on a best-effort send (plaintext only), then close.
                with contextlib.suppress(OSError):
                    sock.setblocking(False)
                    if self._tls is None:
                        sock.send(_response(503, b"too many connections\n", "text/plain", close=True))
                sock.close()
                continue
            sock.setblocking(False)
            if self._tls is not None:
                try:
                    sock = self._tls.context().wrap_socket(
                        sock, server_side=True, do_handshake_on_connect=False
                    )
                except (ssl.SSLError, OSError) as exc:
                    log.warning("metrics server: TLS setup failed: %s", exc)
                    sock.close()
                    continue
            conn = _Conn(sock, self._clock(), handshaking=self._tls is not None)
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, None)

    def _handshake(self, conn: _Conn) -> bool:
        """Advance a TLS handshake; True once it is done (the connection then reads requests)."""
        assert isinstance(conn.sock, ssl.SSLSocket)
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._sel.modify(conn.sock, selectors.EVENT_READ, None)
            return False
        except ssl.SSLWantWriteError:
            self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, None)
            return False
        except (ssl.SSLError, OSError) as exc:
            log.debug("metrics server: TLS handshake failed: %s", exc)  # a plaintext scraper, a wrong CA
            self._close(conn)
            return False
        conn.handshaking = False
        conn.last_active = self._clock()
        self._sel.modify(conn.sock, selectors.EVENT_READ, None)
        return True

    def _read(self, conn: _Conn) -> None:
        while True:
            try:
                data = conn.sock.recv(_READ_CHUNK)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError:
                self._close(conn)
                return
            if not data:
                self._close(conn)
                return
            conn.last_active = self._clock()
            conn.inbox += data
            # TLS: bytes already decrypted wait in the SSL object, where the selector does not see them.
            if not _pending(conn.sock) or len(conn.inbox) > self.max_request_bytes:
                break
        if conn.outbox is None:
            self._handle(conn)
        elif len(conn.inbox) > self.max_request_bytes:
            self._close(conn)  # piling up requests while not reading the answers

    def _handle(self, conn: _Conn) -> None:
        """Answer the request waiting in the inbox, if a whole one is there."""
        end = conn.inbox.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.inbox) > self.max_request_bytes:
                self._send(conn, _response(431, b"request too large\n", "text/plain", close=True), True)
            return
        head = bytes(conn.inbox[:end]).decode("latin-1")
        del conn.inbox[: end + 4]
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self._send(conn, _response(400, b"bad request\n", "text/plain", close=True), True)
            return
        method, target, version = parts
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        connection = headers.get("connection", "").lower()
        close = "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection)
        if "content-length" in headers or "transfer-encoding" in headers:
            close = True  # a request with a body is not ours to parse: answer, then close
        path = target.split("?", 1)[0]
        route = self._routes.get(path)
        if route is not None and method in ("GET", "HEAD"):
            self._answer_route(conn, route, close, method == "HEAD")
            return
        if self._bearer is not None:
            wrong = self._bearer.check(headers.get("authorization"))
            if wrong is not None:
                body = b"unauthorized: send Authorization: Bearer <token>\n"
                challenge = 'Bearer realm="ister-metrics"'
                if wrong == "invalid":
                    challenge += ', error="invalid_token"'
                response = _response(401, body, "text/plain", close=close, challenge=challenge)
                self._send(conn, response, close)
                return
        if method not in ("GET", "HEAD"):
            self._send(conn, _response(405, b"method not allowed\n", "text/plain", close=close), close)
            return
        if path != METRICS_PATH:
            self._send(conn, _response(404, b"not found: try /metrics\n", "text/plain", close=close), close)
            return
        gzip_ok = "gzip" in headers.get("accept-encoding", "").lower()
        body = self._metrics(gzip_ok)
        response = _response(
            200, body, CONTENT_TYPE, close=close, gzipped=gzip_ok, head_only=method == "HEAD"
        )
        self._send(conn, response, close)

    def _answer_route(self, conn: _Conn, route: Route, close: bool, head_only: bool) -> None:
        try:
            status, body = route()
        except Exception:
            log.exception("metrics server: answering a health request failed")
            status, body = 503, b'{"status": "error", "reason": "the check failed; see the broker log"}\n'
        response = _response(status, body, JSON_CONTENT_TYPE, close=close, head_only=head_only)
        self._send(conn, response, close)

    def _metrics(self, gzipped: bool) -> bytes:
        now = self._clock()
        if self._rendered_at is None or now - self._rendered_at >= self._cache_for:
            try:
                self._body = self._render()
            except Exception:
                log.exception("metrics server: rendering the metrics failed")
                self._body = b"# rendering failed; see the broker log\n"
            self._gzipped = None
            self._rendered_at = self._clock()
            took = self._rendered_at - now
            self._cache_for = max(self.min_cache_seconds, took * (1 / self.duty - 1))
            self.renders += 1
        if not gzipped:
            return self._body
        if self._gzipped is None:
            self._gzipped = gzip.compress(self._body, compresslevel=5)
        return self._gzipped

    def _send(self, conn: _Conn, data: bytes, close: bool) -> None:
        conn.outbox = memoryview(data)
        conn.close_after = close
        self._write(conn)
        if conn.outbox is not None and conn.sock.fileno() in self._conns:
            self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, None)

    def _write(self, conn: _Conn) -> None:
        out = conn.outbox
        if out is None:
            return
        try:
            sent = conn.sock.send(out)
        except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            return  # TLS: retried with the same buffer, as OpenSSL requires
        except OSError:
            self._close(conn)
            return
        if sent:
            conn.last_active = self._clock()
        if sent < len(out):
            conn.outbox = out[sent:]
            return
        conn.outbox = None
        if conn.close_after:
            self._close(conn)
            return
        with contextlib.suppress(KeyError, ValueError):
            self._sel.modify(conn.sock, selectors.EVENT_READ, None)
        if conn.inbox:
            self._handle(conn)  # a pipelined request

    def _close(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if self._conns.pop(fd, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()

    def _close_all(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn)
        for sock in (self._listener, self._wake_r, self._wake_w):
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(sock)
            sock.close()
        self._sel.close()


def _pending(sock: socket.socket) -> bool:
    return isinstance(sock, ssl.SSLSocket) and sock.pending() > 0


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


def _response(
    status: int,
    body: bytes,
    content_type: str,
    *,
    close: bool,
    gzipped: bool = False,
    head_only: bool = False,
    challenge: str | None = None,
) -> bytes:
    headers = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        f"Connection: {'close' if close else 'keep-alive'}",
    ]
    if gzipped:
        headers.append("Content-Encoding: gzip")
    if status == 405:
        headers.append("Allow: GET, HEAD")
    if challenge is not None:
        headers.append(f"WWW-Authenticate: {challenge}")
    head = ("\r\n".join(headers) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body


def start_metrics_server(
    host: str,
    port: int,
    *,
    tls: TlsFiles | None = None,
    bearer_token_file: str | None = None,
    routes: Mapping[str, Route] | None = None,
) -> MetricsServer:
    """Bind (OSError when the address is taken) and start serving on a thread of its own, over TLS when
    `tls` names files, asking for the bearer token in `bearer_token_file` when set (ConfigError when the
    files cannot be used)."""
    context = ReloadingSslContext(tls, "prom_exporter") if tls is not None else None
    bearer = BearerToken(bearer_token_file) if bearer_token_file else None
    if bearer is not None and context is None and not is_loopback(host):
        log.warning(
            "SECURITY WARNING: the metrics endpoint %s:%d asks for a bearer token WITHOUT TLS: the token "
            "travels in cleartext (set security.tls for the metrics port)",
            host,
            port,
        )
    buildinfo.publish()
    try:
        server = MetricsServer(host, port, tls=context, bearer_token=bearer, routes=routes)
    except OSError as exc:
        raise OSError(f"cannot listen on {host}:{port} for metrics ({exc.strerror or exc})") from None
    return server.start()
