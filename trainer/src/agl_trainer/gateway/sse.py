"""Server-sent events: splitting an engine's stream, and writing events to the client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

DONE = b"[DONE]"


async def iter_sse_batches(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[bytes]]:
    """The ``data:`` payloads of an event stream, in batches: those completed by each network read.

    Relaying a batch as one write keeps the stream's latency while saving a write per event.
    """
    buf = b""
    async for chunk in chunks:
        buf += chunk
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        batch = []
        while True:
            end = buf.find(b"\n\n")
            if end < 0:
                break
            event, buf = buf[:end], buf[end + 2 :]
            data = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
            if data:
                batch.append(b"\n".join(data))
        if batch:
            yield batch
    if buf.strip().startswith(b"data:"):
        yield [buf.strip()[5:].lstrip(b" ")]


async def iter_engine_chunks(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[dict]]:
    """An engine's streamed completion chunks, parsed, in the batches of :func:`iter_sse_batches`.

    After ``[DONE]`` the body is read on to its end (so the connection can be reused)
    and nothing more is yielded. An error event from the engine raises ConnectionError.
    """
    done = False
    async for batch in iter_sse_batches(chunks):
        parsed = []
        for data in batch:
            if done or data == DONE:
                done = True
                continue
            chunk = json.loads(data)
            if "error" in chunk and not chunk.get("choices"):
                raise ConnectionError(f"engine error mid-stream: {chunk['error']}")
            parsed.append(chunk)
        if parsed:
            yield parsed


async def iter_sse_data(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The ``data:`` payloads of an event stream, one per event, as they arrive."""
    async for batch in iter_sse_batches(chunks):
        for data in batch:
            yield data


def data_event(obj: object) -> bytes:
    """One ``data:`` event carrying ``obj`` as JSON."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def named_event(name: str, obj: object) -> bytes:
    """One event with an ``event:`` name (the Responses API streams these)."""
    return f"event: {name}\ndata: ".encode() + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"
