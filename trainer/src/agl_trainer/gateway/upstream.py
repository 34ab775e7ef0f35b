"""The gateway's client for engine replicas: one ``aiohttp.ClientSession`` per replica.

Each replica gets one session on a ``TCPConnector`` with keep-alive connections and no
limit of its own (the router bounds the requests in flight, ``--max-in-flight``), no
proxy lookup, no content decoding (bodies pass through as the engine sent them), and
no timeout but the connect one: a generation takes as long as it takes. A body is read
at once (:meth:`UpstreamResponse.read`) or streamed (:meth:`UpstreamResponse.iter_chunks`,
the engine's event stream, parsed by httpx-sse in :mod:`agl_trainer.gateway.sse`);
:meth:`UpstreamResponse.aclose` before the end closes the connection, so the engine sees
the client go and frees the slot. A failure to reach the replica or a connection dropped
mid-answer is :class:`UpstreamConnectError`, a :class:`~agl.errors.Transient` the router
retries on another replica. aiohttp sends a request once more on a fresh connection when
a kept-alive one turns out closed, but only for idempotent methods; this client does it for
the gateway's POSTs too, once, as the engine cannot have started on a request it never read.

Why aiohttp, and not httpx or a hand-written HTTP/1.1 client. ``python -m
tests.benchmarks.bench_gateway --httpx --aiohttp`` sends the same requests to the engine
alone through the hand-written client this module was until then (now the benchmarks'
load generator, ``tests/benchmarks/raw_http.py``), through httpx (one ``AsyncClient``,
tuned) and through this module, all in the same run. Eleven such runs on the shared
2-core host (2026-11-27, load average 3.7-18, so every absolute figure is well under
a quiet host's): aiohttp added +0.064-0.091 ms p50 at 1 client over the hand-written
client and made 1.5k-6.2k calls/s at 64 clients (the hand-written client: 4.9k-13.6k);
httpx added +0.46-0.61 ms and made 131-381 calls/s. Two more runs on the quiet host the
same day (load average 0.8): aiohttp +0.057-0.059 ms and 15.5k-16.2k calls/s, the
hand-written client 12.0k-18.1k, httpx +0.32-0.34 ms and 423-425 calls/s. The README's
targets (<= 1 ms added p50 at 1 client, >= 1.5k calls/s at 64) leave room for aiohttp
and not for httpx, so the gateway uses aiohttp rather than its own client. What it costs
the whole gateway, measured on the quiet host against the code before the switch, the
two taking turns (two turns each): added p50 +0.41 ms against +0.34-0.41 ms at 1 client,
2.6k-2.8k calls/s against 3.7k-3.9k at 64 clients (0.72x), inside both targets.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from agl.errors import Transient

KEEPALIVE_S = 4.0
"""How long an idle connection is kept: under uvicorn's 5 s (vLLM's server), so the gateway closes it first."""
_DROPPED = (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError)


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


class UpstreamResponse:
    """An answer from a replica: status, lower-cased headers, and a body read at once or streamed."""

    __slots__ = ("_body", "_done", "_pool", "_resp", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse, pool: ConnectionPool):
        self.status = resp.status
        self.headers = {name.lower(): value for name, value in resp.headers.items()}
        self._resp = resp
        self._pool = pool
        self._body: bytes | None = None
        self._done = False

    async def read(self) -> bytes:
        """The whole body (read once, then kept)."""
        if self._body is None:
            try:
                self._body = await self._resp.read()
            except _DROPPED as exc:
                raise self._cut_short() from exc
            except BaseException:  # cancelled (the client went away): the engine sees the connection close
                self.aclose()
                raise
            self._finish()
        return self._body

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
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
        """The body was read to its end: aiohttp has put the connection back in the pool."""
        if not self._done:
            self._done = True
            self._pool.finished()

    def aclose(self) -> None:
        """Give up on the rest of the body; the connection is closed, not reused (no-op once read)."""
        if not self._done:
            self._resp.close()
            self._done = True
            self._pool.finished()


class ConnectionPool:
    """Keep-alive connections to one replica: its ``aiohttp.ClientSession``, made on first use
    (inside the event loop that serves the gateway)."""

    def __init__(self, endpoint: Endpoint, *, connect_timeout_s: float = 5.0, headers: dict[str, str] | None = None):
        self.endpoint = endpoint
        self.connect_timeout_s = connect_timeout_s
        # Set here rather than through ``skip_auto_headers``, which costs aiohttp ~25 us a request.
        self.headers = {"User-Agent": "agl-gateway", "Accept-Encoding": "identity", **(headers or {})}
        self._session: aiohttp.ClientSession | None = None
        self._open = 0  # answers whose body is not read or closed yet
        self._closing = False
        self._closed: asyncio.Task | None = None

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
                auto_decompress=False,
                trust_env=False,
            )
        return self._session

    async def request(
        self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json"
    ) -> UpstreamResponse:
        """Send a request for ``base_path + path`` and read the status line and headers.

        A kept-alive connection the replica closed meanwhile is replaced, and the request sent
        once more; a replica that cannot be reached raises :class:`UpstreamConnectError`.
        """
        if self._closing:
            raise UpstreamConnectError(f"{self.endpoint.url}: the replica was removed from the gateway")
        url = self.endpoint.url + path
        headers = {"Content-Type": content_type}
        for last_try in (False, True):
            try:
                resp = await self._session_now().request(method, url, data=body, headers=headers)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if last_try or isinstance(exc, aiohttp.ClientConnectorError):
                    raise UpstreamConnectError(f"cannot reach {self.endpoint.url}: {exc}") from exc
                continue  # a stale keep-alive connection: once more on a fresh one
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise UpstreamConnectError(f"cannot reach {self.endpoint.url}: {exc or type(exc).__name__}") from exc
            self._open += 1
            return UpstreamResponse(resp, self)
        raise AssertionError("unreachable")

    def finished(self) -> None:
        """One answer is done with; the last one of a closing pool closes the session."""
        self._open -= 1
        if self._closing and not self._open and self._session is not None and self._closed is None:
            self._closed = asyncio.get_running_loop().create_task(self._session.close())

    async def close(self) -> None:
        """Close the connections; answers still being read finish first (a replica dropped meanwhile)."""
        self._closing = True
        if self._session is None or self._closed is not None or self._open:
            return  # nothing to close, closed already, or the last answer's finished() closes it
        self._closed = asyncio.ensure_future(self._session.close())
        await self._closed
