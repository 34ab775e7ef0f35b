"""agl_trainer.http.BackgroundServer: the one "uvicorn in a thread" of the store server, the gateway and the engines."""

from __future__ import annotations

import socket
import threading

import httpx
import pytest

from agl_trainer.http import BackgroundServer


def _named(name: bytes):
    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": name})

    return app


def test_several_apps_listen_on_their_own_ports_from_one_loop_and_stop():
    server = BackgroundServer([_named(b"a"), _named(b"b")], name="two-apps")
    assert len(set(server.ports)) == 2 and server.url == server.urls[0]  # bound before the start
    with server:
        assert [httpx.get(url, timeout=10).text for url in server.urls] == ["a", "b"]
        assert server.call(_loop_thread_name(), timeout_s=10) == "two-apps"
    assert not server.running
    for port in server.ports:  # the sockets are closed: nothing listens any more
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()


async def _loop_thread_name() -> str:
    return threading.current_thread().name


def test_a_failed_setup_is_the_start_error_and_teardown_runs_after_serving():
    async def broken() -> None:
        raise ConnectionError("replicas unreachable")

    server = BackgroundServer(_named(b"x"), name="broken", setup=broken)
    with pytest.raises(RuntimeError, match="broken did not start: replicas unreachable"):
        server.start(timeout_s=10)
    assert not server.running

    torn_down = threading.Event()

    async def teardown() -> None:
        torn_down.set()

    with BackgroundServer(_named(b"x"), teardown=teardown) as server:
        assert httpx.get(server.url, timeout=10).text == "x"
        assert not torn_down.is_set()
    assert torn_down.is_set()


def test_a_port_in_use_is_refused_when_the_server_is_made():
    with BackgroundServer(_named(b"x")) as first:
        with pytest.raises(OSError):
            BackgroundServer(_named(b"y"), port=first.port)
        with pytest.raises(RuntimeError, match="is not started"):
            BackgroundServer(_named(b"z")).call(_loop_thread_name())
