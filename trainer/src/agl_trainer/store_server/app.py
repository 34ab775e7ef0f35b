"""The store server's ASGI app (:func:`create_app`): its routes, bound to one store, behind its
credential check (:class:`~agl_trainer.store_server.auth.BearerAuth`) and body limit."""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio.to_thread
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import iterate_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from agl.credentials import RolloutKeys
from agl.errors import InvalidTransition, NotFound, StoreUnavailable
from agl.schema import (
    ModelVersion,
    Rollout,
)
from agl.store.base import Store
from agl.store.batch import ClaimRequest, FinishRequest, WriteBatch
from agl_trainer.http import BODY_ERRORS, DEFAULT_MAX_BODY_BYTES, BodyLimits, read_body
from agl_trainer.store_server.auth import (
    ADMIN,
    ROLLOUT,
    RUNNER,
    BearerAuth,
    Caller,
    Refused,
    StoreAuth,
    caller_of,
    redacted,
)
from agl_trainer.store_server.bodies import (
    BatchBody,
    Body,
    CancelBody,
    ClaimBody,
    ExpireBody,
    FinishBody,
    HeartbeatBody,
    LLMCallQuery,
    LLMCallsBody,
    RewardQuery,
    RewardsBody,
    RolloutQuery,
    RolloutsBody,
    SpanQuery,
    SpansBody,
    StepRecordBody,
    TaskQuery,
    TasksBody,
)
from agl_trainer.store_server.errors import CatchUnexpected, error_headers, error_item, error_payload, error_response

DEFAULT_MAX_LOCK_WAIT_S = 10.0
"""How long a SQL store behind the server keeps retrying a locked database for a caller before a
503, counted from the caller's arrival. A try under way when it runs out may add SQLite's own wait
(5 s by default), and so may the one try of a group that queued behind it: 20 s at most, under
the client's 30 s timeout."""
STREAM_CHUNK = 256
"""Models serialised per thread hop while streaming a query."""
IDEMPOTENCY_CACHE = 4096
INLINE_MAX_S = 0.005
"""A batch run on the event loop that takes longer than this sends the next ones to threads ..."""
INLINE_PAUSE_S = 1.0
"""... for this long."""


# -- helpers ----------------------------------------------------------------------
_ROLLOUT_LIST = TypeAdapter(list[Rollout])


def _json_response(body: bytes | str, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="application/json")


def _query_params(request: Request, model: type[Body]) -> dict[str, Any]:
    """Query parameters as a dict for ``model``: list fields take repeated parameters."""
    data: dict[str, Any] = {}
    for key in request.query_params:
        values = request.query_params.getlist(key)
        field = model.model_fields.get(key)
        is_list = field is not None and "list" in str(field.annotation)
        data[key] = values if is_list else values[-1]
    return data


def _ndjson(items: Iterator[BaseModel]) -> Iterator[bytes]:
    """Serialised chunks of ``STREAM_CHUNK`` models; a failure becomes a last error line."""
    buffer: list[str] = []
    try:
        for item in items:
            buffer.append(item.model_dump_json())
            if len(buffer) >= STREAM_CHUNK:
                buffer.append("")
                yield "\n".join(buffer).encode()
                buffer = []
    except Exception as exc:  # headers are sent: the error goes in the stream
        _, payload = error_payload(exc)
        buffer.append(json.dumps({"agl_stream_error": payload}))
    if buffer:
        buffer.append("")
        yield "\n".join(buffer).encode()


class _IdempotencyCache:
    """Answers of recent successful writes, by ``Idempotency-Key``."""

    def __init__(self, size: int = IDEMPOTENCY_CACHE):
        self.size = size
        self._items: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[int, bytes] | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def put(self, key: str, status: int, body: bytes) -> None:
        with self._lock:
            self._items[key] = (status, body)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


