"""The gateway's routes: Starlette routes whose endpoints first admit the caller.

The gateway routes as the store server and the engine server do, with a Starlette
:class:`~starlette.routing.Router` over a table of routes (the table is in
:mod:`agl_trainer.gateway.app`). Each :class:`GatewayRoute` is matched as Starlette matches a
:class:`~starlette.routing.Route`, and then:

1. **admits** the request (:data:`Admit`): a declared body over the limit is 413 on every
   route; then, except on ``/health``, the caller's credential is checked (401), the rollout
   its path or ``X-Agl-Rollout-Id`` header names must be its key's (403), and a rollout key
   works only while its attempt runs. The admission gives the call's rollout (None: none).
2. checks the **method**: a request of another method is 405, only once admitted, so a
   caller without a credential learns no more of a route than of a path that is none.
3. **serves**: ``serve(app, rollout_id, scope, receive, send)``, a plain ASGI-style call
   (no Starlette ``Request`` is made on the hot path), ``app`` being ``scope["app"]``.

A route names the :class:`~agl_trainer.gateway.dialect.Dialect` it speaks, whose shape its
errors take (OpenAI's when it names none). A path no route matches is 404 after the same
admission as the routes around it (:data:`UNMATCHED`: a catch-all per area, tried by a second
Router after the first).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import unquote

from starlette.routing import Route, Router

from agl_trainer.gateway.auth import ROLLOUT, Caller, GatewayAuth, forbidden
from agl_trainer.gateway.dialect import Dialect, openai_error_body
from agl_trainer.gateway.errors import GatewayError, body_error
from agl_trainer.gateway.rollouts import RolloutRegistry
from agl_trainer.http import BodyTooLarge, UnsupportedEncoding, body_encoding, declared_length, read_body

_ROLLOUT_HEADER = b"x-agl-rollout-id"
_JSON = (b"content-type", b"application/json")


class Admitting(Protocol):
    """What admission reads of the gateway's app."""

    auth: GatewayAuth
    registry: RolloutRegistry
    max_body_bytes: int


Admit = Callable[[Admitting, dict], Awaitable[str | None]]
"""``admit(app, scope)``: the call's rollout (None: none), or an error (401, 403, 404, 413)."""
Serve = Callable[[Any, str | None, dict, Callable, Callable], Awaitable[None]]
"""``serve(app, rollout_id, scope, receive, send)``: answer an admitted request."""


class GatewayRoute(Route):
    """A route of the gateway's table: matched by Starlette, answered as the module says."""

    def __init__(
        self, path: str, method: str | None, admit: Admit, serve: Serve, dialect: Dialect | None = None
    ) -> None:
        super().__init__(path, serve, methods=None if method is None else [method], include_in_schema=False)
        if method is not None:
            self.methods = {method}  # HEAD is not served (Starlette adds it beside GET)
        self.method = method
        """The one method served; None: any (a catch-all answering 404)."""
        self.admit = admit
        self.serve = serve
        self.dialect = dialect
        """The API the route speaks, whose shape its errors take; None: OpenAI's errors."""

    async def handle(self, scope: dict, receive: Callable, send: Callable) -> None:
        # Starlette's own handling (its method check, then ``self.app``: ``serve`` wrapped to take a
        # Request) is replaced whole: admission comes before the method, and no Request is made.
        app = scope["app"]
        rollout_id = await self.admit(app, scope)
        if self.method is not None and scope["method"] != self.method:
            raise GatewayError(405, f"{scope['path']}: use {self.method}", code="method_not_allowed")
        await self.serve(app, rollout_id, scope, receive, send)

    def error_body(self, err: GatewayError) -> bytes:
        """``err`` in the shape the route's clients read."""
        return openai_error_body(err) if self.dialect is None else self.dialect.error_body(err)


