"""HTTP plumbing that the store server, the gateway and the engines' server share.

- :mod:`~agl_trainer.http.request_body`: request bodies read within a limit
  (:func:`read_body`, the :class:`BodyLimits` middleware, which also inflates ``gzip`` and
  ``deflate`` bodies), and the errors each server answers in its own shape;
- :mod:`~agl_trainer.http.sse`: server-sent events written to a client;
- :mod:`~agl_trainer.http.thread`: :class:`BackgroundServer`, ASGI apps served by uvicorn in a
  background thread;
- :mod:`~agl_trainer.http.header_timeout`: :func:`http_protocol`, uvicorn's protocol closing a
  connection whose request headers are not in within a bound (``DEFAULT_HEADER_TIMEOUT_S``);
- :mod:`~agl_trainer.http.bearer`: who sent a request (:class:`Caller`), found by its bearer
  credential among the server's tokens and rollout keys (:func:`caller_by_bearer`);
- :mod:`~agl_trainer.http.running`: whether a rollout key still works (:func:`expired_reason`),
  and the cache of running rollouts both servers keep (:class:`RunningRollouts`).
"""

from agl_trainer.http.bearer import Caller, caller_by_bearer
from agl_trainer.http.header_timeout import DEFAULT_HEADER_TIMEOUT_S, http_protocol
from agl_trainer.http.request_body import (
    BODY_ERRORS,
    DEFAULT_MAX_BODY_BYTES,
    BadEncoding,
    BodyLimits,
    BodyTooLarge,
    ClientDisconnect,
    UnsupportedEncoding,
    body_encoding,
    declared_length,
    read_body,
)
from agl_trainer.http.running import RunningRollouts, expired_reason
from agl_trainer.http.sse import DONE_EVENT, SSE_HEADERS, data_event, named_event
from agl_trainer.http.thread import BackgroundServer

__all__ = [
    "BODY_ERRORS",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "DONE_EVENT",
    "SSE_HEADERS",
    "BackgroundServer",
    "BadEncoding",
    "BodyLimits",
    "BodyTooLarge",
    "Caller",
    "ClientDisconnect",
    "RunningRollouts",
    "UnsupportedEncoding",
    "body_encoding",
    "caller_by_bearer",
    "data_event",
    "declared_length",
    "expired_reason",
    "http_protocol",
    "named_event",
    "read_body",
]