# -- the app ----------------------------------------------------------------------
class _Api:
    """The route handlers, bound to one store."""

    def __init__(self, store: Store, max_body_bytes: int):
        self.store = store
        self.max_body_bytes = max_body_bytes
        self.auth: StoreAuth | None = None  # set by create_app
        self.cache = _IdempotencyCache()
        self.inline_after = 0.0  # batches run on threads until then (see _run_batch_inline)

    def close(self) -> None:
        """Nothing to release: every batch runs on its request's thread (the store belongs to the caller)."""

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    async def body(self, request: Request, model: type[BaseModel]) -> Any:
        return model.model_validate_json(await request.body() or b"{}")  # BodyLimits bounds the body

    async def filters(self, request: Request, model: type[Body]) -> dict[str, Any]:
        if request.method == "GET":
            parsed = model.model_validate(_query_params(request, model))
        else:
            parsed = await self.body(request, model)
        return parsed.model_dump(exclude_unset=True)

    def stream(self, items: Iterator[BaseModel]) -> Response:
        return StreamingResponse(iterate_in_threadpool(_ndjson(items)), media_type="application/x-ndjson")

    def write(self, handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        """Wrap a mutating handler: answer a repeated ``Idempotency-Key`` from the cache."""

        async def wrapped(request: Request) -> Response:
            key = request.headers.get("idempotency-key")
            if key:
                hit = self.cache.get(key)
                if hit is not None:
                    return _json_response(hit[1], hit[0])
            response = await handler(request)
            if key and response.status_code == 200 and isinstance(response.body, bytes):
                self.cache.put(key, response.status_code, response.body)
            return response

        return wrapped

    # -- handlers ------------------------------------------------------------------
    async def healthz(self, request: Request) -> Response:
        return _json_response(b'{"ok":true}')

    async def stats(self, request: Request) -> Response:
        return _json_response((await self.call(self.store.stats)).model_dump_json())

    async def flush(self, request: Request) -> Response:
        await self.call(self.store.flush)
        return _json_response(b'{"ok":true}')

    async def add_tasks(self, request: Request) -> Response:
        return await self._write(request, TasksBody, self.store.add_tasks, "tasks")

    async def query_tasks(self, request: Request) -> Response:
        filters = await self.filters(request, TaskQuery)
        return self.stream(self.store.query_tasks(**filters))

    async def get_task(self, request: Request) -> Response:
        caller = caller_of(request.scope)
        if caller.scope == ROLLOUT:  # its own rollout's task only (agl run --rollout-id reads it)
            own = await self.call(self.store.get_rollout, caller.rollout_id)
            if request.path_params["task_id"] != own.task_id:
                raise Refused(403, "task_id: a rollout key reads its own rollout's task only")
        task = await self.call(self.store.get_task, request.path_params["task_id"])
        return _json_response(task.model_dump_json())

    async def enqueue(self, request: Request) -> Response:
        body = await self.body(request, RolloutsBody)
        rollouts = await self.call(self.store.enqueue, body.rollouts)
        return _json_response(b'{"rollouts":' + _ROLLOUT_LIST.dump_json(rollouts) + b"}")

    async def query_rollouts(self, request: Request) -> Response:
        filters = await self.filters(request, RolloutQuery)
        if caller_of(request.scope).scope == RUNNER:  # the status of rollouts it holds, nothing more
            if not filters.get("rollout_ids"):
                raise Refused(403, "rollout_ids: a runner token may ask only about rollouts it names")
            return self.stream(map(redacted, self.store.query_rollouts(**filters)))
        return self.stream(self.store.query_rollouts(**filters))

    async def get_rollout(self, request: Request) -> Response:
        self._own(request, "path")
        rollout = await self.call(self.store.get_rollout, request.path_params["rollout_id"])
        return _json_response(rollout.model_dump_json())

    async def attempts(self, request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        attempts = await self.call(self.store.attempts, rollout_id)
        if not attempts:
            await self.call(self.store.get_rollout, rollout_id)  # 404 for an unknown rollout
        return _json_response('{"attempts":[' + ",".join(a.model_dump_json() for a in attempts) + "]}")

    async def finish(self, request: Request) -> Response:
        self._own(request, "path")
        body = await self.body(request, FinishBody)
        rollout = await self.call(
            self.store.finish,
            request.path_params["rollout_id"],
            body.status,
            error=body.error,
            output=body.output,
            attempt=body.attempt,
        )
        return _json_response(rollout.model_dump_json())

    async def claim(self, request: Request) -> Response:
        body = await self.body(request, ClaimBody)
        rollouts = await self.call(self.store.claim, body.runner_id, limit=body.limit, claim_id=body.claim_id)
        return _json_response(self._claimed(rollouts))

    async def heartbeat(self, request: Request) -> Response:
        body = await self.body(request, HeartbeatBody)
        for rid in body.rollout_ids:
            self.auth.check_rollout(caller_of(request.scope), rid, "rollout_ids")
        await self.call(self.store.heartbeat, body.rollout_ids, body.runner_id)
        return _json_response(b'{"ok":true}')

    async def cancel(self, request: Request) -> Response:
        return await self._write(request, CancelBody, self.store.cancel, "rollout_ids")

    async def _write(
        self, request: Request, model: type[Body], method: Callable[..., Any], field: str, observations: bool = False
    ) -> Response:
        """A write answered ``{"ok": true}``: ``method(body.<field>)``; ``observations`` (spans, LLM
        calls, rewards) are first checked against the caller's scope."""
        body = await self.body(request, model)
        items = getattr(body, field)
        if observations:
            await self._check_observations(caller_of(request.scope), items, field)
        await self.call(method, items)
        return _json_response(b'{"ok":true}')

    async def expire(self, request: Request) -> Response:
        body = await self.body(request, ExpireBody)
        rollouts = await self.call(self.store.expire, heartbeat_timeout_s=body.heartbeat_timeout_s, now=body.now)
        return _json_response(b'{"rollouts":' + _ROLLOUT_LIST.dump_json(rollouts) + b"}")

    async def add_spans(self, request: Request) -> Response:
        return await self._write(request, SpansBody, self.store.add_spans, "spans", observations=True)

    async def add_llm_calls(self, request: Request) -> Response:
        return await self._write(request, LLMCallsBody, self.store.add_llm_calls, "llm_calls", observations=True)

    async def add_rewards(self, request: Request) -> Response:
        return await self._write(request, RewardsBody, self.store.add_rewards, "rewards", observations=True)

    async def query_spans(self, request: Request) -> Response:
        return self.stream(self.store.query_spans(**await self.filters(request, SpanQuery)))

    async def query_llm_calls(self, request: Request) -> Response:
        return self.stream(self.store.query_llm_calls(**await self.filters(request, LLMCallQuery)))

    async def query_rewards(self, request: Request) -> Response:
        return self.stream(self.store.query_rewards(**await self.filters(request, RewardQuery)))

    async def add_model_version(self, request: Request) -> Response:
        version = await self.body(request, ModelVersion)
        await self.call(self.store.add_model_version, version)
        return _json_response(b'{"ok":true}')

    async def latest_model_version(self, request: Request) -> Response:
        version = await self.call(self.store.latest_model_version)
        return _json_response(b"null" if version is None else version.model_dump_json())

    async def get_model_version(self, request: Request) -> Response:
        version = await self.call(self.store.get_model_version, request.path_params["version"])
        return _json_response(version.model_dump_json())

    async def add_step_record(self, request: Request) -> Response:
        body = await self.body(request, StepRecordBody)
        await self.call(self.store.add_step_record, body.run_id, body.record)
        return _json_response(b'{"ok":true}')

    async def step_records(self, request: Request) -> Response:
        records = await self.call(self.store.step_records, request.query_params.get("run_id"))
        return JSONResponse({"records": records})

    async def batch(self, request: Request) -> Response:
        body = await self.body(request, BatchBody)
        await self.call(self._check_batch, caller_of(request.scope), body)
        return _json_response(await self.call(self._run_batch, body))

    def _check_batch(self, caller: Caller, body: BatchBody) -> None:
        """A batch within its caller's scope: a rollout key writes and finishes its own rollout only."""
        if caller.scope == ADMIN:
            return
        if caller.scope != RUNNER and body.claims:
            raise Refused(403, "claims: a rollout key cannot claim rollouts")
        for item in body.finishes:
            self.auth.check_rollout(caller, item.rollout_id, "finishes")
        for kind in ("spans", "llm_calls", "rewards"):
            items = getattr(body, kind)
            if items:
                self.auth.check_observations(caller, items, kind)

    def _own(self, request: Request, where: str) -> None:
        self.auth.check_rollout(caller_of(request.scope), request.path_params["rollout_id"], where)

    def _claimed(self, rollouts: list[Rollout]) -> bytes:
        """A claim's answer: the rollouts, and each one's key when the server has the key secret."""
        keys = self.auth.claim_keys(rollouts) if self.auth is not None else None
        tail = b"}" if keys is None else b',"keys":' + json.dumps(keys).encode() + b"}"
        return b'{"rollouts":' + _ROLLOUT_LIST.dump_json(rollouts) + tail

    def raw(self, answer: Callable[[Caller, bytes], Awaitable[bytes]]) -> Callable[..., Awaitable[None]]:
        """A hot write route as a plain ASGI handler, past the credential check: the routes every
        runner and gateway send to on each step, so they skip the framework's router, request and
        response objects. Same answers as a route: ``answer(caller, body)`` gives the 200 body, an
        exception its error (:func:`error_payload`), a repeated ``Idempotency-Key`` the cached answer."""

        async def handler(scope, receive, send) -> None:
            key = b""
            for name, value in scope["headers"]:
                if name == b"idempotency-key":
                    key = value
            status, out = 200, b""
            extra: list[tuple[bytes, bytes]] = []
            hit = self.cache.get(key.decode("latin-1")) if key else None
            if hit is not None:
                status, out = hit
            else:
                try:
                    raw = await read_body(receive, self.max_body_bytes)  # its length checked by BodyLimits
                    out = await answer(caller_of(scope), raw or b"{}")
                    if key:
                        self.cache.put(key.decode("latin-1"), 200, out)
                except ClientDisconnect:
                    return
                except Exception as exc:
                    status, payload = error_payload(exc)
                    out = json.dumps({"error": payload}).encode()
                    extra = [(k.lower().encode(), v.encode()) for k, v in error_headers(status, payload).items()]
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())]
            await send({"type": "http.response.start", "status": status, "headers": headers + extra})
            await send({"type": "http.response.body", "body": out})

        return handler

    def raw_routes(self) -> dict[tuple[str, str], Callable[..., Awaitable[None]]]:
        """``(method, path)`` of the hot routes, each as a plain ASGI handler (see :meth:`raw`)."""
        observed = {"spans": (SpansBody, self.store.add_spans), "llm_calls": (LLMCallsBody, self.store.add_llm_calls)}
        observed["rewards"] = (RewardsBody, self.store.add_rewards)
        routes = {("POST", "/v1/batch"): self.raw(self._batch_answer)}
        routes["POST", "/v1/claims"] = self.raw(self._claim_answer)
        for field, (model, method) in observed.items():
            routes["POST", f"/v1/{field}"] = self.raw(self._observations_answer(model, field, method))
        return routes

    async def _batch_answer(self, caller: Caller, raw: bytes) -> bytes:
        body = BatchBody.model_validate_json(raw)
        if caller.scope != ADMIN:
            await self.call(self._check_batch, caller, body)
        if time.monotonic() >= self.inline_after and self.store.writer_idle():
            return self._run_batch_inline(body)
        return await self.call(self._run_batch, body)

    async def _claim_answer(self, caller: Caller, raw: bytes) -> bytes:
        body = ClaimBody.model_validate_json(raw)
        rollouts = await self.call(self.store.claim, body.runner_id, limit=body.limit, claim_id=body.claim_id)
        return self._claimed(rollouts)

    def _observations_answer(
        self, model: type[Body], field: str, method: Callable[..., Any]
    ) -> Callable[[Caller, bytes], Awaitable[bytes]]:
        async def answer(caller: Caller, raw: bytes) -> bytes:
            items = getattr(model.model_validate_json(raw), field)
            await self._check_observations(caller, items, field)
            await self.call(method, items)
            return b'{"ok":true}'

        return answer

    async def _check_observations(self, caller: Caller, items: list[Any], field: str) -> None:
        if caller.scope == RUNNER:  # looks up the rollouts' status: a thread, as every store call
            await self.call(self.auth.check_observations, caller, items, field)
        else:  # the admin's and a rollout key's need no store: checked here, without a thread hop
            self.auth.check_observations(caller, items, field)

    def _run_batch_inline(self, body: BatchBody) -> bytes:
        """Run a batch on the event loop: when the store's writer is idle it commits at once,
        which is quicker than two thread hand-offs. If it took long all the same (the
        database locked by another process), batches go to threads for a while, so the
        loop is held up once, not on every request."""
        started = time.monotonic()
        try:
            return self._run_batch(body)
        finally:
            if time.monotonic() - started > INLINE_MAX_S:
                self.inline_after = time.monotonic() + INLINE_PAUSE_S

    def _run_batch(self, body: BatchBody) -> bytes:
        """Hand every part of a batch to the store at once (a SQL store commits them as one group)."""
        batch = WriteBatch(
            spans=body.spans,
            llm_calls=body.llm_calls,
            rewards=body.rewards,
            claims=[ClaimRequest(c.runner_id, c.limit, c.claim_id) for c in body.claims],
            finishes=[FinishRequest(f.rollout_id, f.status, f.error, f.output, f.attempt) for f in body.finishes],
        )
        outcome = self.store.write_batch(batch)
        claims = (error_item(got) if isinstance(got, Exception) else self._claimed(got) for got in outcome.claims)
        finishes = (
            error_item(done) if isinstance(done, Exception) else b'{"rollout":' + done.model_dump_json().encode() + b"}"
            for done in outcome.finishes
        )
        return b'{"claims":[' + b",".join(claims) + b'],"finishes":[' + b",".join(finishes) + b"]}"

    def routes(self) -> list[BaseRoute]:
        w = self.write
        return [
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/v1/stats", self.stats, methods=["GET"]),
            Route("/v1/flush", self.flush, methods=["POST"]),
            Route("/v1/batch", w(self.batch), methods=["POST"]),
            Route("/v1/tasks", w(self.add_tasks), methods=["POST"]),
            Route("/v1/tasks/query", self.query_tasks, methods=["GET", "POST"]),
            Route("/v1/tasks/{task_id:path}", self.get_task, methods=["GET"]),
            Route("/v1/rollouts", w(self.enqueue), methods=["POST"]),
            Route("/v1/rollouts/query", self.query_rollouts, methods=["GET", "POST"]),
            Route("/v1/rollouts/{rollout_id:path}/attempts", self.attempts, methods=["GET"]),
            Route("/v1/rollouts/{rollout_id:path}/finish", w(self.finish), methods=["POST"]),
            Route("/v1/rollouts/{rollout_id:path}", self.get_rollout, methods=["GET"]),
            Route("/v1/claims", w(self.claim), methods=["POST"]),
            Route("/v1/heartbeats", self.heartbeat, methods=["POST"]),
            Route("/v1/cancellations", w(self.cancel), methods=["POST"]),
            Route("/v1/expirations", w(self.expire), methods=["POST"]),
            Route("/v1/spans", w(self.add_spans), methods=["POST"]),
            Route("/v1/spans/query", self.query_spans, methods=["GET", "POST"]),
            Route("/v1/llm_calls", w(self.add_llm_calls), methods=["POST"]),
            Route("/v1/llm_calls/query", self.query_llm_calls, methods=["GET", "POST"]),
            Route("/v1/rewards", w(self.add_rewards), methods=["POST"]),
            Route("/v1/rewards/query", self.query_rewards, methods=["GET", "POST"]),
            Route("/v1/model_versions", w(self.add_model_version), methods=["POST"]),
            Route("/v1/run_steps", w(self.add_step_record), methods=["POST"]),
            Route("/v1/run_steps", self.step_records, methods=["GET"]),
            Route("/v1/model_versions/latest", self.latest_model_version, methods=["GET"]),
            Route("/v1/model_versions/{version:path}", self.get_model_version, methods=["GET"]),
        ]


