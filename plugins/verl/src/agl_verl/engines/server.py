"""The engine's HTTP face: an OpenAI-compatible Starlette app per replica, served by uvicorn.

Routes: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``,
``POST /v1/completions`` (plain JSON or SSE with ``"stream": true``). With an
``api_key`` every ``/v1`` route wants ``Authorization: Bearer <api_key>``.

A client that disconnects cancels its request: the generation leaves the batch at the
next decoding step, for plain requests (the handler polls for the disconnect while it
waits) and for streams (the wait for the next chunk races the same poll).

:class:`ServerThread` runs several apps (replicas) on one asyncio loop in one background
thread. Standalone::

    python -m agl_verl.engines.server --model PATH [--port 8000] [--engine-token-file PATH]

(the options of ``agl engine serve``: see :mod:`agl_verl.cli`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agl_verl.engines.protocol import RequestError, parse_chat, parse_completion
from agl_verl.engines.serving import Replica


def create_app(replica: Replica, *, api_key: str | None = None) -> Starlette:
    """The OpenAI-compatible app for one replica."""

    def authorized(request: Request) -> bool:
        if not api_key:
            return True
        header = request.headers.get("authorization", "")
        return hmac.compare_digest(header.encode(), f"Bearer {api_key}".encode())

    def error(exc: RequestError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    async def read_json(request: Request) -> Any:
        try:
            return json.loads(await request.body())
        except ValueError as exc:
            raise RequestError(None, f"the request body is not valid JSON: {exc}") from exc

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model_version": replica.slot.get()[1]})

    async def models(request: Request) -> Response:
        if not authorized(request):
            return error(RequestError(None, "missing or wrong bearer token", 401))
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": replica.model_name,
                        "object": "model",
                        "owned_by": "agl",
                        "max_model_len": replica.max_model_len,
                        "model_version": replica.slot.get()[1],
                    }
                ],
            }
        )

    async def chat(request: Request) -> Response:
        if not authorized(request):
            return error(RequestError(None, "missing or wrong bearer token", 401))
        try:
            req = parse_chat(await read_json(request))
            if req.sampling.stream:
                stream = _until_disconnected(request, await replica.chat_stream(req))
                return StreamingResponse(stream, media_type="text/event-stream")
            return await _answer_unless_disconnected(request, replica.chat(req))
        except RequestError as exc:
            return error(exc)

    async def completions(request: Request) -> Response:
        if not authorized(request):
            return error(RequestError(None, "missing or wrong bearer token", 401))
        try:
            req = parse_completion(await read_json(request), replica.vocab_size)
            if req.sampling.stream:
                stream = _until_disconnected(request, await replica.completion_stream(req))
                return StreamingResponse(stream, media_type="text/event-stream")
            return await _answer_unless_disconnected(request, replica.completion(req))
        except RequestError as exc:
            return error(exc)

    async def server_error(request: Request, exc: Exception) -> Response:
        return JSONResponse(RequestError(None, f"engine error: {type(exc).__name__}: {exc}", 500).body(), 500)

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
        ],
        exception_handlers={Exception: server_error},
    )


#: how often a waiting handler checks whether its client went away
DISCONNECT_POLL_S = 0.05


async def _answer_unless_disconnected(request: Request, work: Awaitable[dict]) -> Response:
    """The JSON answer of ``work``; cancels it (and answers 499) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return JSONResponse(task.result())
            if await request.is_disconnected():
                return Response(status_code=499)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _until_disconnected(request: Request, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """Relay ``chunks``; stop (cancelling the generation) as soon as the client disconnects."""
    iterator = aiter(chunks)
    pending: asyncio.Future | None = None
    try:
        while True:
            pending = asyncio.ensure_future(anext(iterator))
            while not pending.done():
                await asyncio.wait({pending}, timeout=DISCONNECT_POLL_S)
                if not pending.done() and await request.is_disconnected():
                    return
            try:
                chunk = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield chunk
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(RuntimeError):
                await aclose()


class ServerThread:
    """Serves apps with uvicorn on one event loop in a daemon thread."""

    def __init__(self, apps: list[Starlette], *, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.host = host
        self._sockets = []
        self._servers = []
        for k, app in enumerate(apps):
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port + k if port else 0))
            self._sockets.append(sock)
            config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5)
            self._servers.append(uvicorn.Server(config))
        self.ports = [s.getsockname()[1] for s in self._sockets]
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def base_urls(self) -> list[str]:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return [f"http://{host}:{p}/v1" for p in self.ports]

    def start(self, timeout: float = 30.0) -> list[str]:
        """Start serving; returns the base URLs once every server accepts connections."""
        self._thread = threading.Thread(target=self._main, name="agl-engine-http", daemon=True)
        self._thread.start()
        end = time.monotonic() + timeout
        while not all(s.started for s in self._servers):
            if self._error is not None:
                raise RuntimeError(f"engine server failed to start: {self._error}") from self._error
            if time.monotonic() > end or not self._thread.is_alive():
                raise RuntimeError("engine server did not start in time")
            time.sleep(0.01)
        return self.base_urls

    def _main(self) -> None:
        async def serve_all() -> None:
            await asyncio.gather(
                *(srv.serve(sockets=[sock]) for srv, sock in zip(self._servers, self._sockets, strict=False))
            )

        try:
            asyncio.run(serve_all())
        except BaseException as exc:  # noqa: BLE001 - surfaced by start()
            self._error = exc

    def stop(self) -> None:
        for server in self._servers:
            server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
        for sock in self._sockets:
            sock.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m agl_verl.engines.server``: the options and the serving of ``agl engine serve``."""
    from agl_verl.cli import main as serve_main

    return serve_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
