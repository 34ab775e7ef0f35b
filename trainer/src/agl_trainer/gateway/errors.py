"""Errors the gateway answers with, in OpenAI's error shape.

Every error a client sees is ``{"error": {"message", "type", "param", "code"}}``
with ``param`` naming the request field at fault where there is one. A 5xx names
no engine URL and no exception text: :func:`server_error` logs those under a
request id, which the client gets in the message and in ``X-Request-Id``.
"""

from __future__ import annotations

import json
import logging
import secrets

from agl_trainer.http import BodyTooLarge, UnsupportedEncoding

log = logging.getLogger("agl_trainer.gateway")


class GatewayError(Exception):
    """An error answered to the client with an HTTP status and an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        """The JSON error body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def encode(self) -> bytes:
        return json.dumps(self.body()).encode()


def invalid(param: str, reason: str, *, code: str = "invalid_value") -> GatewayError:
    """A 400 naming the field at fault and why."""
    return GatewayError(400, f"{param}: {reason}", param=param, code=code)


def server_error(
    status: int,
    message: str,
    detail: str,
    *,
    type: str = "server_error",
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> GatewayError:
    """A 5xx that tells the client ``message`` and a request id; ``detail`` (engine URLs,
    exception text) goes only to the gateway's log, under that id."""
    request_id = secrets.token_hex(8)
    log.error("gateway: request %s answered %d: %s", request_id, status, detail)
    return GatewayError(
        status,
        f"{message} (request id {request_id})",
        type=type,
        code=code,
        headers={**(headers or {}), "X-Request-Id": request_id},
    )


def body_error(exc: BodyTooLarge | UnsupportedEncoding) -> GatewayError:
    """What the client sees of a body that :func:`agl_trainer.http.read_body` refused."""
    if isinstance(exc, BodyTooLarge):
        return GatewayError(413, f"the request body exceeds the limit of {exc.limit} bytes", code="request_too_large")
    return GatewayError(415, "Content-Encoding: send the body uncompressed", code="unsupported_encoding")


class UpstreamUnavailable(Exception):
    """No replica could be reached or every replica answered 502/503."""

    def __init__(self, message: str, status: int = 502):
        super().__init__(message)
        self.status = status


class Saturated(Exception):
    """Every replica is at its in-flight limit."""
