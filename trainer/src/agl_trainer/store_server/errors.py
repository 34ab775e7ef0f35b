"""How the store server answers an error: the status and the ``{"error": {...}}`` body for each exception.

A 4xx names the field and the reason; a 5xx names no path, URL or database message, which go
to the server's log under the ``request_id`` the answer gives (:func:`error_payload`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import ValidationError
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response

from agl.errors import IdConflict, InvalidTransition, NotFound, StoreUnavailable
from agl.schema import short_id
from agl_trainer.http import BODY_ERRORS, BodyTooLarge
from agl_trainer.store_server.auth import Refused

log = logging.getLogger("agl_trainer.store_server")  # a 5xx is logged where the server logs


def _dotted(loc: tuple) -> str:
    return ".".join(str(part) for part in loc) or "body"


def _internal(status: int, kind: str, reason: str, exc: BaseException) -> tuple[int, dict[str, Any]]:
    """A 5xx: the details go to the log under a fresh request id, the client gets ``reason`` and the id."""
    request_id = short_id(16)
    log.error("store server: request %s answered %d: %s: %s", request_id, status, type(exc).__name__, exc, exc_info=exc)
    return status, {"type": kind, "reason": f"{reason} (request id {request_id})", "request_id": request_id}


def error_payload(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The HTTP status and ``error`` object for an exception (500 for the unexpected).

    A 5xx carries no detail of the server (paths, URLs, database text): those are logged
    with the ``request_id`` the payload gives.
    """
    if isinstance(exc, Refused):
        kind = "Forbidden" if exc.status == 403 else "Unauthorized"
        return exc.status, {"type": kind, "field": "Authorization", "reason": exc.reason}
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        field = _dotted(first["loc"])
        reason = first["msg"]
        if first["type"] == "json_invalid":
            field, reason = "body", f"invalid JSON: {first.get('ctx', {}).get('error', reason)}"
        elif first["type"] == "json_value":  # a part of a JSON field (see agl.schema.JSON)
            field, reason = field + first["ctx"]["path"], first["ctx"]["reason"]
        return 422, {"type": "ValidationError", "field": field, "reason": reason}
    if isinstance(exc, NotFound):
        return 404, {"type": "NotFound", "kind": exc.kind, "ident": exc.ident, "reason": str(exc)}
    if isinstance(exc, IdConflict):
        return 409, {"type": "IdConflict", "field": exc.field, "ident": exc.ident, "reason": str(exc)}
    if isinstance(exc, InvalidTransition):
        return 409, {"type": "InvalidTransition", "reason": str(exc)}
    if isinstance(exc, StoreUnavailable):
        return _internal(503, "StoreUnavailable", "the store's database is unavailable; retry shortly", exc)
    if isinstance(exc, BODY_ERRORS):  # BodyTooLarge, UnsupportedEncoding, BadEncoding
        payload = {"type": type(exc).__name__, "field": exc.field, "reason": str(exc)}
        return exc.status, payload | ({"limit": exc.limit} if isinstance(exc, BodyTooLarge) else {})
    if isinstance(exc, RecursionError):
        return 422, {"type": "ValidationError", "field": "body", "reason": "nested too deeply"}
    if isinstance(exc, ValueError):
        message = str(exc)
        field, sep, reason = message.partition(": ")
        if not sep or " " in field:
            field, reason = "body", message
        return 422, {"type": "ValueError", "field": field, "reason": reason}
    return _internal(500, "InternalError", "internal store server error", exc)


def error_headers(status: int, payload: dict[str, Any]) -> dict[str, str]:
    headers = {}
    if "request_id" in payload:
        headers["X-Request-Id"] = payload["request_id"]
    if status == 503:
        headers["Retry-After"] = "1"
    return headers


def error_item(exc: BaseException) -> bytes:
    status, payload = error_payload(exc)
    return json.dumps({"error": payload | {"status": status}}).encode()


def error_response(exc: BaseException) -> Response:
    status, payload = error_payload(exc)
    return JSONResponse({"error": payload}, status_code=status, headers=error_headers(status, payload))


class CatchUnexpected:
    """ASGI middleware: an exception no handler took becomes a 500 without the server's
    details (see :func:`error_payload`), unless the answer had started."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        started = False

        async def tracked(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except ClientDisconnect:
            return  # the client hung up before its body was in: no one to answer, nothing went wrong here
        except Exception as exc:
            if started or scope["type"] != "http":
                raise
            await error_response(exc)(scope, receive, send)
