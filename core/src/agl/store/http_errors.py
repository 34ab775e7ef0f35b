"""The exceptions a store server's error answers become on the client (:class:`~agl.store.http.HttpStore`)."""

from __future__ import annotations

from typing import Any

import httpx

from agl.env import STORE_TOKEN
from agl.errors import AglError, IdConflict, InvalidTransition, NotFound, Refused, StoreUnavailable, Transient

RETRY_STATUSES = frozenset({502, 503, 504})


class Unauthorized(AglError, PermissionError):
    """The server refused the bearer token (or none was given)."""


class Forbidden(AglError, PermissionError):
    """The credential is valid, but the request is outside its scope (a runner token, a rollout key)."""


class StoreServerError(Transient):
    """The server failed inside (a 5xx other than 502/503/504): not retried per request, but
    :class:`~agl.errors.Transient`, so the runner tries the call again later."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


class RequestRejected(AglError, ValueError):
    """The server refused a request body (422, 413): ``field`` says which value and ``reason`` why."""

    def __init__(self, status: int, field: str, reason: str):
        self.status = status
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


def error_from(status: int, error: dict[str, Any]) -> Exception:
    """The exception for a server error answer (``{"type", "reason", ...}``)."""
    reason = str(error.get("reason", "no reason given"))
    if status == 404 and "kind" in error:
        return NotFound(str(error["kind"]), str(error.get("ident", "")))
    if status == 409 and error.get("type") == "IdConflict":
        return IdConflict(str(error.get("field", "id")), str(error.get("ident", "")))
    if status == 409:
        return InvalidTransition(reason)
    if status in (413, 422):
        return RequestRejected(status, str(error.get("field", "body")), reason)
    if status == 401:
        return Unauthorized(f"store server: {reason} (pass token= or set {STORE_TOKEN})")
    if status == 403:
        return Forbidden(f"store server: {reason}")
    if status in RETRY_STATUSES:
        return StoreUnavailable(f"store server answered {status}: {reason}")
    message = f"store server answered {status}: {error.get('type', 'error')}: {reason}"
    return StoreServerError(status, message) if status >= 500 else Refused(message)


def response_error(response: httpx.Response) -> Exception:
    try:
        error = response.json()["error"]
        if not isinstance(error, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        error = {"reason": response.text[:500] or response.reason_phrase}
    return error_from(response.status_code, error)


_STATUS_BY_TYPE = {
    "NotFound": 404,
    "InvalidTransition": 409,
    "IdConflict": 409,
    "ValidationError": 422,
    "ValueError": 422,
    "BodyTooLarge": 413,
    "StoreUnavailable": 503,
    "Unauthorized": 401,
}


def status_of(error: dict[str, Any]) -> int:
    status = error.get("status")
    return int(status) if isinstance(status, int) else _STATUS_BY_TYPE.get(str(error.get("type")), 500)
