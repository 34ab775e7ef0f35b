"""The gateway's ASGI application: routes, auth, and the request pipeline.

A plain ASGI callable rather than a framework: the request path is short and runs
thousands of times a second, so it does only what it must.

Routes (all behind a bearer credential, except ``/health``; who may call what is in
:mod:`agl_trainer.gateway.auth`)::

    POST /v1/chat/completions | /v1/completions | /v1/responses   production traffic, or the key's rollout
    POST /v1/messages | /v1/messages/count_tokens                 the same, in Anthropic's API
    POST /rollouts/{rollout_id}/v1/...                              traffic of one rollout (its key's)
    GET  /v1/models, /rollouts/{rollout_id}/v1/models
    GET  /admin/status        POST /admin/pause?timeout_s=S   POST /admin/resume
    POST /admin/model_version {"model_version": "v3"}         POST /admin/upstreams {"upstreams": [...]}
    POST /admin/flush         POST /admin/rollout_keys {"rollout_id": ...}   GET  /health

A rollout key names its rollout; a path segment or ``X-Agl-Rollout-Id`` header naming
another one is refused with 403, as is (whoever calls) a header naming another rollout than
the path. Admin routes take the admin token only. Errors are in
OpenAI's shape, except on the Anthropic routes (:mod:`agl_trainer.gateway.messages_api`),
whose clients read Anthropic's. Every answer, errors included, names its request id
(``req_...``) in ``x-request-id`` and ``request-id``, the headers OpenAI's and Anthropic's SDKs read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs, unquote

from agl.credentials import RolloutKeys
from agl.errors import StoreUnavailable
from agl.schema import RolloutStatus
from agl_trainer.gateway import chat, messages_api, responses_api, translated, validate
from agl_trainer.gateway.auth import ROLLOUT, Caller, GatewayAuth, forbidden
from agl_trainer.gateway.errors import (
    GatewayError,
    Saturated,
    UpstreamUnavailable,
    body_error,
    invalid,
    server_error,
)
from agl_trainer.gateway.pause import PauseGate
from agl_trainer.gateway.recorder import CallMeta, Recorder
from agl_trainer.gateway.rollouts import RolloutRegistry
from agl_trainer.gateway.routing import Replica, Router
from agl_trainer.gateway.sse import iter_engine_chunks
from agl_trainer.gateway.upstream import UpstreamResponse
from agl_trainer.http import (
    DEFAULT_MAX_BODY_BYTES,
    DONE_EVENT,
    SSE_HEADERS,
    BodyTooLarge,
    ClientDisconnect,
    UnsupportedEncoding,
    body_encoding,
    data_event,
    declared_length,
    read_body,
)
from agl_trainer.policy_routes import Route, Routes, UnknownModel

log = logging.getLogger(__name__)

_JSON = [(b"content-type", b"application/json")]
_ROLLOUT_HEADER = b"x-agl-rollout-id"
FLUSH_TIMEOUT_S = 20.0
"""How long ``POST /admin/flush`` waits for the store by default (``timeout_s`` overrides it)."""
_ENDPOINTS = {
    "chat/completions": "chat.completions",
    "completions": "completions",
    "responses": "responses",
    "messages": "messages",
}
_ID_PREFIXES = {"chat.completions": "chatcmpl-", "completions": "cmpl-", "responses": "resp_", "messages": "msg_"}
ENDPOINTS = {**dict.fromkeys(_ENDPOINTS, "POST"), "messages/count_tokens": "POST", "models": "GET"}
"""What a client may call under ``/v1/`` and ``/rollouts/{rollout_id}/v1/``, and the method of each."""
ADMIN_ACTIONS = {
    "status": "GET",
    **dict.fromkeys(("pause", "resume", "model_version", "upstreams", "rollout_keys", "flush"), "POST"),
}
"""The ``/admin/`` routes, and the method of each."""


def routes() -> list[tuple[str, str]]:
    """Every route of the gateway as ``(method, path)``, the rollout's id as ``{rollout_id}``: what
    :class:`GatewayApp` serves (anything else is 404, another method 405)."""
    served = [("GET", "/health")]
    for endpoint, method in ENDPOINTS.items():
        served += [(method, f"/v1/{endpoint}"), (method, f"/rollouts/{{rollout_id}}/v1/{endpoint}")]
    return served + [(method, f"/admin/{action}") for action, method in ADMIN_ACTIONS.items()]


async def _read_body(scope: dict, receive: Callable, limit: int) -> bytes:
    """The request body: 413 past ``limit`` bytes (declared or sent), 415 if it is compressed."""
    try:
        body_encoding(scope["headers"], limit)
        return await read_body(receive, limit)
    except (BodyTooLarge, UnsupportedEncoding) as exc:
        raise body_error(exc) from None


async def send_json(send: Callable, status: int, payload: bytes, headers: list | None = None) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": _JSON + [(b"content-length", str(len(payload)).encode())] + (headers or []),
        }
    )
    await send({"type": "http.response.body", "body": payload})


async def send_error(send: Callable, err: GatewayError, *, anthropic: bool = False) -> None:
    """Answer ``err``: in OpenAI's error shape, or in Anthropic's for a client of the Messages API."""
    headers = [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    payload = json.dumps(messages_api.error_body(err)).encode() if anthropic else err.encode()
    await send_json(send, err.status, payload, headers)


def speaks_anthropic(path: str) -> bool:
    """Whether ``path`` is one of the Anthropic routes (its errors are in Anthropic's shape)."""
    return path.rstrip("/").endswith(tuple(f"/v1/{route}" for route in messages_api.ROUTES))


def upstream_error(status: int, body: bytes, req: dict) -> GatewayError:
    """Map an engine's non-200 answer to what the client sees.

    A 400 (bad request, prompt over the context length) is passed through with the
    engine's message; anything else is the gateway's 502 naming the engine's answer.
    """
    try:
        err = json.loads(body)
        detail = err.get("error", err) if isinstance(err, dict) else {"message": str(err)}
        if isinstance(detail, str):
            detail = {"message": detail}
        message = detail.get("message") or detail.get("detail") or body.decode("utf-8", "replace")
    except ValueError:
        detail, message = {}, body.decode("utf-8", "replace")
    message = str(message)[:2000]
    if status in (400, 413, 422):
        param = detail.get("param")
        fmt = req.get("response_format") or (req.get("text") or {}).get("format")
        if fmt and any(w in message.lower() for w in ("response_format", "json_schema", "guided", "structured")):
            return GatewayError(
                400,
                f"response_format: the engine cannot honour it: {message}",
                param="response_format",
                code="response_format_unsupported",
            )
        code = detail.get("code")
        return GatewayError(
            400, message, param=param if isinstance(param, str) else None, code=code if isinstance(code, str) else None
        )
    if status == 429:
        return GatewayError(
            429,
            f"the engine is overloaded: {message}",
            type="rate_limit_error",
            code="engine_overloaded",
            headers={"Retry-After": "1"},
        )
    return server_error(
        502,
        f"the engine answered {status}",
        f"the engine answered {status}: {message}",
        type="upstream_error",
        code="engine_error",
    )


def _check_method(allowed: str | None, method: str, path: str) -> None:
    """404 for a route the gateway does not serve (``allowed`` None), 405 for another method than ``allowed``."""
    if allowed is None:
        raise GatewayError(404, f"no route {path}", code="not_found")
    if method != allowed:
        raise GatewayError(405, f"{path}: use {allowed}", code="method_not_allowed")


def _rollout_header(scope: dict) -> str | None:
    """The rollout the ``X-Agl-Rollout-Id`` header names (the last one sent; UTF-8, else Latin-1), if any."""
    named = None
    for name, value in scope["headers"]:
        if name == _ROLLOUT_HEADER:
            try:
                named = value.decode() or None
            except UnicodeDecodeError:
                named = value.decode("latin-1")
    return named


def _rollout_route(scope: dict) -> tuple[str, str]:
    """``(rollout id, endpoint)`` of a ``/rollouts/{id}/v1/{endpoint}`` request. The id is one
    percent-quoted segment of the raw path (as :func:`agl.runner.rollout_base_url` writes it), so
    an id holding ``/``, ``?``, ``#`` or ``%`` arrives whole; the decoded path would split it."""
    raw = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1").partition("?")[0]
    segment, _, rest = raw.removeprefix("/rollouts/").partition("/")
    try:
        named = unquote(segment, errors="strict")
    except UnicodeDecodeError:
        named = ""
    if not raw.startswith("/rollouts/") or not named or not rest.startswith("v1/"):
        raise GatewayError(404, f"no route {scope['path']}: use /rollouts/{{rollout_id}}/v1/...", code="not_found")
    return named, unquote(rest[3:])


class GatewayApp:
    """The ASGI callable; state lives in the parts it is given."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """The largest request body read (413 beyond)."""

    def __init__(
        self,
        *,
        router: Router,
        recorder: Recorder,
        registry: RolloutRegistry,
        gate: PauseGate,
        token: str | None,
        admin_token: str | None = None,
        keys: RolloutKeys | None = None,
        flush: Callable[[float], None] | None = None,
        routes: Routes | None = None,
    ):
        self.routes = routes
        """The run's policies, by the model names they answer; None: one policy answers every call."""
        self.router = router
        self.recorder = recorder
        self.registry = registry
        self.gate = gate
        self.auth = GatewayAuth(token=token, admin_token=admin_token, keys=keys)
        self._flush = flush

    # -- ASGI entry ------------------------------------------------------------------
    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                while (await receive())["type"] != "lifespan.shutdown":
                    await send({"type": "lifespan.startup.complete"})
                await send({"type": "lifespan.shutdown.complete"})
            return
        started = False
        request_id = "req_" + uuid.uuid4().hex[:24]

        async def tracked_send(message: dict) -> None:
            nonlocal started
            started = True
            if message["type"] == "http.response.start":
                message = dict(message, headers=_with_request_id(message.get("headers") or [], request_id))
            await send(message)

        try:
            await self._dispatch(scope, receive, tracked_send)
        except ClientDisconnect:
            return  # gone before its body was in: no one to answer
        except Exception as exc:
            anthropic = speaks_anthropic(scope["path"])
            if started:  # the answer is under way: all that is left is to end it
                log.exception("gateway: error after the response started")
                with contextlib.suppress(Exception):
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
            elif isinstance(exc, GatewayError):
                await send_error(tracked_send, exc, anthropic=anthropic)
            elif isinstance(exc, StoreUnavailable):  # the store could not say whose key this is
                err = server_error(
                    503, "the store is unavailable; retry shortly", str(exc), headers={"Retry-After": "1"}
                )
                await send_error(tracked_send, err, anthropic=anthropic)
            else:  # a bug: answer 500 (its details go to the log) rather than dropping the connection
                log.exception("gateway: internal error")
                err = server_error(500, "internal gateway error", f"{type(exc).__name__}: {exc}")
                await send_error(tracked_send, err, anthropic=anthropic)

    async def _dispatch(self, scope: dict, receive: Callable, send: Callable) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        try:
            declared_length(scope["headers"], self.max_body_bytes)  # every route, read or not
        except BodyTooLarge as exc:
            raise body_error(exc) from None
        if path == "/health":
            return await send_json(send, 200, b'{"ok":true}')
        caller = self.auth.identify(scope["headers"])
        rollout_id: str | None = None
        if path.startswith("/rollouts/"):
            named, endpoint = _rollout_route(scope)
            rollout_id = self.auth.rollout_of(caller, named, "the path")
            in_header = _rollout_header(scope)
            if in_header is not None and in_header != named:
                raise forbidden(f"the X-Agl-Rollout-Id header names rollout {in_header!r}, the path {named!r}")
        elif path.startswith("/v1/"):
            endpoint = path[4:]
            rollout_id = self.auth.rollout_of(caller, _rollout_header(scope), "the X-Agl-Rollout-Id header")
        elif path.startswith("/admin/"):
            self.auth.admin_only(caller)
            return await self._admin(path[len("/admin/") :], method, scope, receive, send)
        else:
            raise GatewayError(404, f"no route {path}", code="not_found")
        await self._check_live(caller)
        endpoint = endpoint.rstrip("/")
        _check_method(ENDPOINTS.get(endpoint), method, path)
        kind = _ENDPOINTS.get(endpoint)
        if kind is not None:
            return await self._serve(
                kind, rollout_id, await _read_body(scope, receive, self.max_body_bytes), receive, send
            )
        if endpoint == "messages/count_tokens":
            if rollout_id is not None:
                await self.registry.check(rollout_id)
            body = await _read_body(scope, receive, self.max_body_bytes)
            return await send_json(send, 200, json.dumps(await self._count_tokens(rollout_id, body)).encode())
        if endpoint == "models":
            if rollout_id is not None:
                await self.registry.check(rollout_id)
            return await send_json(send, 200, json.dumps(await self._models()).encode())
        raise AssertionError(f"{endpoint!r} is in ENDPOINTS but has no handler")

    async def _check_live(self, caller: Caller) -> None:
        """A rollout key works only while its attempt runs."""
        if caller.scope == ROLLOUT:
            await self.registry.check_attempt(caller.rollout_id, caller.attempt)

    # -- the LLM pipeline ----------------------------------------------------------------
    async def served_model(self) -> str | None:
        """The model the replicas serve, asked of them once."""
        for replica in self.router.replicas:
            if replica.served_model:
                return replica.served_model
        for replica in self.router.replicas:
            try:
                if await replica.fetch_models(prefer=self.recorder.model_version):
                    return replica.served_model
            except (ConnectionError, ValueError, asyncio.IncompleteReadError) as exc:
                log.warning("gateway: cannot list models of %s: %s", replica.url, exc)
        return None

    async def _models(self) -> dict:
        model = await self.served_model()
        if model is None:
            raise GatewayError(502, "no engine replica could be asked what it serves", type="upstream_error")
        return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "agl", "created": 0}]}

    async def _serve(self, kind: str, rollout_id: str | None, body: bytes, receive: Callable, send: Callable) -> None:
        req = _json_body(body)
        if kind == "chat.completions":
            validate.check_chat(req)
        elif kind == "completions":
            validate.check_completion(req)
        chat_req = None
        if kind == "responses":
            chat_req = responses_api.to_chat_request(req)
        elif kind == "messages":
            chat_req = messages_api.to_chat_request(req)
        requested = req.get("model")
        route = self._route(requested)
        n = req.get("n") or 1
        seqs = [await self.registry.next_seq(rollout_id) for _ in range(n)]
        settings = self.registry.settings(rollout_id)
        meta = CallMeta(
            _ID_PREFIXES[kind] + uuid.uuid4().hex,
            rollout_id,
            seqs,
            kind,
            requested,
            req,
            max_response_tokens=settings.max_response_tokens,
            seed=settings.call_seed(seqs[0]),
            policy=route.policy if route else None,
            policy_version=route.version if route else None,
            upstream_model=route.upstream_model if route else None,
        )
        await self.gate.enter()
        try:
            await _until_disconnect(
                lambda out: self._call(kind, meta, req, chat_req, out), receive, send, self._aborted(meta)
            )
        finally:
            self.gate.exit()

    def _route(self, model: str | None) -> Route | None:
        """The policy that answers ``model`` (a run that names its policies), else None; 404 when none does."""
        if self.routes is None:
            return None
        try:
            return self.routes.route(model)
        except UnknownModel as exc:
            raise GatewayError(404, str(exc), param="model", code="model_not_found") from None

    def _aborted(self, meta: CallMeta) -> Callable[[], None]:
        def record() -> None:
            log.info("gateway: the client of %s went away; its engine request is cancelled", meta.call_id)
            self.recorder.record_aborted(meta)

        return record

    async def _send_upstream(
        self, kind: str, meta: CallMeta, req: dict, model: str | None
    ) -> tuple[Replica, UpstreamResponse]:
        """The engine's request for this call, sent to a replica: ``(replica, response)``."""
        if kind == "completions":
            upstream = chat.upstream_completion_request(req, model, meta.max_response_tokens)
        else:
            upstream = chat.upstream_chat_request(req, model, meta.max_response_tokens)
        if meta.seed is not None and upstream.get("seed") is None:
            upstream["seed"] = meta.seed  # the client's own seed wins
        return await self._post(
            meta.rollout_id, "/completions" if kind == "completions" else "/chat/completions", upstream
        )

    async def _post(self, rollout_id: str | None, path: str, upstream: dict) -> tuple[Replica, UpstreamResponse]:
        """POST ``upstream`` to a replica's ``path``: ``(replica, response)``; 429 or 5xx when none can take it."""
        try:
            return await self.router.send(rollout_id, path, json.dumps(upstream).encode())
        except Saturated:
            raise GatewayError(
                429,
                "every engine replica is at its limit of requests in flight; retry shortly",
                type="rate_limit_error",
                code="gateway_saturated",
                headers={"Retry-After": "1"},
            ) from None
        except UpstreamUnavailable as exc:
            raise server_error(
                exc.status, "no engine replica could answer", str(exc), type="upstream_error", code="engine_unavailable"
            ) from None

    async def _call(self, kind: str, meta: CallMeta, req: dict, chat_req: dict | None, send: Callable) -> None:
        """Send the call to a replica and answer the client from the replica's answer.

        The client sees the model name it asked for; the served one stays in the engine request.
        """
        model = meta.upstream_model or await self.served_model()
        shown = meta.requested_model or model
        replica, resp = await self._send_upstream(kind, meta, chat_req if chat_req is not None else req, model)
        try:
            if resp.status != 200:
                err = upstream_error(resp.status, await resp.read(), req)
                raise messages_api.in_anthropic_terms(err) if kind == "messages" else err
            if not req.get("stream"):
                try:
                    await resp.read()
                except ConnectionError as exc:
                    raise server_error(
                        502, "the engine's answer was cut short", str(exc), type="upstream_error", code="engine_error"
                    ) from None
            if kind in ("responses", "messages"):
                api = responses_api if kind == "responses" else messages_api
                await translated.serve(self.recorder, meta, req, resp, send, api.translators(meta, req, shown))
            elif req.get("stream"):
                await self._relay_stream(kind == "chat.completions", meta, req, resp, shown, send)
            else:
                await self._answer(kind == "chat.completions", meta, req, await resp.read(), send)
        finally:
            resp.aclose()
            Router.done(replica)

    async def _answer(self, is_chat: bool, meta: CallMeta, req: dict, raw: bytes, send: Callable) -> None:
        data = chat.engine_json(raw)
        keep_ids, keep_logprobs = chat.client_wants(req, chat=is_chat)
        take = chat.take_chat_tokens if is_chat else chat.take_completion_tokens
        prompt_ids, tokens = take(data, keep_ids=keep_ids, keep_logprobs=keep_logprobs)
        data["id"] = meta.call_id
        if meta.requested_model:
            data["model"] = meta.requested_model
        self.recorder.tell(data, meta)
        payload = json.dumps(data).encode()
        self.recorder.record(meta, prompt_ids, tokens, data)
        await send_json(send, 200, payload)

    async def _relay_stream(
        self, is_chat: bool, meta: CallMeta, req: dict, resp: UpstreamResponse, model: str | None, send: Callable
    ) -> None:
        keep_ids, keep_logprobs = chat.client_wants(req, chat=is_chat)
        include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        acc = chat.StreamAccumulator(is_chat)
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        try:
            async for chunk in iter_engine_chunks(resp):
                self.recorder.tell(chunk, meta)
                acc.feed(chunk)
                chunk["id"] = meta.call_id
                if model:
                    chunk["model"] = model
                chat.strip_chunk(chunk, keep_ids=keep_ids, keep_logprobs=keep_logprobs)
                if not include_usage:
                    if not chunk.get("choices") and chunk.get("usage"):
                        continue
                    chunk.pop("usage", None)
                await send({"type": "http.response.body", "body": data_event(chunk), "more_body": True})
        except ConnectionError as exc:
            err = server_error(
                502, "the engine dropped the stream", str(exc), type="upstream_error", code="engine_error"
            ).body()
            await send({"type": "http.response.body", "body": data_event(err), "more_body": False})
            log.warning("gateway: stream of %s cut short, not recorded: %s", meta.call_id, exc)
            return
        await send({"type": "http.response.body", "body": DONE_EVENT, "more_body": False})
        prompt_ids, tokens = acc.tokens()
        self.recorder.record(meta, prompt_ids, tokens, acc.response(meta.call_id, model))

    async def _count_tokens(self, rollout_id: str | None, body: bytes) -> dict:
        """``/v1/messages/count_tokens``: the length of the prompt the engine renders (nothing recorded)."""
        chat_req = messages_api.count_chat_request(_json_body(body))
        route = self._route(chat_req.get("model"))
        model = (route.upstream_model if route else None) or await self.served_model()
        upstream = chat.upstream_chat_request(chat_req, model, 1)
        await self.gate.enter()
        try:
            replica, resp = await self._post(rollout_id, "/chat/completions", upstream)
            try:
                try:
                    raw = await resp.read()
                except ConnectionError as exc:
                    raise server_error(
                        502, "the engine's answer was cut short", str(exc), type="upstream_error", code="engine_error"
                    ) from None
                if resp.status != 200:
                    raise messages_api.in_anthropic_terms(upstream_error(resp.status, raw, chat_req))
            finally:
                resp.aclose()
                Router.done(replica)
        finally:
            self.gate.exit()
        prompt_ids, _ = chat.take_chat_tokens(chat.engine_json(raw), keep_ids=False, keep_logprobs=False)
        return {"input_tokens": len(prompt_ids)}

    # -- admin -----------------------------------------------------------------------------
    async def _admin(self, action: str, method: str, scope: dict, receive: Callable, send: Callable) -> None:
        if action not in ADMIN_ACTIONS:
            raise GatewayError(404, f"no admin action {action!r}", code="not_found")
        _check_method(ADMIN_ACTIONS[action], method, f"/admin/{action}")
        body = await _read_body(scope, receive, self.max_body_bytes) if method == "POST" else b""
        try:
            args = json.loads(body) if body else {}
        except (ValueError, RecursionError):
            raise GatewayError(400, "the request body is not valid JSON", code="invalid_json") from None
        validate.check_body(args)  # a lone surrogate as model_version would make every later call unstorable
        if action == "status":
            return await send_json(send, 200, json.dumps(self.status()).encode())
        if action == "pause":
            drained = await self.gate.pause(_timeout_s(args, scope))
            out = {"paused": True, "drained": drained, "in_flight": self.gate.in_flight}
        elif action == "resume":
            self.gate.resume()
            out = {"paused": False}
        elif action == "model_version":
            version = args.get("model_version")
            if version is not None and not isinstance(version, str):
                raise invalid("model_version", "must be a string or null")
            self.set_model_version(version)
            out = {"model_version": version}
        elif action == "upstreams":
            urls = args.get("upstreams")
            if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
                raise invalid("upstreams", "must be a non-empty list of engine URLs")
            try:
                dropped = self.router.set_upstreams(urls)
            except ValueError as exc:
                raise invalid("upstreams", str(exc)) from None
            for replica in dropped:
                await replica.pool.close()
            out = {"upstreams": [r.url for r in self.router.replicas]}
        elif action == "rollout_keys":
            out = {"rollout_key": await self._rollout_key(args.get("rollout_id"))}
        elif action == "flush":
            # bounded below a client's usual 30 s; a store that cannot take the calls by then is a 503
            timeout = _timeout_s(args, scope)
            if self._flush is not None:
                await asyncio.to_thread(self._flush, FLUSH_TIMEOUT_S if timeout is None else timeout)
            out = {"flushed": True}
        else:
            raise AssertionError(f"{action!r} is in ADMIN_ACTIONS but has no handler")
        await send_json(send, 200, json.dumps(out).encode())

    async def _rollout_key(self, rollout_id: object) -> str:
        """The key of the running attempt of ``rollout_id`` (for a tool that starts the agent itself)."""
        if not isinstance(rollout_id, str) or not rollout_id:
            raise invalid("rollout_id", "must be a non-empty string")
        if self.auth.keys is None:
            raise GatewayError(409, "this gateway has no rollout key secret", code="no_rollout_keys")
        status, attempt = await asyncio.to_thread(self.registry.status_of, rollout_id)
        if status != RolloutStatus.RUNNING:
            raise GatewayError(
                409,
                f"rollout {rollout_id!r} is {status.value}: keys are made for running rollouts",
                param="rollout_id",
                code="rollout_not_running",
            )
        return self.auth.keys.mint(rollout_id, attempt)

    def set_model_version(self, version: str | None) -> None:
        """Record ``version`` on calls from now on, and ask the replicas again what they serve."""
        self.recorder.model_version = version
        for replica in self.router.replicas:
            replica.served_model = None

    def status(self) -> dict:
        """What the gateway is doing now."""
        return {
            "paused": self.gate.paused,
            "in_flight": self.gate.in_flight,
            "held": self.gate.held,
            "model_version": self.recorder.model_version,
            **({"policies": self.routes.versions()} if self.routes is not None else {}),
            "recorded": self.recorder.recorded,
            "pending_writes": self.recorder.writer.pending(),
            "upstreams": [_replica_status(r) for r in self.router.replicas],
        }


