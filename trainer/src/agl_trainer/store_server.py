"""The store over HTTP: a JSON API that exposes every :class:`agl.store.Store` method.

``agl store serve`` runs it; :class:`agl.store.http.HttpStore` is its client. Its request
bodies are in :mod:`agl_trainer.store_bodies`, its error answers in
:mod:`agl_trainer.store_errors` and its limit on bodies in :mod:`agl_trainer.body_limits`.

Every route except ``/healthz`` needs ``Authorization: Bearer <credential>`` (the
scheme in any case): the admin token opens every route, a runner token what running
rollouts needs, a rollout key its own rollout only (:mod:`agl_trainer.store_auth`).
Bodies are JSON; queries answer NDJSON (one model per line), streamed straight
from the store's iterators, so reading a million spans never holds them all.

Routes (``{x}`` is a path parameter; "list body" means ``{"<name>": [ ... ]}``):

==========  ===================================  =============================================
method      path                                 store method / answer
==========  ===================================  =============================================
GET         /healthz                             ``{"ok": true}`` (no token needed)
GET         /v1/stats                            ``stats()``
POST        /v1/flush                            ``flush()``
POST        /v1/tasks                            ``add_tasks``; list body ``tasks``
GET|POST    /v1/tasks/query                      ``query_tasks``; NDJSON of tasks
GET         /v1/tasks/{task_id}                  ``get_task``
POST        /v1/rollouts                         ``enqueue``; list body ``rollouts``
GET|POST    /v1/rollouts/query                   ``query_rollouts``; NDJSON of rollouts
GET         /v1/rollouts/{rollout_id}            ``get_rollout``
GET         /v1/rollouts/{rollout_id}/attempts   ``attempts``; ``{"attempts": [...]}``
POST        /v1/rollouts/{rollout_id}/finish     ``finish``; ``{"status", "error", "output"}``
POST        /v1/claims                           ``claim``; ``{"runner_id", "limit", "claim_id"}``
POST        /v1/heartbeats                       ``heartbeat``; ``{"runner_id", "rollout_ids"}``
POST        /v1/cancellations                    ``cancel``; ``{"rollout_ids"}``
POST        /v1/expirations                      ``expire``; ``{"heartbeat_timeout_s", "now"}``
POST        /v1/spans | /v1/llm_calls | /v1/rewards   ``add_*``; list body of that name
GET|POST    /v1/spans/query (and llm_calls, rewards)  ``query_*``; NDJSON
POST        /v1/model_versions                   ``add_model_version``; the model version
GET         /v1/model_versions/latest            ``latest_model_version`` (``null`` if none)
GET         /v1/model_versions/{version}         ``get_model_version``
POST|GET    /v1/run_steps                        ``add_step_record`` (``{"run_id", "record"}``) / ``step_records``
POST        /v1/batch                            several callers' writes in one request
==========  ===================================  =============================================

Ids in paths may contain ``/`` (``task-set/17``), percent-encoded or not; the
fixed routes (``/v1/tasks/query``, ``/v1/model_versions/latest``) take precedence.
Query filters come as a JSON body (POST) or as query parameters (GET, lists as
repeated parameters: ``?status=queued&status=running``); both are validated by
the same model. ``/v1/batch`` is what the client's write coalescing sends:
``{"spans": [...], "llm_calls": [...], "rewards": [...], "claims": [{runner_id,
limit, claim_id}], "finishes": [{rollout_id, status, error, output, attempt}]}``; the
observations are stored together and the answer has one result per claim and
per finish, each ``{"rollouts": [...]}`` / ``{"rollout": {...}}`` or
``{"error": {...}}``, so one caller's unknown rollout fails only that caller.
When the SQL store's writer is idle, a batch runs on the event loop (it commits at
once, sparing two thread hand-offs); otherwise, and for a second after one of those
took over ``INLINE_MAX_S``, it runs on a worker thread.

Errors answer ``{"error": {"type", "field", "reason", ...}}``: 401 without a valid
credential (or with a rollout key whose attempt ended), 403 for a route or a rollout
outside the credential's scope, 404 for an unknown id (``NotFound``, with ``kind`` and ``ident``),
409 for a status change the status machine forbids (``InvalidTransition``, naming
the rollout's status), 413 for a body over the limit (``max_body_bytes``, on every
route, plugin routes included; a ``gzip`` or ``deflate`` body is inflated as it is
read and may not inflate past the same limit), 415 for another
``Content-Encoding``, 422 for a body that fails validation (``field`` is the
dotted path of the first bad value: NaN, infinity, integers past 64 bits and JSON
nested past :data:`agl.schema.MAX_JSON_DEPTH` are refused), 503 with
``Retry-After`` when the database stays unavailable (a locked SQLite database is
waited on for at most ``max_lock_wait_s``, less than the client's timeout).
A 5xx names no path, URL or database message: those go to the server's log
under a request id, which the answer gives in its body (``request_id``) and in
an ``X-Request-Id`` header.
A query that fails after its first line ends with one line ``{"agl_stream_error":
{...}}``. Writes are idempotent by id; an ``Idempotency-Key`` header additionally
lets the server answer a retried request from a small cache of recent answers.

Late data: a span, LLM call or reward for a rollout that already ended is stored
like any other and shows in every later query; nothing is dropped.

Expiry: the server takes back the rollouts of runners gone silent (no heartbeat for
``heartbeat_timeout_s``, 60 s by default) every ``expire_every_s`` (10 s), so they do
not stay ``running`` when no trainer calls ``expire`` (see :mod:`agl_trainer.store_expiry`).

Dashboard: under ``/ui`` the server serves the web pages of :mod:`agl_trainer.dashboard` (a
SQLite or PostgreSQL store), which take the admin token as a bearer token or through a login
form's cookie; ``/v1/run_steps`` holds the trainer's step records they chart.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
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
from agl_trainer.body_limits import BodyLimits, read_whole
from agl_trainer.store_auth import ADMIN, ROLLOUT, RUNNER, Caller, Refused, StoreAuth, redacted
from agl_trainer.store_bodies import (
    BatchBody,
    Body,
    CancelBody,
    ClaimBody,
    ExpireBody,
    FinishBody,
    FinishItem,
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
from agl_trainer.store_errors import (
    BadEncoding,
    BodyTooLarge,
    UnsupportedEncoding,
    error_headers,
    error_item,
    error_payload,
    error_response,
)
from agl_trainer.store_expiry import DEFAULT_HEARTBEAT_TIMEOUT_S, Expirer
from agl_trainer.store_expiry import DEFAULT_INTERVAL_S as DEFAULT_EXPIRE_EVERY_S

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
"""The largest request body, and the most a compressed body may inflate to (413 beyond)."""
DEFAULT_MAX_LOCK_WAIT_S = 10.0
"""How long a SQL store behind the server keeps retrying a locked database for a caller before a
503, counted from the caller's arrival. A try under way when it runs out may add SQLite's own wait
(5 s by default), and so may the one try of a group that queued behind it: 20 s at most, under
the client's 30 s timeout."""
STREAM_CHUNK = 256
"""Models serialised per thread hop while streaming a query."""
IDEMPOTENCY_CACHE = 4096
BATCH_WORKERS = 64
"""Threads that run the parts of ``/v1/batch`` requests side by side."""
INLINE_MAX_S = 0.005
"""A batch run on the event loop that takes longer than this sends the next ones to threads ..."""
INLINE_PAUSE_S = 1.0
"""... for this long."""


