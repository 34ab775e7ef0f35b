"""One checkout's gateway driven in-process: the child process of ``bench_gateway_inproc``.

Run as a script (``python -P gateway_inproc_child.py``) with the measured checkout's sources
first on ``PYTHONPATH``; it imports nothing from ``tests`` (the checkout's own ``tests`` may
differ), only the standard library and that checkout's ``agl`` / ``agl_trainer``. It reads its
settings as JSON on stdin (``body``, ``answer``, ``models``, ``token``, ``requests``,
``concurrency``, ``repeats``, ``warmup``) and prints one JSON line::

    {"process_us": [...], "loop_thread_us": [...], "gateway": "<the agl_trainer.gateway imported>"}

(CPU microseconds per request, one figure per repeat.)

The gateway is the checkout's real :class:`~agl_trainer.gateway.Gateway` over a real SQLite
store, started as in production (its event loop thread and store writer thread); its ASGI
app is then called on that loop, ``concurrency`` requests at a time, with ASGI messages built
here instead of bytes on a socket. The one stand-in is the engine: each replica's connection
pool (``Replica.pool``) is replaced by :class:`CannedEngine`, which answers ``GET /models``
and ``POST /chat/completions`` with canned bytes, so the engine, the one part not measured,
costs nothing. Reaching the serving loop reads a private attribute (``Gateway._loop`` up to
28dbf9d, ``Gateway._server.loop`` since).
"""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import agl_trainer.gateway
from agl.credentials import RolloutKeys
from agl.store.sqlite import SqliteStore
from agl_trainer.gateway import Gateway


class CannedResponse:
    """What a replica's connection pool returns: status, headers, the whole body."""

    status = 200

    def __init__(self, body: bytes):
        self._body = body
        self.headers = {"content-type": "application/json", "content-length": str(len(body))}

    async def read(self) -> bytes:
        return self._body

    def aclose(self) -> None:
        """Nothing to give back: there is no connection."""


class CannedEngine:
    """Stands in for a replica's ``ConnectionPool``: the engine's answers, canned (the mock for the engine)."""

    def __init__(self, answer: bytes, models: bytes):
        self._by_path = {("GET", "/models"): models, ("POST", "/chat/completions"): answer}

    async def request(self, method: str, path: str, body: bytes | None = None, *args: Any, **kwargs: Any):
        try:
            return CannedResponse(self._by_path[(method, path)])
        except KeyError:
            raise ValueError(f"the canned engine has no answer to {method} {path}") from None

    async def close(self) -> None:
        """Nothing to close."""


def _scope(token: str, body: bytes) -> dict[str, Any]:
    headers = [
        (b"host", b"127.0.0.1:8088"),
        (b"authorization", f"Bearer {token}".encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"user-agent", b"bench"),
    ]
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "server": ("127.0.0.1", 8088),
        "client": ("127.0.0.1", 5555),
        "state": {},
    }


async def _one(app: Any, scope: dict[str, Any], body: bytes, never: asyncio.Future) -> None:
    """One request through the ASGI app, as a server hands it over; fails on anything but a 200."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await never  # the client stays connected

    out: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        out.append(message)

    await app(dict(scope, headers=list(scope["headers"]), state={}), receive, send)
    if out[0]["status"] != 200:
        raise RuntimeError(f"the gateway answered {out[0]['status']}: {out[1:]!r}"[:500])


async def _load(app: Any, scope: dict[str, Any], body: bytes, requests: int, concurrency: int) -> float:
    """``requests`` requests, ``concurrency`` at a time; the loop thread's CPU seconds."""
    never = asyncio.get_running_loop().create_future()
    left = requests

    async def client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await _one(app, scope, body, never)

    t0 = time.thread_time()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return time.thread_time() - t0


def measure(settings: dict[str, Any]) -> dict[str, list[float]]:
    """Start the gateway, warm it up, then time each repeat: CPU microseconds per request."""
    body, token = settings["body"].encode(), settings["token"]
    n, concurrency = settings["requests"], settings["concurrency"]
    tmp = tempfile.mkdtemp(prefix="agl-bench-inproc-")
    store = SqliteStore(str(Path(tmp) / "agl.db"))
    gw = Gateway(store, ["http://127.0.0.1:9/v1"], token=token, keys=RolloutKeys.generate(), max_in_flight=100_000)
    for replica in gw.router.replicas:
        replica.pool = CannedEngine(settings["answer"].encode(), settings["models"].encode())
    gw.start()
    gc.freeze()  # as `agl gateway serve` does once started (since issue 46); done for both checkouts
    loop = getattr(gw, "_loop", None) or gw._server.loop
    scope = _scope(token, body)

    def run(k: int) -> float:
        return asyncio.run_coroutine_threadsafe(_load(gw.app, scope, body, k, concurrency), loop).result()

    process_us, thread_us = [], []
    try:
        run(settings["warmup"])
        gw.flush()
        for _ in range(settings["repeats"]):
            t0 = time.process_time()
            thread_s = run(n)
            gw.flush()  # the store writer's share is the process's too
            process_us.append((time.process_time() - t0) / n * 1e6)
            thread_us.append(thread_s / n * 1e6)
    finally:
        gw.stop()
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"process_us": process_us, "loop_thread_us": thread_us, "gateway": agl_trainer.gateway.__file__}


if __name__ == "__main__":
    print(json.dumps(measure(json.load(sys.stdin))))