def _plugin_routes(store: Store) -> list[BaseRoute]:
    from agl.plugins import hook

    routes: list[BaseRoute] = []
    for extra in hook().agl_store_routes(store=store):
        routes.extend(extra or [])
    return routes


def _bound_lock_wait(store: Store, max_lock_wait_s: float | None) -> None:
    if max_lock_wait_s is not None and (store.max_wait_s is None or store.max_wait_s > max_lock_wait_s):
        store.max_wait_s = max_lock_wait_s


def create_app(
    store: Store,
    *,
    token: str,
    runner_token: str | None = None,
    keys: RolloutKeys | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_lock_wait_s: float | None = DEFAULT_MAX_LOCK_WAIT_S,
) -> Any:
    """The ASGI app serving ``store``: the routes in :mod:`agl_trainer.store_server` plus plugin routes.

    ``token`` is the admin's bearer token (every route but ``/healthz`` requires a
    credential); ``runner_token`` the runners' and ``keys`` the secret of rollout keys,
    which claims hand out and which open their own rollout only (see
    :mod:`agl_trainer.store_server.auth`). ``max_body_bytes``
    bounds every request body, before and after decompression (413 beyond).
    ``max_lock_wait_s`` bounds how long a SQL store retries a locked database before the
    request is answered 503 (it lowers the store's ``max_wait_s``; None leaves it).
    The app's ``routes`` lists every route it serves (starlette routes), the dashboard's too.
    """
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes: must be positive, got {max_body_bytes}")
    if max_lock_wait_s is not None and max_lock_wait_s < 0:
        raise ValueError(f"max_lock_wait_s: must be at least 0, got {max_lock_wait_s}")
    _bound_lock_wait(store, max_lock_wait_s)
    api = _Api(store, max_body_bytes)
    api.auth = StoreAuth(store, token=token, runner_token=runner_token, keys=keys)
    handlers = {
        Refused: lambda request, exc: error_response(exc),
        ValidationError: lambda request, exc: error_response(exc),
        NotFound: lambda request, exc: error_response(exc),
        InvalidTransition: lambda request, exc: error_response(exc),
        StoreUnavailable: lambda request, exc: error_response(exc),
        **{kind: lambda request, exc: error_response(exc) for kind in BODY_ERRORS},
        RecursionError: lambda request, exc: error_response(exc),
        ValueError: lambda request, exc: error_response(exc),
    }
    app = Starlette(
        routes=[*api.routes(), *_plugin_routes(store)],
        exception_handlers=handlers,
        middleware=[Middleware(CatchUnexpected)],
    )
    app.state.store = store
    limited = BodyLimits(app, max_body_bytes, error_response)
    fast = {route: BodyLimits(handler, max_body_bytes, error_response) for route, handler in api.raw_routes().items()}
    auth = BearerAuth(limited, token, fast_routes=fast, auth=api.auth)
    auth.close = api.close
    auth.routes = app.routes
    from agl_trainer.dashboard import MAX_BODY_BYTES, with_dashboard  # the web pages under /ui, their own token check

    return with_dashboard(auth, store, token=token, max_body_bytes=min(max_body_bytes, MAX_BODY_BYTES))
