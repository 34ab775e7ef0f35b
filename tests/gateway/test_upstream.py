"""The gateway's engine client against a real socket server that misbehaves on purpose."""

from __future__ import annotations

import asyncio

import pytest

from agl.retry import is_transient
from agl_trainer.gateway import upstream
from agl_trainer.gateway.upstream import ConnectionPool, Endpoint, UpstreamConnectError
from tests.conftest import free_port

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class ClosingServer:
    """Answers the first request of each connection; drops a connection at its second request
    (as a server that closes an idle keep-alive connection just as the request arrives)."""

    def __init__(self):
        self.connections = 0
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        for answered in (True, False):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = next(
                (
                    int(v)
                    for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
                    if k.lower() == b"content-length"
                ),
                0,
            )
            await reader.readexactly(length)
            self.requests += 1
            if not answered:
                break
            writer.write(OK)
            await writer.drain()
        writer.close()


def test_a_post_on_a_kept_alive_connection_the_engine_dropped_goes_once_more_on_a_fresh_one():
    async def scenario() -> None:
        server = ClosingServer()
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = listening.sockets[0].getsockname()[1]
        pool = ConnectionPool(Endpoint.parse(f"http://127.0.0.1:{port}/v1"))
        try:
            for _ in range(2):
                resp = await pool.request("POST", "/chat/completions", b'{"a":1}')
                assert resp.status == 200 and await resp.read() == b"{}"
        finally:
            await pool.close()
            listening.close()
        # the second POST went out on the kept-alive connection, was dropped, and was sent again
        assert server.requests == 3 and server.connections == 2

    asyncio.run(scenario())


def test_an_unreachable_replica_is_a_transient_upstream_connect_error():
    async def scenario() -> None:
        pool = ConnectionPool(Endpoint.parse(f"http://127.0.0.1:{free_port()}/v1"), connect_timeout_s=2)
        try:
            with pytest.raises(UpstreamConnectError, match="cannot reach") as info:
                await pool.request("POST", "/chat/completions", b"{}")
        finally:
            await pool.close()
        assert is_transient(info.value) and isinstance(info.value, ConnectionError)

    asyncio.run(scenario())


def test_closing_a_pool_lets_an_answer_being_read_finish_then_refuses_new_requests():
    async def scenario() -> None:
        go_on = asyncio.Event()

        async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234")
            await writer.drain()
            await go_on.wait()
            writer.write(b"56789")
            await writer.drain()
            writer.close()

        listening = await asyncio.start_server(slow, "127.0.0.1", 0)
        pool = ConnectionPool(Endpoint.parse(f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}/v1"))
        try:
            resp = await pool.request("GET", "/models")
            await pool.close()  # a replica dropped by set_upstreams while its answer is on its way
            go_on.set()
            assert await resp.read() == b"0123456789"
            with pytest.raises(UpstreamConnectError, match="removed from the gateway"):
                await pool.request("GET", "/models")
        finally:
            listening.close()

    asyncio.run(scenario())


class CountingServer:
    """Answers every request on a connection, counting connections and requests."""

    def __init__(self):
        self.connections = 0
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            self.requests += 1
            writer.write(OK)
            await writer.drain()
        writer.close()


def test_a_connection_is_reused_while_fresh_and_replaced_once_idle_past_the_keepalive(monkeypatch):
    """Kept-alive connections carry the next requests; one idle longer than ``KEEPALIVE_S`` (under
    the engine's own keep-alive, which would close it any moment) is closed, not reused."""
    monkeypatch.setattr(upstream, "KEEPALIVE_S", 0.2)

    async def scenario() -> None:
        server = CountingServer()
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        pool = ConnectionPool(Endpoint.parse(f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}/v1"))
        try:
            for _ in range(3):
                resp = await pool.request("GET", "/models")
                assert await resp.read() == b"{}"
            assert (server.connections, server.requests) == (1, 3)
            await asyncio.sleep(0.3)
            resp = await pool.request("GET", "/models")
            assert await resp.read() == b"{}"
            assert (server.connections, server.requests) == (2, 4)
        finally:
            await pool.close()
            listening.close()

    asyncio.run(scenario())
