"""Errors the gateway answers with, in OpenAI's error shape.

Every error a client sees is ``{"error": {"message", "type", "param", "code"}}``
with ``param`` naming the request field at fault where there is one.
"""

from __future__ import annotations

import json


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


class UpstreamUnavailable(Exception):
    """No replica could be reached or every replica answered 502/503."""

    def __init__(self, message: str, status: int = 502):
        super().__init__(message)
        self.status = status


class Saturated(Exception):
    """Every replica is at its in-flight limit."""
