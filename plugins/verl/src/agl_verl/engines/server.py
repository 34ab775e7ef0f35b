"""The engine's HTTP face: an OpenAI-compatible Starlette app per replica, served by uvicorn.

Routes: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``,
``POST /v1/completions`` (plain JSON or SSE with ``"stream": true``), and ``GET /metrics``
(prompt tokens computed and cached, tokens generated, in Prometheus' text format). With an
``api_key`` every route but ``/health`` wants ``Authorization: Bearer <api_key>`` (the scheme
in any case, as RFC 7235 has it).

A request body past ``max_body_bytes`` is answered 413 (a ``gzip`` or ``deflate`` body is
inflated within the same limit: :class:`agl_trainer.http.BodyLimits`).

A client that disconnects cancels its request: the generation leaves the batch at the
next decoding step, for plain requests (the handler polls for the disconnect while it
waits) and for streams (the wait for the next chunk races the same poll).

:func:`serve_in_thread` runs several apps (replicas) on one asyncio loop in one background
thread (a :class:`agl_trainer.http.BackgroundServer`). Standalone::

    python -m agl_verl.engines.server --model PATH [--port 8000] [--engine-token-file PATH]

(the options of ``agl engine serve``: see :mod:`agl_verl.cli`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from agl.credentials import bearer, same_token
from agl_trainer.http import BODY_ERRORS, DEFAULT_MAX_BODY_BYTES, BackgroundServer, BodyLimits
from agl_trainer.http.sse import SSE_MEDIA_TYPE
from agl_verl.engines.protocol import RequestError, parse_chat, parse_completion
from agl_verl.engines.serving import Replica

GRACEFUL_SHUTDOWN_S = 5
"""How long a stopping server lets requests in flight finish."""


def _refused_body(exc: Exception) -> JSONResponse:
    """The answer to a body :class:`BodyLimits` refused (413, 415, 400), in OpenAI's error shape."""
    return JSONResponse(RequestError(None, str(exc), exc.status).body(), status_code=exc.status)


def _error(exc: RequestError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _unauthorized() -> JSONResponse:
    return _error(RequestError(None, "missing or wrong bearer token", 401))


async def _read_json(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError as exc:
        raise RequestError(None, f"the request body is not valid JSON: {exc}") from exc


async def _server_error(request: Request, exc: Exception) -> Response:
    return JSONResponse(RequestError(None, f"engine error: {type(exc).__name__}: {exc}", 500).body(), 500)


def _generation_route(
    authorized: Callable[[Request], bool],
    parse: Callable[[Any], Any],
    answer: Callable[[Any], Awaitable[dict]],
    stream: Callable[[Any], Awaitable[AsyncIterator[bytes]]],
) -> Callable[[Request], Awaitable[Response]]:
    """The handler of a generation route: check the token, parse the body, then answer as JSON or SSE."""

    async def handle(request: Request) -> Response:
        if not authorized(request):
            return _unauthorized()
        try:
            req = parse(await _read_json(request))
            if req.sampling.stream:
                chunks = _until_disconnected(request, await stream(req))
                return StreamingResponse(chunks, media_type=SSE_MEDIA_TYPE)
            return await _answer_unless_disconnected(request, answer(req))
        except RequestError as exc:
            return _error(exc)

    return handle


def create_app(replica: Replica, *, api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Any:
    """The OpenAI-compatible ASGI app for one replica; bodies past ``max_body_bytes`` get 413."""

    def authorized(request: Request) -> bool:
        if not api_key:
            return True
        return same_token(bearer(request.headers.get("authorization")), api_key)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model_version": replica.slot.get()[1]})

    async def models(request: Request) -> Response:
        if not authorized(request):
            return _unauthorized()
        data = [
            {
                "id": name,
                "object": "model",
                "owned_by": "agl",
                "max_model_len": replica.max_model_len,
                "model_version": version,
            }
            for name, version in replica.models()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def metrics(request: Request) -> Response:
        if not authorized(request):
            return _unauthorized()
        return PlainTextResponse(prometheus_text(replica.batcher), media_type="text/plain; version=0.0.4")

    chat = _generation_route(authorized, parse_chat, replica.chat, replica.chat_stream)
    completions = _generation_route(
        authorized,
        lambda body: parse_completion(body, replica.vocab_size),
        replica.completion,
        replica.completion_stream,
    )
    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/metrics", metrics),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
        ],
        exception_handlers={
            **{kind: lambda request, exc: _refused_body(exc) for kind in BODY_ERRORS},  # a body cut off as it came
            Exception: _server_error,
        },
    )
    return BodyLimits(app, max_body_bytes, _refused_body)


#: The counters ``GET /metrics`` reports, as (Batcher attribute, Prometheus name, help).
METRICS = (
    ("prompt_tokens", "agl_engine_prompt_tokens_total", "prompt tokens of every row admitted"),
    ("prompt_tokens_computed", "agl_engine_prompt_tokens_computed_total", "prompt tokens prefilled"),
    (
        "prompt_tokens_cached",
        "agl_engine_prefix_cache_hit_tokens_total",
        "prompt tokens taken from the prefix cache or a row with the same prompt",
    ),
    ("generated_tokens", "agl_engine_generation_tokens_total", "tokens generated"),
    ("batches", "agl_engine_prefills_total", "prefill passes run"),
)


def prometheus_text(batcher: Any) -> str:
    """The replica's counters, and its prefix cache's size, in Prometheus' text format."""
    lines = []
    for attribute, name, help_text in METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {getattr(batcher, attribute)}"]
    cache = batcher.prefix_cache
    gauges = (
        ("agl_engine_prefix_cache_blocks", "KV blocks held", cache.blocks if cache else 0),
        ("agl_engine_prefix_cache_bytes", "bytes the blocks hold", cache.nbytes if cache else 0),
    )
    for name, help_text, value in gauges:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value}"]
    return "\n".join(lines) + "\n"


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


async def _until_disconnected(request: Request, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
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


def serve_in_thread(apps: list[Any], *, host: str = "127.0.0.1", port: int = 0) -> BackgroundServer:
    """Serve ``apps`` (replicas) on one event loop in a daemon thread, on ``port``, ``port + 1``, ...
    (0: free ports); returns once every one accepts connections (RuntimeError naming why if not)."""
    server = BackgroundServer(
        apps, host=host, port=port, name="agl-engine-http", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S
    )
    return server.start()


if __name__ == "__main__":
    # Run as a script, this file is the module ``__main__``, which nothing imports: the options and
    # the serving are agl engine serve's (agl_verl.cli, which imports this module as agl_verl.engines.server).
    from agl_verl.cli import main

    raise SystemExit(main())
