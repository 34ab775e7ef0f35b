"""Request bodies read with a limit, compressed ones included: :func:`read_body` and :class:`BodyLimits`.

Each server answers the three errors here in its own error shape; each error carries the
HTTP ``status`` it stands for and the ``field`` at fault.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import anyio.to_thread
from starlette.requests import ClientDisconnect

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
"""The largest request body, and the most a compressed body may inflate to (413 beyond)."""
INFLATE_CHUNK = 64 * 1024
"""Inflated bytes made at a time from a compressed body."""
IDENTITY = (b"", b"identity")
"""``Content-Encoding`` values of a body sent as it is."""
COMPRESSED = (b"gzip", b"x-gzip", b"deflate")
"""``Content-Encoding`` values :func:`inflate` reads."""


class BodyTooLarge(Exception):
    """A request body over the server's limit (413)."""

    status = 413
    field = "body"

    def __init__(self, limit: int):
        self.limit = limit
        super().__init__(f"request body exceeds the limit of {limit} bytes")


class UnsupportedEncoding(Exception):
    """A ``Content-Encoding`` the server does not read (415)."""

    status = 415
    field = "Content-Encoding"

    def __init__(self, encoding: str, accepted: Iterable[bytes] = IDENTITY + COMPRESSED):
        self.encoding = encoding
        send = "identity, gzip or deflate" if set(COMPRESSED) <= set(accepted) else "the body uncompressed"
        super().__init__(f"Content-Encoding {encoding!r} is not supported: send {send}")


class BadEncoding(Exception):
    """A body that does not decompress by its ``Content-Encoding`` (400)."""

    status = 400
    field = "body"


def declared_length(headers: Iterable[tuple[bytes, bytes]], limit: int) -> None:
    """Raise :class:`BodyTooLarge` for a declared ``Content-Length`` past ``limit``: a route that
    reads no body refuses one as a route that reads it would, before a byte of it is read."""
    for name, value in headers:
        if name == b"content-length" and value.isdigit() and (len(value) > 18 or int(value) > limit):
            raise BodyTooLarge(limit)


def body_encoding(headers: Iterable[tuple[bytes, bytes]], limit: int, accepted: Iterable[bytes] = IDENTITY) -> bytes:
    """The body's ``Content-Encoding`` (lower case, ``b""`` if none), once the headers allow the body.

    Raises :class:`BodyTooLarge` for a declared ``Content-Length`` past ``limit``, and
    :class:`UnsupportedEncoding` for an encoding not in ``accepted``.
    """
    declared_length(headers, limit)
    encoding = b""
    for name, value in headers:
        if name == b"content-encoding":
            encoding = value.strip().lower()
    if encoding not in accepted:
        raise UnsupportedEncoding(encoding.decode("latin-1"), accepted)
    return encoding


async def read_body(receive: Callable[[], Any], limit: int) -> bytes:
    """The whole request body from an ASGI ``receive``.

    Raises :class:`BodyTooLarge` as soon as more than ``limit`` bytes have come, and
    ``ClientDisconnect`` (starlette's) if the client goes away first.
    """
    message = await receive()
    if message["type"] != "http.request":
        raise ClientDisconnect()
    body = message.get("body", b"")
    if len(body) > limit:
        raise BodyTooLarge(limit)
    if not message.get("more_body"):
        return body  # the usual case: the whole body in one message
    chunks = [body]
    size = len(body)
    while message.get("more_body"):
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


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


BODY_ERRORS = (BodyTooLarge, UnsupportedEncoding, BadEncoding)
"""What :class:`BodyLimits` answers itself, through its ``answer``."""


class BodyLimits:
    """ASGI middleware: no request body past ``max_bytes``, whichever route reads it.

    A declared ``Content-Length`` past the limit is refused before anything is read; a
    body sent in chunks is refused when it passes the limit. A ``gzip`` or ``deflate``
    body is read whole (compressed, so within the limit), inflated once in a worker thread
    only to measure it (a piece at a time, so a small "zip bomb" is refused having held
    no more than its own size), then handed on inflated, a piece at a time, without its
    ``Content-Encoding``. ``answer(error)`` is the ASGI app that answers one of
    :data:`BODY_ERRORS` (the server's error shape); an error raised while the app reads
    a plain body reaches the app's own error handling instead.
    """

    def __init__(self, app: Any, max_bytes: int, answer: Callable[[Exception], Any]):
        if max_bytes < 1:
            raise ValueError(f"max_body_bytes: must be positive, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes
        self.answer = answer

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            encoding = body_encoding(scope["headers"], self.max_bytes, IDENTITY + COMPRESSED)
            if encoding in IDENTITY:
                await self.app(scope, self._counted(receive), send)
                return
            compressed = await read_body(receive, self.max_bytes)
        except BODY_ERRORS as exc:
            await self.answer(exc)(scope, receive, send)
            return
        except ClientDisconnect:
            return  # gone before its compressed body was in: no one to answer
        problem = await anyio.to_thread.run_sync(_measure, compressed, encoding, self.max_bytes)
        if problem is not None:
            del compressed  # not kept while the answer goes out
            await self.answer(problem)(scope, receive, send)
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
