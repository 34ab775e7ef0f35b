"""Drills: both servers drop a connection whose request headers have not all arrived in time (issue 32).

Was: neither server had a read timeout; a connection with half-sent headers stayed open 75 s
(as long as the client liked). Now a client has ``header_timeout_s`` (10 s by default) from
the connection's opening, or from the first byte of a later request, to send the headers
(:mod:`agl_trainer.http.header_timeout`). The drills use real sockets on 127.0.0.1.
"""

from __future__ import annotations

import select
import socket
import time

import httpx
import pytest

from agl_trainer.http import DEFAULT_HEADER_TIMEOUT_S, BackgroundServer
from tests.conftest import free_port, read_asgi_body
from tests.reliability.conftest import StoreProcess
from tests.reliability.targets import gateway_target, store_target

HALF_A_HEAD = b"POST /v1/spans HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: applic"
BOUND_S = 0.3
"""The bound in the drills that set their own."""


def _closed_after(sock: socket.socket, wait_s: float) -> float | None:
    """Seconds until the server closed ``sock`` (EOF or reset), None if it was still open after ``wait_s``."""
    started = time.monotonic()
    sock.setblocking(False)
    while (left := started + wait_s - time.monotonic()) > 0:
        if select.select([sock], [], [], left)[0]:
            try:
                if sock.recv(65536) == b"":
                    return time.monotonic() - started
            except ConnectionResetError:
                return time.monotonic() - started
    return None


def _half_head(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(HALF_A_HEAD)
    return sock


def test_both_servers_as_shipped_drop_a_connection_whose_headers_stall(tmp_path):
    with store_target(tmp_path) as (store, _), gateway_target(tmp_path) as (gateway, _gw):
        socks = {name: _half_head(target.port) for name, target in (("store", store), ("gateway", gateway))}
        try:
            waited = {name: _closed_after(sock, DEFAULT_HEADER_TIMEOUT_S + 5) for name, sock in socks.items()}
        finally:
            for sock in socks.values():
                sock.close()
        for name, after in waited.items():  # both waited on at once: the second's wait is shorter
            assert after is not None, (
                f"the {name} still held a half-sent request after {DEFAULT_HEADER_TIMEOUT_S + 5} s"
            )
        assert max(waited.values()) >= DEFAULT_HEADER_TIMEOUT_S - 1, waited  # not cut before its time either


async def _echo(scope, receive, send) -> None:
    """Answers a request with its body, read whole (however slowly it comes)."""
    if scope["type"] != "http":
        return
    body = await read_asgi_body(receive)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def _request(body: bytes) -> bytes:
    return b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def _answer(sock: socket.socket, body: bytes) -> None:
    sock.settimeout(5)
    got = b""
    while not got.endswith(body) or b"\r\n\r\n" not in got:
        chunk = sock.recv(65536)
        assert chunk, f"closed before the answer: {got!r}"
        got += chunk
    assert got.startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("loop, http", [("asyncio", "h11"), ("uvloop", "httptools")])
def test_the_bound_covers_the_headers_alone_under_both_of_uvicorn_s_protocols(loop, http):
    with BackgroundServer(_echo, loop=loop, http=http, header_timeout_s=BOUND_S, timeout_keep_alive=5) as server:
        # half a head, then nothing: closed at the bound
        with _half_head(server.port) as sock:
            after = _closed_after(sock, BOUND_S + 3)
            assert after is not None and after >= BOUND_S * 0.8, after
        # connected, nothing sent: closed too
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            assert _closed_after(sock, BOUND_S + 3) is not None
        # a head trickled a byte at a time: the bound is not reset by each byte
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            started, closed_at = time.monotonic(), None
            for byte in HALF_A_HEAD * 10:
                try:
                    sock.send(bytes([byte]))
                except OSError:
                    closed_at = time.monotonic() - started
                    break
                time.sleep(0.02)
            assert closed_at is not None and closed_at < BOUND_S + 2, closed_at
        # a kept-alive connection idle for longer than the bound serves its next request
        # (the wait between requests is the keep-alive timeout's), and a slow body is not cut
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(_request(b"first"))
            _answer(sock, b"first")
            time.sleep(BOUND_S * 2)
            sock.sendall(_request(b"second"))
            _answer(sock, b"second")
            head, body = _request(b"slow body").split(b"\r\n\r\n")
            sock.sendall(head + b"\r\n\r\n" + body[:4])
            time.sleep(BOUND_S * 2)
            sock.sendall(body[4:])
            _answer(sock, b"slow body")
            # and the next request's head, half sent, is bound again from its first byte
            sock.sendall(HALF_A_HEAD)
            assert _closed_after(sock, BOUND_S + 3) is not None
        # a head begun while the connection's timer is still set for an earlier one (a connection keeps
        # one timer) is bound from its own first byte: neither cut at the earlier one's bound nor kept
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(_request(b"quick"))
            _answer(sock, b"quick")
            time.sleep(BOUND_S * 0.6)
            sock.sendall(HALF_A_HEAD)
            after = _closed_after(sock, BOUND_S + 3)
            assert after is not None and BOUND_S * 0.8 <= after < BOUND_S + 2, after


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "10"])
def test_a_bound_that_is_not_a_positive_number_of_seconds_is_refused_naming_it(bad, tmp_path):
    with pytest.raises(ValueError, match="header_timeout_s"):
        BackgroundServer(_echo, header_timeout_s=bad)
    from agl.store.sqlite import SqliteStore
    from agl_trainer.gateway import Gateway

    with SqliteStore(tmp_path / "s.db") as store, pytest.raises(ValueError, match="header_timeout_s"):
        Gateway(store, ["http://127.0.0.1:9/v1"], header_timeout_s=bad)


def test_agl_store_serve_takes_the_bound_from_its_flag(tmp_path):
    token = tmp_path / "token"
    token.write_text("drill-token\n")
    server = StoreProcess(tmp_path / "agl.db", free_port(), token, "--header-timeout", str(BOUND_S)).start()
    try:
        with _half_head(server.port) as sock:
            after = _closed_after(sock, BOUND_S + 5)
            assert after is not None, "agl store serve still held a half-sent request"
        answer = httpx.get(f"{server.url}/v1/stats", headers={"Authorization": "Bearer drill-token"}, timeout=10)
        assert answer.status_code == 200, answer.text
    finally:
        server.stop()
