"""The gateway's client for engine replicas: a small keep-alive HTTP/1.1 client on asyncio streams.

The gateway sends every request to an engine on the same host or network, so it needs
little of a general HTTP client: JSON bodies with a Content-Length, answers with a
Content-Length, chunked (streaming) or running to the connection's end, keep-alive
connections in a pool per replica (:class:`ConnectionPool`), no proxy lookup, no content
decoding (bodies pass through as the engine sent them), no timeout but the connect one (a
generation takes as long as it takes). A body is read at once (:meth:`UpstreamResponse.read`)
or streamed (:meth:`UpstreamResponse.iter_chunks`, the engine's event stream, parsed by
httpx-sse in :mod:`agl_trainer.gateway.sse`); :meth:`UpstreamResponse.aclose` before the end
closes the connection, so the engine sees the client go and frees the slot. A connection
idle longer than :data:`KEEPALIVE_S` is closed rather than reused, and a request sent on a
kept-alive connection that turns out closed before any answer came is sent once more on a
fresh one (the engine never read it). A failure to reach the replica or a connection dropped
mid-answer is :class:`UpstreamConnectError`, a :class:`~agl.errors.Transient` the router
retries on another replica.

Why not aiohttp (the client here for a while) or httpx: measured with the whole gateway.
``python -m tests.benchmarks.bench_gateway_ab --other <checkout>`` runs this checkout's
gateway and another's in turns (fresh processes each turn, the same fake engine and load
generator). On the shared 2-core host, 2026-11-29, against the same code with the aiohttp
client (one ``ClientSession`` per replica on a ``TCPConnector`` with no limit and 4 s
keep-alive, ``trust_env=False``, no decompression, fixed session headers instead of
``skip_auto_headers``, bodies read with ``read()``, uvloop under both):
three rounds (load average 0.9 at the start, 3.8 at the end), medians: at 1 / 16 / 64 clients
the gateway with this client used 0.52 / 0.45 / 0.43 ms of CPU per call against aiohttp's 0.69 /
0.59 / 0.65 ms (0.67-0.76x), made 1055 / 1233 / 1596 calls/s against 626 / 907 / 1033
(1.36-1.69x), and added 0.63 ms p50 at 1 client against 0.74 ms. The clients alone, POSTing to
the fake engine from 16 tasks in one process (three rounds each): 37-55 us of CPU a request for
this client, 90-101 us for aiohttp as the gateway had it, 78-139 us with aiohttp's remaining
levers too (``Content-Type`` on the session, no per-request headers, the DNS cache kept, no
cleanup of closed TLS transports): no setting of aiohttp's closes the gap. This is the client
the gateway had at 28dbf9d, with what was added since: the keep-alive limit, a retry of a POST
on a stale connection only before any answer came, :class:`UpstreamConnectError` transient, a
pool that lets answers being read finish when it closes. Against 28dbf9d's whole gateway in
the same script (seven rounds in two runs, load average 11-17, so the calls/s of any one turn
swing 2-4x with the host; CPU per call is the steadier figure), medians: calls/s 1175 / 790
against 977 / 550 at 16 / 64 clients, CPU per call 0.99x / 1.13x / 1.01x at 1 / 16 / 64
clients, added p50 at one client 0.506 ms against 0.482 ms. The CPU still above 28dbf9d's is
spent outside this client (py-spy, GIL samples over the same 6,000 calls at 16 clients, this
code against 28dbf9d's: the request checked against the pydantic request model, the LLM call
record's field checks, the store writer's inserts, the header-timeout protocol; this client's
share is unchanged). The request model and the header timer have since been taken off the common
path (:mod:`agl_trainer.gateway.plain_chat`, :mod:`agl_trainer.http.header_timeout`; figures in
:mod:`agl_trainer.gateway.app`).
httpx was further behind still when the gateway last tried it (+0.32-0.34 ms p50 for the
engine alone against aiohttp's +0.06 ms, 423 against 15.5k calls/s at 64 clients).
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from agl.errors import Transient

KEEPALIVE_S = 4.0
"""How long an idle connection is kept: under uvicorn's 5 s (vLLM's server), so the gateway drops it first."""
_READ_LIMIT = 1 << 24  # the longest header block or chunk-size line accepted
_DROPPED = (ConnectionError, asyncio.IncompleteReadError)


class UpstreamConnectError(Transient, ConnectionError):
    """The replica could not be reached (nothing was sent), or dropped the connection."""


@dataclass(slots=True)
class Endpoint:
    """Where one replica listens: ``http://host:port/base``."""

    url: str
    host: str
    port: int
    base_path: str
    tls: bool

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream {url!r}: expected http://host:port/v1")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(url.rstrip("/"), parts.hostname, port, parts.path, parts.scheme == "https")


class _Conn:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self, now: float) -> bool:
        return now - self.idle_since < KEEPALIVE_S and not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