async def send_json(send: Callable, status: int, payload: bytes, headers: list | None = None) -> None:
    """Answer ``payload`` (JSON) with ``status`` and ``headers``."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [_JSON, (b"content-length", str(len(payload)).encode()), *(headers or ())],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def _declared(app: Admitting, scope: dict) -> None:
    """413 for a declared body over the limit, on every route (whether it reads a body or not)."""
    try:
        declared_length(scope["headers"], app.max_body_bytes)
    except BodyTooLarge as exc:
        raise body_error(exc) from None


async def admit_anyone(app: Admitting, scope: dict) -> None:
    """``/health``: no credential."""
    _declared(app, scope)


async def admit_client(app: Admitting, scope: dict) -> str | None:
    """``/v1/...``: any credential; the rollout is the key's, or the ``X-Agl-Rollout-Id`` header's."""
    _declared(app, scope)
    caller = app.auth.identify(scope["headers"])
    rollout_id = app.auth.rollout_of(caller, rollout_header(scope), "the X-Agl-Rollout-Id header")
    await _check_live(app.registry, caller)
    return rollout_id


async def admit_rollout(app: Admitting, scope: dict) -> str | None:
    """``/rollouts/{rollout_id}/v1/...``: the rollout the path names, which a key must be for, as a
    header naming one must agree with."""
    _declared(app, scope)
    caller = app.auth.identify(scope["headers"])
    named = rollout_in_path(scope)
    rollout_id = app.auth.rollout_of(caller, named, "the path")
    in_header = rollout_header(scope)
    if in_header is not None and in_header != named:
        raise forbidden(f"the X-Agl-Rollout-Id header names rollout {in_header!r}, the path {named!r}")
    await _check_live(app.registry, caller)
    return rollout_id


async def admit_admin(app: Admitting, scope: dict) -> None:
    """``/admin/...``: the admin token only."""
    _declared(app, scope)
    app.auth.admin_only(app.auth.identify(scope["headers"]))


async def admit_caller(app: Admitting, scope: dict) -> None:
    """Any other path: any credential (then 404)."""
    _declared(app, scope)
    app.auth.identify(scope["headers"])


async def read_request(scope: dict, receive: Callable, limit: int) -> bytes:
    """The request body: 413 past ``limit`` bytes (declared or sent), 415 if it is compressed."""
    try:
        body_encoding(scope["headers"], limit)
        return await read_body(receive, limit)
    except (BodyTooLarge, UnsupportedEncoding) as exc:
        raise body_error(exc) from None


async def _check_live(registry: RolloutRegistry, caller: Caller) -> None:
    """A rollout key works only while its attempt runs."""
    if caller.scope == ROLLOUT:
        await registry.check_attempt(caller.rollout_id, caller.attempt)


def rollout_header(scope: dict) -> str | None:
    """The rollout the ``X-Agl-Rollout-Id`` header names (the last one sent; UTF-8, else Latin-1), if any."""
    named = None
    for name, value in scope["headers"]:
        if name == _ROLLOUT_HEADER:
            try:
                named = value.decode() or None
            except UnicodeDecodeError:
                named = value.decode("latin-1")
    return named


def rollout_in_path(scope: dict) -> str:
    """The rollout id of a ``/rollouts/{rollout_id}/v1/...`` request: one percent-quoted segment of the
    raw path (as :func:`agl.runner.rollout_base_url` writes it), so an id holding ``/``, ``?``, ``#`` or
    ``%`` arrives whole, where the decoded path that routes are matched on would split it. A path whose
    route matched another split of the decoded path (an id's quoted ``/v1/...``) is 404."""
    raw = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1").partition("?")[0]
    segment, _, rest = raw.removeprefix("/rollouts/").partition("/")
    try:
        named = unquote(segment, errors="strict")
    except UnicodeDecodeError:
        named = ""
    matched = scope.get("path_params", {}).get("rollout_id", named)
    if not raw.startswith("/rollouts/") or not named or not rest.startswith("v1/") or matched != named:
        raise GatewayError(404, f"no route {scope['path']}: use /rollouts/{{rollout_id}}/v1/...", code="not_found")
    return named


async def _no_route(app: Any, rollout_id: str | None, scope: dict, receive: Callable, send: Callable) -> None:
    raise GatewayError(404, f"no route {scope['path']}", code="not_found")


async def _no_admin_action(app: Any, rollout_id: str | None, scope: dict, receive: Callable, send: Callable) -> None:
    raise GatewayError(404, f"no admin action {scope['path_params']['action']!r}", code="not_found")


UNMATCHED = Router(
    [
        GatewayRoute("/admin/{action:path}", None, admit_admin, _no_admin_action),
        GatewayRoute("/rollouts/{rest:path}", None, admit_rollout, _no_route),
        GatewayRoute("/v1/{endpoint:path}", None, admit_client, _no_route),
        GatewayRoute("/{path:path}", None, admit_caller, _no_route),
    ],
    redirect_slashes=False,
)
"""Where a request no route of the table matches goes: 404, after its area's admission."""