# -- helpers ----------------------------------------------------------------------
_ROLLOUT_LIST = TypeAdapter(list[Rollout])


def _json_response(body: bytes | str, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="application/json")


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


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
_BATCHED_METHODS = ("add_spans", "add_llm_calls", "add_rewards", "claim", "finish")


def _batch_writer(store: Store) -> Callable[..., Any] | None:
    """The store's own way to queue a whole batch at once (SQL stores), unless a subclass
    changed one of the methods a batch stands for: then each part goes through that method."""
    from agl.store.sql import SqlStore

    if not isinstance(store, SqlStore):
        return None
    cls = type(store)
    if any(getattr(cls, name) is not getattr(SqlStore, name) for name in _BATCHED_METHODS):
        return None
    return store._write_batch


class _Api:
    """The route handlers, bound to one store."""

    def __init__(self, store: Store, max_body_bytes: int):
        self.store = store
        self.max_body_bytes = max_body_bytes
        self.auth: StoreAuth | None = None  # set by create_app
        self.cache = _IdempotencyCache()
        self.pool = ThreadPoolExecutor(max_workers=BATCH_WORKERS, thread_name_prefix="agl-store-batch")
        self.together = _batch_writer(store)
        self.inline_after = 0.0  # batches run on threads until then (see _run_batch_inline)

    def close(self) -> None:
        """Stop the batch threads (the store itself belongs to the caller)."""
        self.pool.shutdown(wait=True)

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    async def body(self, request: Request, model: type[Body]) -> Any:
        raw = await _read_body(request, self.max_body_bytes)
        return model.model_validate_json(raw or b"{}")

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
        body = await self.body(request, TasksBody)
        await self.call(self.store.add_tasks, body.tasks)
        return _json_response(b'{"ok":true}')

    async def query_tasks(self, request: Request) -> Response:
        filters = await self.filters(request, TaskQuery)
        return self.stream(self.store.query_tasks(**filters))

    async def get_task(self, request: Request) -> Response:
        caller = _caller(request.scope)
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
        if _caller(request.scope).scope == RUNNER:  # the status of rollouts it holds, nothing more
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
            self.auth.check_rollout(_caller(request.scope), rid, "rollout_ids")
        await self.call(self.store.heartbeat, body.rollout_ids, body.runner_id)
        return _json_response(b'{"ok":true}')

    async def cancel(self, request: Request) -> Response:
        body = await self.body(request, CancelBody)
        await self.call(self.store.cancel, body.rollout_ids)
        return _json_response(b'{"ok":true}')

    async def expire(self, request: Request) -> Response:
        body = await self.body(request, ExpireBody)
        rollouts = await self.call(self.store.expire, heartbeat_timeout_s=body.heartbeat_timeout_s, now=body.now)
        return _json_response(b'{"rollouts":' + _ROLLOUT_LIST.dump_json(rollouts) + b"}")

    async def add_spans(self, request: Request) -> Response:
        body = await self.body(request, SpansBody)
        await self.call(self.auth.check_observations, _caller(request.scope), body.spans, "spans")
        await self.call(self.store.add_spans, body.spans)
        return _json_response(b'{"ok":true}')

    async def add_llm_calls(self, request: Request) -> Response:
        body = await self.body(request, LLMCallsBody)
        await self.call(self.auth.check_observations, _caller(request.scope), body.llm_calls, "llm_calls")
        await self.call(self.store.add_llm_calls, body.llm_calls)
        return _json_response(b'{"ok":true}')

    async def add_rewards(self, request: Request) -> Response:
        body = await self.body(request, RewardsBody)
        await self.call(self.auth.check_observations, _caller(request.scope), body.rewards, "rewards")
        await self.call(self.store.add_rewards, body.rewards)
        return _json_response(b'{"ok":true}')

    async def query_spans(self, request: Request) -> Response:
        return self.stream(self.store.query_spans(**await self.filters(request, SpanQuery)))

    async def query_llm_calls(self, request: Request) -> Response:
        return self.stream(self.store.query_llm_calls(**await self.filters(request, LLMCallQuery)))

    async def query_rewards(self, request: Request) -> Response:
        return self.stream(self.store.query_rewards(**await self.filters(request, RewardQuery)))

    async def add_model_version(self, request: Request) -> Response:
        raw = await _read_body(request, self.max_body_bytes)
        version = ModelVersion.model_validate_json(raw or b"{}")
        await self.call(self.store.add_model_version, version)
        return _json_response(b'{"ok":true}')

    async def latest_model_version(self, request: Request) -> Response:
        version = await self.call(self.store.latest_model_version)
        return _json_response(b"null" if version is None else version.model_dump_json())

    async def get_model_version(self, request: Request) -> Response:
        version = await self.call(self.store.get_model_version, request.path_params["version"])
        return _json_response(version.model_dump_json())

    async def add_step_record(self, request: Request) -> Response:
        body = StepRecordBody.model_validate_json(await _read_body(request, self.max_body_bytes) or b"{}")
        await self.call(self.store.add_step_record, body.run_id, body.record)
        return _json_response(b'{"ok":true}')

    async def step_records(self, request: Request) -> Response:
        records = await self.call(self.store.step_records, request.query_params.get("run_id"))
        return JSONResponse({"records": records})

    async def batch(self, request: Request) -> Response:
        body = await self.body(request, BatchBody)
        await self.call(self._check_batch, _caller(request.scope), body)
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
        self.auth.check_rollout(_caller(request.scope), request.path_params["rollout_id"], where)

    def _claimed(self, rollouts: list[Rollout]) -> bytes:
        """A claim's answer: the rollouts, and each one's key when the server has the key secret."""
        keys = self.auth.claim_keys(rollouts) if self.auth is not None else None
        tail = b"}" if keys is None else b',"keys":' + json.dumps(keys).encode() + b"}"
        return b'{"rollouts":' + _ROLLOUT_LIST.dump_json(rollouts) + tail

    async def raw_batch(self, scope, receive, send) -> None:
        """``POST /v1/batch`` as a plain ASGI handler: the hot path of every runner, so it
        skips the framework's request and response objects (same answers as the route)."""
        key = b""
        declared = None
        for name, value in scope["headers"]:
            if name == b"idempotency-key":
                key = value
            elif name == b"content-length":
                declared = value
        status, out = 200, b""
        extra: list[tuple[bytes, bytes]] = []
        hit = self.cache.get(key.decode("latin-1")) if key else None
        if hit is not None:
            status, out = hit
        else:
            try:
                if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
                raw = await read_whole(receive, self.max_body_bytes)
                if raw is None:
                    return
                body = BatchBody.model_validate_json(raw or b"{}")
                caller = _caller(scope)
                if caller.scope != ADMIN:
                    await self.call(self._check_batch, caller, body)
                if self.together is not None and time.monotonic() >= self.inline_after and self.store._writer_free():
                    out = self._run_batch_inline(body)
                else:
                    out = await self.call(self._run_batch, body)
                if key:
                    self.cache.put(key.decode("latin-1"), 200, out)
            except Exception as exc:
                status, payload = error_payload(exc)
                out = json.dumps({"error": payload}).encode()
                extra = [(k.lower().encode(), v.encode()) for k, v in error_headers(status, payload).items()]
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())]
                + extra,
            }
        )
        await send({"type": "http.response.body", "body": out})

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
        """Run every part of a batch at once, so the store's writer commits them as one group."""
        store, pool = self.store, self.pool
        together = self.together
        if together is not None:  # a SQL store queues every part in one go, on this thread
            claimed, finished = together(
                spans=body.spans,
                llm_calls=body.llm_calls,
                rewards=body.rewards,
                claims=[(c.runner_id, c.limit, c.claim_id) for c in body.claims],
                finishes=[(f.rollout_id, f.status, f.error, f.output, f.attempt) for f in body.finishes],
            )
            return (
                b'{"claims":['
                + b",".join(
                    error_item(got) if isinstance(got, BaseException) else self._claimed(got) for got in claimed
                )
                + b'],"finishes":['
                + b",".join(
                    error_item(done)
                    if isinstance(done, BaseException)
                    else b'{"rollout":' + done.model_dump_json().encode() + b"}"
                    for done in finished
                )
                + b"]}"
            )
        writes = []
        if body.spans:
            writes.append(pool.submit(store.add_spans, body.spans))
        if body.llm_calls:
            writes.append(pool.submit(store.add_llm_calls, body.llm_calls))
        if body.rewards:
            writes.append(pool.submit(store.add_rewards, body.rewards))
        claims = [pool.submit(self._claim_one, item) for item in body.claims]
        finishes = [pool.submit(self._finish_one, item) for item in body.finishes]
        for write in writes:
            write.result()  # a failed observation write fails the request: the client retries all of it
        return (
            b'{"claims":['
            + b",".join(f.result() for f in claims)
            + b'],"finishes":['
            + b",".join(f.result() for f in finishes)
            + b"]}"
        )

    def _claim_one(self, item: ClaimBody) -> bytes:
        try:
            got = self.store.claim(item.runner_id, limit=item.limit, claim_id=item.claim_id)
        except Exception as exc:
            return error_item(exc)
        return self._claimed(got)

    def _finish_one(self, item: FinishItem) -> bytes:
        try:
            done = self.store.finish(
                item.rollout_id, item.status, error=item.error, output=item.output, attempt=item.attempt
            )
        except Exception as exc:
            return error_item(exc)
        return b'{"rollout":' + done.model_dump_json().encode() + b"}"

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