async def _until_disconnect(
    work: Callable[[Callable], Awaitable[None]], receive: Callable, send: Callable, on_abort: Callable[[], None]
) -> None:
    """Run ``work(send)``, cancelling it if the client disconnects before the answer is complete.

    A watcher waits on ``receive()`` (the body has been read, so the next message is
    ``http.disconnect``, sent by the server when the client goes or once the answer is
    complete). A disconnect before the last body message cancels ``work``: whatever
    it awaits raises ``CancelledError``, which closes the engine connection (the
    engine then frees the request's slot), and ``on_abort`` records the call.
    """
    task = asyncio.current_task()
    state = _Watch()

    async def tracked(message: dict) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body"):
            state.complete = True
        await send(message)

    def on_message(watcher: asyncio.Future) -> None:
        if watcher.cancelled() or watcher.exception() is not None or state.complete:
            return
        if watcher.result().get("type") == "http.disconnect":
            state.disconnected = True
            task.cancel()

    watcher = asyncio.ensure_future(receive())
    watcher.add_done_callback(on_message)
    try:
        await work(tracked)
    except asyncio.CancelledError:
        if not state.disconnected:
            raise
        task.uncancel()
        on_abort()
    finally:
        state.complete = True
        watcher.cancel()


class _Watch:
    __slots__ = ("complete", "disconnected")

    def __init__(self) -> None:
        self.complete = False
        self.disconnected = False


def _json_body(body: bytes) -> dict:
    """A request body as JSON, checked by :func:`validate.check_body`; 400 for anything else."""
    try:
        req = json.loads(body)
    except ValueError as exc:
        raise GatewayError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise invalid("body", "nests too deeply", code="invalid_json") from None
    validate.check_body(req)
    return req


def _with_request_id(headers: list, request_id: str) -> list:
    """``headers`` with the answer's request id as ``x-request-id`` (OpenAI's SDK reads it) and ``request-id``
    (Anthropic's): an id already there (a 5xx's, which the log names) is kept."""
    named = {name.lower(): value for name, value in headers}
    value = named.get(b"x-request-id") or named.get(b"request-id") or request_id.encode()
    out = [(k, v) for k, v in headers if k.lower() not in (b"x-request-id", b"request-id")]
    return out + [(b"x-request-id", value), (b"request-id", value)]


def _replica_status(r: Replica) -> dict:
    return {"url": r.url, "in_flight": r.in_flight, "served_model": r.served_model}


def _timeout_s(args: dict, scope: dict) -> float | None:
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
