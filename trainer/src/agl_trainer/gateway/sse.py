"""Server-sent events: reading an engine's stream (parsed by httpx-sse); writing them is :mod:`agl_trainer.http.sse`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
from httpx_sse import EventSource

from agl_trainer.gateway.chat import engine_json
from agl_trainer.gateway.upstream import UpstreamConnectError, UpstreamResponse

DONE = "[DONE]"


class _Body(httpx.AsyncByteStream):
    """An engine's answer body, as httpx reads a response's stream."""

    def __init__(self, resp: UpstreamResponse):
        self._resp = resp

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._resp.iter_chunks():
            yield chunk


async def iter_engine_chunks(resp: UpstreamResponse) -> AsyncIterator[dict]:
    """The completion chunks an engine streams in ``resp`` (an answer with status 200), parsed, as they arrive.

    After ``[DONE]`` the body is read on to its end (so the connection can be reused)
    and nothing more is yielded. Raises ConnectionError when the engine sends an error
    event, drops the connection, or does not answer with an event stream.
    """
    source = EventSource(httpx.Response(resp.status, headers=resp.headers, stream=_Body(resp)))
    done = False
    try:
        async for event in source.aiter_sse():
            if done or not event.data:
                continue
            if event.data == DONE:
                done = True
                continue
            chunk = engine_json(event.data)
            if "error" in chunk and not chunk.get("choices"):
                raise ConnectionError(f"engine error mid-stream: {chunk['error']}")
            yield chunk
    except httpx.HTTPError as exc:  # SSEError: not an event stream; DecodingError: a body that does not decode
        raise UpstreamConnectError(f"the engine's stream could not be read: {exc}") from exc