class UpstreamResponse:
    """An answer from a replica: status, lower-cased headers, and a body read at once or streamed."""

    __slots__ = ("_body", "_chunked", "_conn", "_length", "_pool", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], conn: _Conn, pool: ConnectionPool):
        self.status = status
        self.headers = headers
        self._conn: _Conn | None = conn
        self._pool = pool
        self._chunked = "chunked" in headers.get("transfer-encoding", "")
        length = headers.get("content-length")
        self._length = int(length) if length is not None and not self._chunked else None
        self._body: bytes | None = None

    async def read(self) -> bytes:
        """The whole body (read once, then kept)."""
        if self._body is None:
            if self._length is None:
                self._body = b"".join([chunk async for chunk in self.iter_chunks()])
            else:
                self._body = await self._read_exactly()
        return self._body

    async def _read_exactly(self) -> bytes:
        try:
            body = await self._conn.reader.readexactly(self._length) if self._length else b""
        except _DROPPED as exc:
            raise self._cut_short() from exc
        except BaseException:  # cancelled (the client went away): the engine sees the connection close
            self.aclose()
            raise
        self._finish()
        return body

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        reader = self._conn.reader
        try:
            if self._chunked:
                while size := int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16):
                    yield (await reader.readexactly(size + 2))[:-2]
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers
            elif self._length is not None:
                left = self._length
                while left:
                    data = await reader.read(min(left, 1 << 16))
                    if not data:
                        raise asyncio.IncompleteReadError(b"", left)
                    left -= len(data)
                    yield data
            else:  # no framing: the body runs to the end of the connection
                self._length = -1
                while data := await reader.read(1 << 16):
                    yield data
        except _DROPPED as exc:
            raise self._cut_short() from exc
        except BaseException:
            self.aclose()
            raise
        self._finish()

    def _cut_short(self) -> UpstreamConnectError:
        self.aclose()
        return UpstreamConnectError(f"{self._pool.endpoint.url} closed the connection in the middle of its answer")

    def _finish(self) -> None:
        """The body was read to its end: the connection goes back to the pool (or is closed)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            reusable = self._length != -1 and self.headers.get("connection", "").lower() != "close"
            self._pool.release(conn, reusable)

    def aclose(self) -> None:
        """Give up on the rest of the body; the connection is closed, not reused (no-op once read)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.release(conn, False)


class ConnectionPool:
    """Keep-alive connections to one replica."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        connect_timeout_s: float = 5.0,
        max_idle: int = 1024,
        headers: dict[str, str] | None = None,
    ):
        self.endpoint = endpoint
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle
        self._idle: list[_Conn] = []
        extra = "".join(f"{k}: {v}\r\n" for k, v in {"User-Agent": "agl-gateway", **(headers or {})}.items())
        self._head = f"Host: {endpoint.host}:{endpoint.port}\r\n{extra}"
        self._closing = False

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> UpstreamResponse:
        """Send a request for ``base_path + path`` and read the status line and headers.

        ``headers`` go with this request only, after the pool's own. A kept-alive connection the
        replica closed meanwhile is replaced, and the request sent once more; a replica that
        cannot be reached raises :class:`UpstreamConnectError`.
        """
        if self._closing:
            raise UpstreamConnectError(f"{self.endpoint.url}: the replica was removed from the gateway")
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()) if headers else ""
        head = (
            f"{method} {self.endpoint.base_path}{path} HTTP/1.1\r\n{self._head}{extra}"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body) if body else 0}\r\n\r\n"
        ).encode("latin-1")
        payload = head + body if body else head
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.usable(now):
                conn.close()
                continue
            try:
                return await self._exchange(conn, payload)
            except _DROPPED:  # a stale keep-alive connection: once more on a fresh one
                conn.close()
                break
            except BaseException:  # cancelled (the client went away): the engine sees the connection close
                conn.close()
                raise
        conn = await self._connect()
        try:
            return await self._exchange(conn, payload)
        except _DROPPED as exc:
            conn.close()
            raise UpstreamConnectError(f"{self.endpoint.url} dropped the connection: {exc}") from exc
        except BaseException:
            conn.close()
            raise

    async def _connect(self) -> _Conn:
        ctx = _ssl.create_default_context() if self.endpoint.tls else None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.endpoint.host, self.endpoint.port, ssl=ctx, limit=_READ_LIMIT),
                self.connect_timeout_s,
            )
        except (TimeoutError, OSError) as exc:
            raise UpstreamConnectError(f"cannot reach {self.endpoint.url}: {exc or type(exc).__name__}") from exc
        return _Conn(reader, writer)

    async def _exchange(self, conn: _Conn, payload: bytes) -> UpstreamResponse:
        conn.writer.write(payload)
        head = await conn.reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].split(b"\r\n")
        try:
            status = int(lines[0].split(b" ", 2)[1])
        except (IndexError, ValueError):
            conn.close()
            raise UpstreamConnectError(f"{self.endpoint.url} answered no HTTP status line: {lines[0][:80]!r}") from None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        return UpstreamResponse(status, headers, conn, self)

    def release(self, conn: _Conn, reusable: bool) -> None:
        """An answer is done with its connection: kept for the next request, or closed."""
        if not reusable or self._closing or len(self._idle) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    async def close(self) -> None:
        """Close the idle connections and refuse new requests; answers being read finish first
        (a replica dropped meanwhile), their connections closed as they end."""
        self._closing = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