def _caller(scope: dict) -> Caller:
    """Who sent the request (set by :class:`BearerAuth`; the admin for an app used without it)."""
    return scope.get("agl.caller") or _ADMIN


_ADMIN = Caller(ADMIN)


class BearerAuth:
    """ASGI middleware: every HTTP request but those under ``open_paths`` needs a credential,
    and gets only the routes of its scope (see :mod:`agl_trainer.store_auth`)."""

    def __init__(
        self,
        app: Any,
        token: str,
        open_paths: frozenset[str] = frozenset({"/healthz"}),
        fast_routes: dict[tuple[str, str], Callable[..., Any]] | None = None,
        auth: StoreAuth | None = None,
    ):
        if not token:
            raise ValueError("token: the store server needs a non-empty bearer token")
        self.app = app
        self.auth = auth or StoreAuth(None, token=token)  # type: ignore[arg-type]
        self.open_paths = open_paths
        self.fast_routes = fast_routes or {}  # (method, path) -> a plain ASGI handler, past the token check

    async def _refuse(self, scope, receive, send, status: int, reason: str) -> None:
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        kind = "Unauthorized" if status == 401 else "Forbidden"
        response = JSONResponse(
            {"error": {"type": kind, "field": "Authorization", "reason": reason}}, status_code=status, headers=headers
        )
        await response(scope, receive, send)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            caller = self.auth.identify(scope["headers"])
            if caller is None:
                given = any(name == b"authorization" for name, _ in scope["headers"])
                reason = "wrong bearer token" if given else "missing bearer token"
                return await self._refuse(scope, receive, send, 401, reason)
            if not self.auth.allows_route(caller, scope["method"], scope["path"]):
                reason = f"{scope['method']} {scope['path']} is outside the {caller.scope} scope of this credential"
                return await self._refuse(scope, receive, send, 403, reason)
            if caller.rollout_id is not None:
                try:
                    await anyio.to_thread.run_sync(self.auth.check_live, caller)
                except Refused as exc:
                    return await self._refuse(scope, receive, send, exc.status, exc.reason)
            scope["agl.caller"] = caller
            fast = self.fast_routes.get((scope["method"], scope["path"]))
            if fast is not None:
                await fast(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _Unexpected:
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


def _plugin_routes(store: Store) -> list[BaseRoute]:
    from agl.plugins import hook

    routes: list[BaseRoute] = []
    for extra in hook().agl_store_routes(store=store):
        routes.extend(extra or [])
    return routes


def _bound_lock_wait(store: Store, max_lock_wait_s: float | None) -> None:
    from agl.store.sql import SqlStore

    if (
        max_lock_wait_s is not None
        and isinstance(store, SqlStore)
        and (store.max_wait_s is None or store.max_wait_s > max_lock_wait_s)
    ):
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
    """The ASGI app serving ``store``: the routes in this module's docstring plus plugin routes.

    ``token`` is the admin's bearer token (every route but ``/healthz`` requires a
    credential); ``runner_token`` the runners' and ``keys`` the secret of rollout keys,
    which claims hand out and which open their own rollout only (see
    :mod:`agl_trainer.store_auth`). ``max_body_bytes``
    bounds every request body, before and after decompression (413 beyond).
    ``max_lock_wait_s`` bounds how long a SQL store retries a locked database before the
    request is answered 503 (it lowers the store's ``max_wait_s``; None leaves it).
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
        BodyTooLarge: lambda request, exc: error_response(exc),
        UnsupportedEncoding: lambda request, exc: error_response(exc),
        BadEncoding: lambda request, exc: error_response(exc),
        RecursionError: lambda request, exc: error_response(exc),
        ValueError: lambda request, exc: error_response(exc),
    }
    app = Starlette(
        routes=[*api.routes(), *_plugin_routes(store)],
        exception_handlers=handlers,
        middleware=[Middleware(_Unexpected)],
    )
    app.state.store = store
    limited = BodyLimits(app, max_body_bytes)
    auth = BearerAuth(
        limited, token, fast_routes={("POST", "/v1/batch"): BodyLimits(api.raw_batch, max_body_bytes)}, auth=api.auth
    )
    auth.close = api.close
    from agl_trainer.dashboard import with_dashboard  # the web pages under /ui, their own token check

    return with_dashboard(auth, store, token=token)


def _expirer(store: Store, expire_every_s: float | None, heartbeat_timeout_s: float) -> Expirer | None:
    """The server's expiry of silent runners' rollouts (see :mod:`agl_trainer.store_expiry`); None turns it off."""
    if expire_every_s is None or expire_every_s == 0:
        return None
    return Expirer(store, interval_s=expire_every_s, heartbeat_timeout_s=heartbeat_timeout_s)


class ServerThread:
    """A store server in a background thread of this process (tests, embedding).

    ``with ServerThread(store, token=...) as server:`` starts uvicorn on
    ``host``:``port`` (port 0 picks a free one; ``server.url`` tells it) and stops
    it on exit. ``middleware`` wraps the ASGI app (fault injection in tests).
    Every ``expire_every_s`` (None or 0: never) rollouts whose runner has not sent a
    heartbeat for ``heartbeat_timeout_s`` are taken back (:mod:`agl_trainer.store_expiry`).
    """

    def __init__(
        self,
        store: Store,
        *,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        middleware: Callable[[Any], Any] | None = None,
        expire_every_s: float | None = DEFAULT_EXPIRE_EVERY_S,
        heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
        **app_options: Any,
    ):
        import socket

        import uvicorn

        self.token = token
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = self.sock.getsockname()[:2]
        app = create_app(store, token=token, **app_options)
        self._close_app = app.close
        if middleware is not None:
            app = middleware(app)
        config = uvicorn.Config(app, log_level="warning", loop="asyncio", lifespan="off", access_log=False)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.expirer = _expirer(store, expire_every_s, heartbeat_timeout_s)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ServerThread:
        import time

        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise StoreUnavailable(f"store server on {self.url} did not start")
            time.sleep(0.01)
        if self.expirer is not None:
            self.expirer.start()
        return self

    def stop(self) -> None:
        if self.expirer is not None:
            self.expirer.stop()
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self.sock.close()
        self._close_app()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    store: Store,
    *,
    token: str,
    host: str = "127.0.0.1",
    port: int = 4317,
    expire_every_s: float | None = DEFAULT_EXPIRE_EVERY_S,
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
    **app_options: Any,
) -> None:
    """Serve ``store`` on ``host``:``port`` until interrupted (uvloop and httptools where installed).

    Every ``expire_every_s`` (None or 0: never) rollouts whose runner has not sent a
    heartbeat for ``heartbeat_timeout_s`` are taken back (:mod:`agl_trainer.store_expiry`).
    """
    import uvicorn

    app = create_app(store, token=token, **app_options)
    expirer = _expirer(store, expire_every_s, heartbeat_timeout_s)
    if expirer is not None:
        expirer.start()
    try:
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=5,
        )
    finally:
        if expirer is not None:
            expirer.stop()
        app.close()
