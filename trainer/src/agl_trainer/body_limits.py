"""The store server's limit on request bodies, compressed ones included (:class:`BodyLimits`)."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import Any

import anyio.to_thread

from agl_trainer.store_errors import BadEncoding, BodyTooLarge, UnsupportedEncoding, error_response

INFLATE_CHUNK = 64 * 1024
"""Inflated bytes made at a time from a compressed body."""


def _inflater(encoding: bytes, head: bytes) -> Any:
    if encoding in (b"gzip", b"x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    # HTTP's deflate is the zlib format; some clients send a bare deflate stream.
    zlib_header = len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] * 256 + head[1]) % 31 == 0
    return zlib.decompressobj(zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS)


def inflate(data: bytes, encoding: bytes, limit: int) -> Iterator[bytes]:
    """The inflated body in pieces of at most ``INFLATE_CHUNK`` bytes, never holding more.

    Raises :class:`BodyTooLarge` once more than ``limit`` bytes come out, and
    :class:`BadEncoding` for a stream that is corrupt or cut short.
    """
    name = encoding.decode("latin-1")
    total = 0
    pending = data
    try:
        while pending:
            inflater = _inflater(encoding, pending)
            while not inflater.eof:
                out = inflater.decompress(pending, INFLATE_CHUNK)
                pending = inflater.unconsumed_tail
                if not out and not pending:
                    raise BadEncoding(f"the {name} body ends before its stream does")
                total += len(out)
                if total > limit:
                    raise BodyTooLarge(limit)
                if out:
                    yield out
            pending = inflater.unused_data  # a further gzip member, if any
    except zlib.error as exc:
        raise BadEncoding(f"the body is not valid {name}: {exc}") from None


def _measure(data: bytes, encoding: bytes, limit: int) -> Exception | None:
    """Inflate ``data`` only to see that it inflates within ``limit``: None, or why not.

    The error is returned without its traceback, so no frame (and no copy of the body) outlives it.
    """
    try:
        for _ in inflate(data, encoding, limit):
            pass
    except (BodyTooLarge, BadEncoding) as exc:
        return exc.with_traceback(None)
    return None


async def read_whole(receive: Callable[[], Any], limit: int) -> bytes | None:
    """The whole request body from an ASGI ``receive``, or None if the client went away first.

    Raises :class:`BodyTooLarge` as soon as more than ``limit`` bytes have come.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class BodyLimits:
    """ASGI middleware: no request body past ``max_bytes``, whichever route reads it.

    A declared ``Content-Length`` past the limit is refused before anything is read; a
    body sent in chunks is refused when it passes the limit. A ``gzip`` or ``deflate``
    body is read whole (compressed, so within the limit), inflated once in a worker thread
    only to measure it (a piece at a time, so a small "zip bomb" is refused having held
    no more than its own size), then handed on inflated, a piece at a time, without its
    ``Content-Encoding``.
    """

    def __init__(self, app: Any, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        encoding, declared = b"", b""
        for name, value in scope["headers"]:
            if name == b"content-encoding":
                encoding = value.strip().lower()
            elif name == b"content-length":
                declared = value
        try:
            if declared.isdigit() and int(declared) > self.max_bytes:
                raise BodyTooLarge(self.max_bytes)
            if encoding in (b"", b"identity"):
                await self.app(scope, self._counted(receive), send)
                return
            if encoding not in (b"gzip", b"x-gzip", b"deflate"):
                raise UnsupportedEncoding(encoding.decode("latin-1"))
            compressed = await self._read(receive)
        except (BodyTooLarge, UnsupportedEncoding, BadEncoding) as exc:
            await error_response(exc)(scope, receive, send)
            return
        problem = await anyio.to_thread.run_sync(_measure, compressed, encoding, self.max_bytes)
        if problem is not None:
            del compressed  # not kept while the answer goes out
            await error_response(problem)(scope, receive, send)
            return
        headers = [(n, v) for n, v in scope["headers"] if n not in (b"content-encoding", b"content-length")]
        pieces = inflate(compressed, encoding, self.max_bytes)
        await self.app(dict(scope, headers=headers), self._inflated(pieces, receive), send)

    def _counted(self, receive: Callable[[], Any]) -> Callable[[], Any]:
        size = 0

        async def counted() -> dict:
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                raise BodyTooLarge(self.max_bytes)
            return message

        return counted

    async def _read(self, receive: Callable[[], Any]) -> bytes:
        body = await read_whole(receive, self.max_bytes)
        if body is None:
            raise BadEncoding("the client went away before the end of its body")
        return body

    @staticmethod
    def _inflated(pieces: Iterator[bytes], receive: Callable[[], Any]) -> Callable[[], Any]:
        ahead = next(pieces, None)
        done = False

        async def inflated() -> dict:
            nonlocal ahead, done
            if done:
                return await receive()  # the body is over: what comes now is a disconnect
            piece, ahead = ahead, next(pieces, None)
            done = ahead is None
            return {"type": "http.request", "body": piece or b"", "more_body": not done}

        return inflated
