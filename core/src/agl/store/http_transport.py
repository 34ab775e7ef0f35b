"""How :class:`~agl.store.http.HttpStore` reaches its server: the pooled ``httpx.Client``, and the
``http.client`` keep-alive connections it sends ``/v1/batch`` on (see :mod:`agl.store.http`)."""

from __future__ import annotations

import http.client
import socket
import threading
from urllib.parse import urlsplit

import httpx

KEEPALIVE_S = 4.0
"""How long the httpx client keeps an idle connection: under uvicorn's 5 s, so the client closes it first."""


def http_client(url: str, headers: dict[str, str], timeout_s: float, max_connections: int) -> httpx.Client:
    """The pooled HTTP/1.1 client: keep-alive connections, and a refused connect retried once by the transport.

    Proxies from the environment are not used: a store server is reached directly.
    """
    limits = httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections, keepalive_expiry=KEEPALIVE_S
    )
    return httpx.Client(
        base_url=url,
        headers=headers,
        timeout=httpx.Timeout(timeout_s),
        transport=httpx.HTTPTransport(limits=limits, retries=1),
        trust_env=False,
    )


class BatchConnections:
    """Keep-alive ``http.client`` connections for ``/v1/batch`` on ``http://`` servers (see the module docstring).

    A connection is taken for one request and put back after it; when the server
    has closed a kept-alive one, the request goes once more, at once, on a fresh
    connection. Failures raise :class:`httpx.TransportError`, so the caller retries
    them as it does httpx's.
    """

    def __init__(self, url: str, headers: dict[str, str], timeout_s: float, max_idle: int):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = parts.path.rstrip("/") + "/v1/batch"
        self.headers = {**headers, "Content-Type": "application/json"}
        self.timeout_s = timeout_s
        self.max_idle = max_idle
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def post(self, body: bytes, key: str) -> httpx.Response:
        """POST ``body`` with ``Idempotency-Key: key``; the answer, read in full."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is not None:
            try:
                return self._exchange(conn, body, key)
            except httpx.RemoteProtocolError:
                pass  # the server had closed this idle connection: once more on a fresh one
        return self._exchange(self._connect(), body, key)

    def _connect(self) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            conn.close()
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        return conn

    def _exchange(self, conn: http.client.HTTPConnection, body: bytes, key: str) -> httpx.Response:
        try:
            conn.request("POST", self.path, body=body, headers={**self.headers, "Idempotency-Key": key})
            answer = conn.getresponse()
            content = answer.read()
        except (http.client.RemoteDisconnected, ConnectionResetError, ConnectionAbortedError, BrokenPipeError) as exc:
            conn.close()
            raise httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}") from exc
        except TimeoutError as exc:
            conn.close()
            raise httpx.ReadTimeout(f"no answer in {self.timeout_s} s") from exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from exc
        self._put_back(conn, answer.will_close)
        return httpx.Response(answer.status, content=content)

    def _put_back(self, conn: http.client.HTTPConnection, will_close: bool) -> None:
        with self._lock:
            if not (will_close or self._closed or len(self._idle) >= self.max_idle):
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close the idle connections; one in use closes when it comes back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
