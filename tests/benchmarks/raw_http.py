"""A small keep-alive HTTP/1.1 client on asyncio streams: the benchmarks' load generator.

It does just what sending JSON requests to a local server needs (Content-Length bodies,
answers with a Content-Length or chunked, keep-alive connections in a pool), and so
costs a fraction of a general client's time per request: the load generator takes
little of the machine from the processes it measures. It was the gateway's engine
client until the gateway moved to aiohttp (``agl_trainer.gateway.upstream``), and
``bench_gateway --httpx --aiohttp`` still measures both libraries against it in the
same run. Not for use outside the benchmarks.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
from collections.abc import AsyncIterator

from agl_trainer.gateway.upstream import Endpoint

_READ_LIMIT = 1 << 24  # the longest header block or chunk-size line we accept


class UpstreamConnectError(ConnectionError):
    """The replica could not be reached (nothing was sent), or dropped the connection."""


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


class UpstreamResponse:
    """An answer from a replica: status, lower-cased headers, and a body read at once or streamed."""

    __slots__ = ("_body", "_chunked", "_conn", "_done", "_length", "_pool", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], conn: _Conn, pool: ConnectionPool):
        self.status = status
        self.headers = headers
        self._conn: _Conn | None = conn
        self._pool = pool
        self._chunked = "chunked" in headers.get("transfer-encoding", "")
        length = headers.get("content-length")
        self._length = int(length) if length is not None else None
        self._done = False
        self._body: bytes | None = None

    async def read(self) -> bytes:
        """The whole body (read once, then kept)."""
        if self._body is None:
            self._body = await self._read()
        return self._body

    async def _read(self) -> bytes:
        if self._length is not None:
            try:
                body = await self._conn.reader.readexactly(self._length) if self._length else b""
            except asyncio.IncompleteReadError as exc:
                self.aclose()
                raise UpstreamConnectError(
                    f"{self._pool.endpoint.url} closed the connection in the middle of its answer"
                ) from exc
            self._finish()
            return body
        return b"".join([chunk async for chunk in self.iter_chunks()])

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        reader = self._conn.reader
        try:
            if self._chunked:
                while True:
                    line = await reader.readuntil(b"\r\n")
                    size = int(line.split(b";", 1)[0], 16)
                    if size == 0:
                        while await reader.readuntil(b"\r\n") != b"\r\n":
                            pass
                        break
                    data = await reader.readexactly(size + 2)
                    yield data[:-2]
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
        except asyncio.IncompleteReadError as exc:
            self.aclose()
            raise UpstreamConnectError(
                f"{self._pool.endpoint.url} closed the connection in the middle of its answer"
            ) from exc
        except BaseException:
            self.aclose()
            raise
        self._finish()

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        conn, self._conn = self._conn, None
        if self._length == -1 or self.headers.get("connection", "").lower() == "close":
            conn.close()
        else:
            self._pool.release(conn)

    def aclose(self) -> None:
        """Give up on the rest of the body; the connection is closed, not reused."""
        if not self._done:
            self._done = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class ConnectionPool:
    """Keep-alive connections to one replica."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        connect_timeout_s: float = 5.0,
        max_idle: int = 256,
        headers: dict[str, str] | None = None,
    ):
        self.endpoint = endpoint
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle
        self._idle: list[_Conn] = []
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._host_header = f"Host: {endpoint.host}:{endpoint.port}\r\n{extra}"
        self._closed = False

    async def _connect(self) -> _Conn:
        ctx = _ssl.create_default_context() if self.endpoint.tls else None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.endpoint.host, self.endpoint.port, ssl=ctx, limit=_READ_LIMIT),
                self.connect_timeout_s,
            )
        except (TimeoutError, OSError) as exc:
            raise UpstreamConnectError(f"cannot connect to {self.endpoint.url}: {exc or type(exc).__name__}") from exc
        return _Conn(reader, writer)

    def release(self, conn: _Conn) -> None:
        if self._closed or len(self._idle) >= self.max_idle or not conn.usable():
            conn.close()
        else:
            self._idle.append(conn)

    async def request(
        self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json"
    ) -> UpstreamResponse:
        """Send a request for ``base_path + path`` and read the status line and headers.

        A pooled connection the replica closed meanwhile is retried once on a fresh one.
        """
        head = (
            f"{method} {self.endpoint.base_path}{path} HTTP/1.1\r\n{self._host_header}"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body) if body else 0}\r\n\r\n"
        ).encode("latin-1")
        payload = head + body if body else head
        while self._idle:
            conn = self._idle.pop()
            if not conn.usable():
                conn.close()
                continue
            try:
                return await self._exchange(conn, payload)
            except (ConnectionError, asyncio.IncompleteReadError):
                conn.close()  # stale keep-alive connection: try a fresh one
                break
            except BaseException:  # cancelled (the client went away): the engine sees the connection close
                conn.close()
                raise
        conn = await self._connect()
        try:
            return await self._exchange(conn, payload)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            conn.close()
            raise UpstreamConnectError(f"{self.endpoint.url} dropped the connection: {exc}") from exc
        except BaseException:
            conn.close()
            raise

    async def _exchange(self, conn: _Conn, payload: bytes) -> UpstreamResponse:
        conn.writer.write(payload)
        head = await conn.reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        return UpstreamResponse(status, headers, conn, self)

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
