"""The gateway's ``/admin/...`` routes (admin token only): each action a function of its JSON body.

    GET  /admin/status        POST /admin/pause?timeout_s=S   POST /admin/resume
    POST /admin/model_version {"model_version": "v3"}         POST /admin/upstreams {"upstreams": [...]}
    POST /admin/flush         POST /admin/rollout_keys {"rollout_id": ...}

An action is ``action(app, args, scope) -> answer``: ``args`` the request's JSON body (``{}`` for
none; checked by :func:`agl_trainer.gateway.validate.check_body`), the answer sent as JSON.
:func:`admin_route` makes one a route's ``serve``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Protocol
from urllib.parse import parse_qs

from agl.schema import RolloutStatus
from agl_trainer.gateway import validate
from agl_trainer.gateway.auth import GatewayAuth
from agl_trainer.gateway.endpoints import read_request, send_json
from agl_trainer.gateway.errors import GatewayError, invalid
from agl_trainer.gateway.pause import PauseGate
from agl_trainer.gateway.rollouts import RolloutRegistry
from agl_trainer.gateway.routing import Router

FLUSH_TIMEOUT_S = 20.0
"""How long ``POST /admin/flush`` waits for the store by default (``timeout_s`` overrides it)."""


class Administered(Protocol):
    """What the admin actions use of the gateway's app."""

    auth: GatewayAuth
    registry: RolloutRegistry
    router: Router
    gate: PauseGate
    max_body_bytes: int
    flush_store: Callable[[float], None] | None

    def set_model_version(self, version: str | None) -> None: ...

    def status(self) -> dict: ...


Action = Callable[[Administered, dict, dict], Awaitable[dict]]


def admin_route(action: Action) -> Callable:
    """``action`` as a route's ``serve``: the body read (POST) and parsed, the answer sent as JSON."""

    async def serve(app: Administered, rollout_id: None, scope: dict, receive: Callable, send: Callable) -> None:
        body = await read_request(scope, receive, app.max_body_bytes) if scope["method"] == "POST" else b""
        try:
            args = json.loads(body) if body else {}
        except (ValueError, RecursionError):
            raise GatewayError(400, "the request body is not valid JSON", code="invalid_json") from None
        validate.check_body(args)  # a lone surrogate as model_version would make every later call unstorable
        await send_json(send, 200, json.dumps(await action(app, args, scope)).encode())

    serve.__doc__ = action.__doc__
    return serve


async def status(app: Administered, args: dict, scope: dict) -> dict:
    """What the gateway is doing now."""
    return app.status()


async def pause(app: Administered, args: dict, scope: dict) -> dict:
    """Hold new calls; answers once those in flight are done (or ``timeout_s`` passed: ``drained`` false)."""
    drained = await app.gate.pause(timeout_s(args, scope))
    return {"paused": True, "drained": drained, "in_flight": app.gate.in_flight}


async def resume(app: Administered, args: dict, scope: dict) -> dict:
    """Let held and new calls through."""
    app.gate.resume()
    return {"paused": False}


async def model_version(app: Administered, args: dict, scope: dict) -> dict:
    """The model version recorded on calls from now on (a string, or null for none)."""
    version = args.get("model_version")
    if version is not None and not isinstance(version, str):
        raise invalid("model_version", "must be a string or null")
    app.set_model_version(version)
    return {"model_version": version}


async def upstreams(app: Administered, args: dict, scope: dict) -> dict:
    """Replace the engine replicas; calls in flight finish where they are."""
    urls = args.get("upstreams")
    if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
        raise invalid("upstreams", "must be a non-empty list of engine URLs")
    try:
        dropped = app.router.set_upstreams(urls)
    except ValueError as exc:
        raise invalid("upstreams", str(exc)) from None
    for replica in dropped:
        await replica.pool.close()
    return {"upstreams": [r.url for r in app.router.replicas]}


async def rollout_keys(app: Administered, args: dict, scope: dict) -> dict:
    """The key of the running attempt of ``rollout_id`` (for a tool that starts the agent itself)."""
    rollout_id = args.get("rollout_id")
    if not isinstance(rollout_id, str) or not rollout_id:
        raise invalid("rollout_id", "must be a non-empty string")
    if app.auth.keys is None:
        raise GatewayError(409, "this gateway has no rollout key secret", code="no_rollout_keys")
    state, attempt = await asyncio.to_thread(app.registry.status_of, rollout_id)
    if state != RolloutStatus.RUNNING:
        raise GatewayError(
            409,
            f"rollout {rollout_id!r} is {state.value}: keys are made for running rollouts",
            param="rollout_id",
            code="rollout_not_running",
        )
    return {"rollout_key": app.auth.keys.mint(rollout_id, attempt)}


async def flush(app: Administered, args: dict, scope: dict) -> dict:
    """Return once every call recorded so far is in the store (within ``timeout_s``, else 503)."""
    # bounded below a client's usual 30 s; a store that cannot take the calls by then is a 503
    timeout = timeout_s(args, scope)
    if app.flush_store is not None:
        await asyncio.to_thread(app.flush_store, FLUSH_TIMEOUT_S if timeout is None else timeout)
    return {"flushed": True}


def timeout_s(args: dict, scope: dict) -> float | None:
    """An admin action's ``timeout_s``, from the JSON body or the query string; None if not given."""
    query = parse_qs(scope.get("query_string", b"").decode())
    timeout = args.get("timeout_s", query.get("timeout_s", [None])[0])
    try:
        timeout = None if timeout is None else float(timeout)
    except (TypeError, ValueError):
        raise invalid("timeout_s", "must be a number of seconds") from None
    if timeout is not None and not 0 <= timeout < float("inf"):
        raise invalid("timeout_s", f"must be a finite number of seconds, at least 0, got {timeout}")
    return timeout
