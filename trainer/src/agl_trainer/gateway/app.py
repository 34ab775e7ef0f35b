"""The gateway's ASGI application: its route table, and the pipeline of a model call.

The gateway routes as the store server and the engine server do: a Starlette
:class:`~starlette.routing.Router` over a table of routes (:data:`TABLE`), each a
:class:`~agl_trainer.gateway.endpoints.GatewayRoute` that admits the caller, checks the method
and serves (no Starlette ``Request`` is made on the hot path). Routes (all behind a bearer
credential, except ``/health``; who may call what is in :mod:`agl_trainer.gateway.auth`)::

    POST /v1/chat/completions | /v1/completions | /v1/responses   production traffic, or the key's rollout
    POST /v1/messages | /v1/messages/count_tokens                 the same, in Anthropic's API
    POST /rollouts/{rollout_id}/v1/...                              traffic of one rollout (its key's)
    GET  /v1/models, /rollouts/{rollout_id}/v1/models
    GET  /admin/status        POST /admin/pause?timeout_s=S   POST /admin/resume
    POST /admin/model_version {"model_version": "v3"}         POST /admin/upstreams {"upstreams": [...]}
    POST /admin/flush         POST /admin/rollout_keys {"rollout_id": ...}   GET  /health

A trailing ``/`` on a path is ignored. A rollout key names its rollout; a path segment or
``X-Agl-Rollout-Id`` header naming another one is refused with 403, as is (whoever calls) a
header naming another rollout than the path. Admin routes (:mod:`agl_trainer.gateway.admin`)
take the admin token only. Each model-call route speaks one API, its
:class:`~agl_trainer.gateway.dialect.Dialect`: OpenAI's chat and text completions
(:mod:`~agl_trainer.gateway.openai_api`), the Responses API
(:mod:`~agl_trainer.gateway.responses_api`) and Anthropic's Messages API
(:mod:`~agl_trainer.gateway.messages_api`), whose errors are in Anthropic's shape; every other
route's are in OpenAI's. Every answer, errors included, names its request id (``req_...``) in
``x-request-id`` and ``request-id``, the headers OpenAI's and Anthropic's SDKs read.

Speed (issues 45, 46). Finding a route costs Starlette's ``Router`` 2.5-4 us a request over
calling the route itself (``Route.matches`` on the hot routes, which come first; under 1 % of
the gateway's CPU per call, 0.4 % of py-spy's samples), so no cache sits in front of it. Measured
with ``python -m tests.benchmarks.bench_gateway_ab --other CHECKOUT --rounds N`` (each turn fresh
processes of both checkouts, taking turns; 2,000 calls a level, 300 rollouts x 4 calls) on the
shared 2-core host, 2026-11-29, load average 7.5-19 throughout, so single turns swing 2-4x; CPU
per call is the steadiest figure. Medians, this code against the code before it (e86c873), two
runs of 3 and 4 rounds (load 9.2-9.5, then 10.9-8.5): CPU per call at 1 / 16 / 64 clients
1.00 / 1.00 / 1.10x and 0.89 / 0.94 / 0.97x; calls/s 1.00 / 1.20 / 0.76x and 1.17 / 1.26 / 0.87x,
and at 64 clients alone over 6 rounds (3,000 calls, load 7.5-11.0) 738 against 665 (1.11x), CPU
1.00x; added p50 at 1 client 0.503 against 0.553 ms and 0.543 against 0.579 ms. Against 28dbf9d
(the gateway's fastest commit), 3 and 4 rounds (load 8.4-9.2, then 19.0-10.9): added p50 at 1
client 0.764 against 0.532 ms, then 0.524 against 0.518 ms; calls/s at 16 clients 621 against
1185 and 562 against 801, at 64 clients 790 against 1023 and 524 against 582; CPU per call at
1 / 16 / 64 clients 1.31 / 1.17 / 1.17x and 1.05 / 1.14 / 1.09x. The code before this routing
measured the same against 28dbf9d in that sitting (3 rounds, load 7.7-13.6: CPU per call 1.24 /
1.39 / 1.06x), so the gap at 16 and 64 clients is not the routing's; what it is sits outside
this module (the upstream client's docstring names what py-spy found). A rollout's first call
costs 0.17-0.18 ms more than its later ones at p50 (28dbf9d: 0.37-0.82 ms).

What a call costs in one process (``timeit``, the benchmark's request, the same host): parsing
the body 3.0 us, :func:`validate.check_body` 6.7 us (3.6 us given the text, which spares the
walk for lone surrogates where the text cannot hold one), the pydantic request model 5.8 us,
the :class:`~agl.schema.LLMCall` record 11 us, the store writer 17-19 us a record (28dbf9d's
16-19 us, same script): none is where the gap to 28dbf9d's CPU per call lies. Since then a
request id takes no system call (a random per-process prefix and a counter), a request checked
on arrival is not walked again when recorded, and ``agl gateway serve`` freezes what it holds
once started (``gc.freeze``). Same script, this code against the code before it (eefac7c),
2026-11-29, load average 7.6-12.3: CPU per call at 1 / 16 / 64 clients 0.87 / 0.79 / 0.81x
(3 rounds) and 0.94 / 0.86 / 0.89x (4 rounds), calls/s 1.11 / 1.17 / 1.42x and
1.45 / 1.16 / 0.99x, added p50 at 1 client 0.518 against 0.602 ms and 0.510 against 0.532 ms;
against 28dbf9d, 4 rounds (load 8.0-8.4): CPU per
call 1.09 / 1.28 / 1.14x, calls/s 1284 / 1462 / 1649 against 1361 / 1675 / 1690, added p50 at
1 client 0.530 against 0.485 ms (issue 46's target is not reached: at 16 and 64 clients the
gap is 40-80 us of CPU a call, outside the parts timed above).

Where that gap was (issue 46, a later sitting the same day, load average 6-12 from training runs
on the same 2 cores). The process's CPU by thread (``/proc/<pid>/task``) put it on the event
loop's thread (30-40 us a call at 16 clients; the store writer's thread 5 us); cProfile counted
the same ~500 Python calls a request in both commits, and it stayed with the collector off, so it
was neither extra calls nor collection but the same calls costing more in the serving process.
Driving each commit's app in a process of its own with a canned engine answer (no sockets; now
``python -m tests.benchmarks.bench_gateway_inproc --other CHECKOUT``, whose loop thread CPU is the
figure here; 16 at once, 10 runs of 3,000 each), this code took 158 us a request against
28dbf9d's 138; without the request check, 137 against 131: building the pydantic
request model cost about 20 us a call there (5.3 us timed in a loop of its own), against 7 us for
28dbf9d's hand-written checks. A plain chat request now passes without building it
(:mod:`~agl_trainer.gateway.plain_chat`, which only ever passes what the model accepts; the model
checks every other request): 144 against 144. Outside the app, the header timeout's timer, set
and cancelled once a request, added 10-20 us of the loop thread's CPU and of the p50 at one client
(three rounds with the timeout switched off against it); a connection now keeps one timer, set
again only when it fires (:mod:`agl_trainer.http.header_timeout`). Then, against 28dbf9d in
``bench_gateway_ab``, 3 rounds (load 9.2-10.2): calls/s at 16 / 64 clients 1405 / 1311 against
1232 / 1236 (1.14 / 1.06x), CPU per call at 1 / 16 / 64 clients 1.02 / 0.89 / 1.06x, added p50 at
one client 0.514 against 0.500 ms; a rollout's first call 0.145 ms above its later ones (28dbf9d:
0.380). The next run, 4 rounds (load 9.5-10.4), swung the other way: calls/s 801 / 1008 against
1116 / 876 (0.72 / 1.15x), CPU per call 1.07 / 1.11 / 1.05x, added p50 0.509 against 0.487 ms; a
first call 0.185 ms above the later ones (28dbf9d: 0.471). So issue 46's target is met in one run
of two and the p50 at one client in neither (14-22 us above); single turns swing 2x with the host's
load, and what is left (a few us each: the route table, the admission's passes over the headers,
the record's extra fields) is within that swing.

The p50 at one client (issue 46, a later sitting, load average 4.8-7.4). Each step of a call
timestamped on the loop thread (wall and thread CPU clocks, one client, 4,000 calls, three
alternations of each commit) put the gap after the engine's answer arrives, spread thin: +7 us in
building the record, +2 to +5 us each in sending the answer, the end of the call and the
admission. Moving the record after the answer does not shorten this benchmark's p50: with one
client and no pause between calls, the next request arrives 15-50 us after an answer, so work
after it still delays that request (0.489 against 0.474 ms, 6 rounds); and it would let a client
hold an answer whose record is not yet buffered (an in-process flush could miss it, and a record
the store refuses could no longer be the client's error), so the record stays before the answer.
Two costs that both commits paid were cut instead. Parsing the engine's answer (4 kB with
logprobs; 35-45 us of the loop's ~380 us a call) is now pydantic-core's parser's, half the
standard one's, with the standard parser reading whatever it refuses so the values stay the same
(:func:`~agl_trainer.gateway.chat.engine_json`). A call's id no longer takes ``os.urandom``,
whose ``getrandom`` released the GIL mid-call to the store writer's thread
(:mod:`~agl_trainer.gateway.call_ids`). In process, one request at a time
(``bench_gateway_inproc --concurrency 1``, 3 rounds x 3 runs): the loop thread's CPU 115.5 against
28dbf9d's 137.7 us a request (0.84x; 150 against 141 before). ``bench_gateway_ab`` against 28dbf9d,
one client alone (``--concurrency 1 --rollouts 0``), medians: 0.498 against 0.527 ms (8 rounds, the
parser alone); with the call ids too, 0.473 against 0.495 (8 rounds), 0.479 against 0.484 (10) and
0.501 against 0.502 ms (10), CPU per call 0.95 / 0.96 / 0.98x; single turns swing 0.46-0.74 ms.
With every level, 4 rounds each: 0.469 against 0.492 ms (the parser alone; calls/s at 16 / 64
clients 0.95 / 1.26x), then 0.553 against 0.523 (0.88 / 0.74x) and 0.517 against 0.502 ms
(0.90 / 0.89x; CPU per call 1.06 / 1.02 / 1.12x). So at one client the two are now level (this code
ahead in five runs of seven, by 1-29 us, behind in two by 15-30 us), not reliably ahead; calls/s at
16 and 64 clients swing either way from run to run, as before.

Below 28dbf9d's CPU a call (issue 46, a later sitting, load average 5.4-8.6 throughout). Timing
each step of a call in the gateway's process (each function's thread CPU summed over 6,000 calls,
16 at once) put the store writer's thread at 27 us a call against 28dbf9d's 21, and timing the
store's ``add_llm_calls`` alone put the difference in SQLite's inserts: the call ids, random in
both commits, land on any page of the unique index on ``call_id``, whose cache this store keeps
small. A call's id now begins with the time (:mod:`~agl_trainer.gateway.call_ids`: 25.2 against
35.3 us of writer CPU a record, ``bench_call_id_order``). Then the JSON the gateway writes (the
engine's request, the client's answer: 4 and 3.4 us with ``json.dumps``) and the client's request
it reads are pydantic-core's (:mod:`~agl_trainer.gateway.json_codec`: about 1 us each). In
process (``bench_gateway_inproc``, 16 at once, 3 rounds x 5 runs of 3,000): the ids alone, 137.3
against 28dbf9d's 156.0 us of process CPU a request (0.88x); with the JSON too, three runs: 125.9
against 162.4 (0.78x), 119.9 against 160.0 (0.75x), 133.7 against 167.1 us (0.80x), the loop
thread 0.77 / 0.72 / 0.79x. ``bench_gateway_ab`` against 28dbf9d, two runs of 4 rounds, medians:
CPU per call at 1 / 16 / 64 clients 0.90 / 0.83 / 0.83x, then 0.94 / 0.85 / 0.92x; calls/s at 16 /
64 clients 1587 / 1260 against 1411 / 1223 (1.12 / 1.03x), then 1318 / 889 against 1287 / 1562
(1.02 / 0.57x; single turns at 64 clients moved 438-1927 calls/s); added p50 at one client 0.436
against 0.480 ms, then 0.437 against 0.480; a rollout's first call 0.153 / 0.155 ms above its later
ones (28dbf9d: 0.400 / 0.312). At 64 clients alone, 8 rounds of 3,000 calls: 1110 against 1224
calls/s (0.91x), CPU per call 0.278 against 0.313 ms (0.89x). So the CPU a call is below 28dbf9d's
at every level and the p50 at one client is ahead in every turn; calls/s at 64 clients follows the
host's load more than either gateway (three more rounds at 64 clients: 1577 / 930 / 952 against
920 / 800 / 460 calls/s, 28dbf9d's p99 0.8-1.9 s against 0.09-0.41 s). Two more runs: 6 rounds of
every level (load 7.3-7.5), CPU per call 0.86 / 0.78 / 0.86x, calls/s at 16 / 64 clients 2153 /
1301 against 1001 / 1825 (2.15 / 0.71x), added p50 at one client 0.434 against 0.481 ms, a first
call 0.145 ms above the later ones (28dbf9d: 0.344); 4 rounds of 6,000 calls at 16 and 64 clients
(load 3.7-5.8), calls/s 2064 / 1708 against 1916 / 1582 (1.08 / 1.08x), CPU per call 0.87 / 0.92x.
One request at a time in process (``bench_gateway_inproc --concurrency 1``): 121.0 against 166.6 us
of process CPU a request (0.73x).

On a quiet host (nothing else running, load average 0.7-1.3; 2026-11-30), three runs of
``bench_gateway_ab`` against 28dbf9d (4, 5 and 5 rounds): calls/s at 16 / 64 clients 1.18 / 1.37x,
1.15 / 1.19x and 1.16 / 1.17x, this code ahead at 64 clients in 14 rounds of 14; added p50 at one
client 0.463 against 0.510 and 0.430 against 0.487 ms. The swings above were the host's load.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
from collections.abc import Awaitable, Callable

from starlette.routing import Router as RouteTable

from agl.credentials import RolloutKeys
from agl.errors import StoreUnavailable
from agl_trainer.gateway import admin, chat, json_codec, messages_api, openai_api, responses_api, validate
from agl_trainer.gateway.auth import GatewayAuth
from agl_trainer.gateway.call_ids import new_call_id
from agl_trainer.gateway.dialect import Dialect, openai_error_body
from agl_trainer.gateway.endpoints import (
    UNMATCHED,
    GatewayRoute,
    admit_admin,
    admit_anyone,
    admit_client,
    admit_rollout,
    read_request,
    send_json,
)
from agl_trainer.gateway.errors import GatewayError, Saturated, UpstreamUnavailable, invalid, server_error
from agl_trainer.gateway.pause import PauseGate
from agl_trainer.gateway.recorder import CallMeta, Recorder
from agl_trainer.gateway.rollouts import RolloutRegistry
from agl_trainer.gateway.routing import Replica, Router
from agl_trainer.gateway.upstream import UpstreamResponse
from agl_trainer.http import DEFAULT_MAX_BODY_BYTES, ClientDisconnect
from agl_trainer.policy_routes import Route, Routes, UnknownModel

log = logging.getLogger(__name__)

_REQUEST_ID_HEADERS = (b"x-request-id", b"request-id")
_REQUEST_ID_PREFIX = "req_" + os.urandom(8).hex()
_request_numbers = itertools.count(1)


def _next_request_id() -> str:
    """An id for one request, unique within this process and (by its random prefix) across
    processes; it names the request in logs and answers and grants nothing, so it takes no
    system call per request."""
    return f"{_REQUEST_ID_PREFIX}{next(_request_numbers):x}"


FLUSH_TIMEOUT_S = admin.FLUSH_TIMEOUT_S
"""How long ``POST /admin/flush`` waits for the store by default (``timeout_s`` overrides it)."""


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
        self.flush_store = flush
        """Write out every recorded call, within the seconds given (``POST /admin/flush``)."""

    # -- ASGI entry ------------------------------------------------------------------
    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                while (await receive())["type"] != "lifespan.shutdown":
                    await send({"type": "lifespan.startup.complete"})
                await send({"type": "lifespan.shutdown.complete"})
            return
        started = False
        request_id = _next_request_id()

        async def tracked_send(message: dict) -> None:
            nonlocal started
            started = True
            if message["type"] == "http.response.start":
                message = dict(message, headers=_with_request_id(message.get("headers") or [], request_id))
            await send(message)

        scope["app"] = self
        path = scope["path"]
        if path[-1:] == "/" and path != "/":
            scope["path"] = path.rstrip("/") or "/"
        try:
            await _TABLE_ROUTER(scope, receive, tracked_send)
        except ClientDisconnect:
            return  # gone before its body was in: no one to answer
        except Exception as exc:
            if started:  # the answer is under way: all that is left is to end it
                log.exception("gateway: error after the response started")
                with contextlib.suppress(Exception):
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await send_error(tracked_send, _as_gateway_error(exc), _error_body(scope))

    # -- model calls -------------------------------------------------------------------
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

    async def call(self, rollout_id: str | None, scope: dict, receive: Callable, send: Callable) -> None:
        """A model call, in the API of the route it came by (``scope["route"].dialect``)."""
        dialect: Dialect = scope["route"].dialect
        req = _json_body(await read_request(scope, receive, self.max_body_bytes))
        engine_req = dialect.engine_request(req)
        requested = req.get("model")
        route = self._route(requested)
        n = req.get("n") or 1
        seqs = [await self.registry.next_seq(rollout_id) for _ in range(n)]
        settings = self.registry.settings(rollout_id)
        meta = CallMeta(
            new_call_id(dialect.id_prefix),
            rollout_id,
            seqs,
            dialect.endpoint,
            requested,
            req,
            max_response_tokens=settings.max_response_tokens,
            seed=settings.call_seed(seqs[0]),
            policy=route.policy if route else None,
            policy_version=route.version if route else None,
            upstream_model=route.upstream_model if route else None,
            request_checked=True,  # by _json_body, and the dialects change it only within the checked model
        )
        await self.gate.enter()
        try:
            await _until_disconnect(
                lambda out: self._answer(dialect, meta, req, engine_req, out), receive, send, self._aborted(meta)
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

    async def _post(self, rollout_id: str | None, path: str, upstream: dict) -> tuple[Replica, UpstreamResponse]:
        """POST ``upstream`` to a replica's ``path``: ``(replica, response)``; 429 or 5xx when none can take it."""
        try:
            return await self.router.send(rollout_id, path, json_codec.dump(upstream))
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

    async def _answer(self, dialect: Dialect, meta: CallMeta, req: dict, engine_req: dict, send: Callable) -> None:
        """Send the call to a replica and answer the client from the replica's answer.

        The client sees the model name it asked for; the served one stays in the engine request.
        """
        model = meta.upstream_model or await self.served_model()
        shown = meta.requested_model or model
        upstream = dialect.upstream(engine_req, model, meta.max_response_tokens)
        if meta.seed is not None and upstream.get("seed") is None:
            upstream["seed"] = meta.seed  # the client's own seed wins
        replica, resp = await self._post(meta.rollout_id, dialect.engine_path, upstream)
        try:
            if resp.status != 200:
                raise dialect.engine_error(upstream_error(resp.status, await resp.read(), req))
            if not req.get("stream"):
                await _read_whole(resp)
            await dialect.answer(self.recorder, meta, req, resp, shown, send)
        finally:
            resp.aclose()
            Router.done(replica)

    # -- other routes --------------------------------------------------------------------
    async def models(self, rollout_id: str | None, scope: dict, receive: Callable, send: Callable) -> None:
        """``/v1/models``: the model the replicas serve."""
        if rollout_id is not None:
            await self.registry.check(rollout_id)
        model = await self.served_model()
        if model is None:
            raise GatewayError(502, "no engine replica could be asked what it serves", type="upstream_error")
        data = [{"id": model, "object": "model", "owned_by": "agl", "created": 0}]
        await send_json(send, 200, json.dumps({"object": "list", "data": data}).encode())

    async def count_tokens(self, rollout_id: str | None, scope: dict, receive: Callable, send: Callable) -> None:
        """``/v1/messages/count_tokens``: the length of the prompt the engine renders (nothing recorded)."""
        if rollout_id is not None:
            await self.registry.check(rollout_id)
        body = await read_request(scope, receive, self.max_body_bytes)
        chat_req = messages_api.count_chat_request(_json_body(body))
        route = self._route(chat_req.get("model"))
        model = (route.upstream_model if route else None) or await self.served_model()
        upstream = chat.upstream_chat_request(chat_req, model, 1)
        await self.gate.enter()
        try:
            replica, resp = await self._post(rollout_id, "/chat/completions", upstream)
            try:
                raw = await _read_whole(resp)
                if resp.status != 200:
                    raise messages_api.in_anthropic_terms(upstream_error(resp.status, raw, chat_req))
            finally:
                resp.aclose()
                Router.done(replica)
        finally:
            self.gate.exit()
        prompt_ids, _ = chat.take_chat_tokens(chat.engine_json(raw), keep_ids=False, keep_logprobs=False)
        await send_json(send, 200, json.dumps({"input_tokens": len(prompt_ids)}).encode())

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


async def _health(app: GatewayApp, rollout_id: None, scope: dict, receive: Callable, send: Callable) -> None:
    """``/health``: the gateway answers."""
    await send_json(send, 200, b'{"ok":true}')


def _api(method: str, endpoint: str, serve: Callable, dialect: Dialect | None = None) -> list[GatewayRoute]:
    """The route ``/v1/{endpoint}`` and its rollout's twin ``/rollouts/{rollout_id}/v1/{endpoint}``."""
    return [
        GatewayRoute(f"/v1/{endpoint}", method, admit_client, serve, dialect),
        GatewayRoute(f"/rollouts/{{rollout_id:path}}/v1/{endpoint}", method, admit_rollout, serve, dialect),
    ]


TABLE: list[GatewayRoute] = [  # tried in order: the hot routes first
    *_api("POST", "chat/completions", GatewayApp.call, openai_api.CHAT),
    *_api("POST", "completions", GatewayApp.call, openai_api.COMPLETIONS),
    *_api("POST", "responses", GatewayApp.call, responses_api.DIALECT),
    *_api("POST", "messages", GatewayApp.call, messages_api.DIALECT),
    *_api("POST", "messages/count_tokens", GatewayApp.count_tokens, messages_api.DIALECT),
    *_api("GET", "models", GatewayApp.models),
    GatewayRoute("/health", "GET", admit_anyone, _health),
    GatewayRoute("/admin/status", "GET", admit_admin, admin.admin_route(admin.status)),
    *(
        GatewayRoute(f"/admin/{action.__name__}", "POST", admit_admin, admin.admin_route(action))
        for action in (admin.pause, admin.resume, admin.model_version, admin.upstreams, admin.rollout_keys, admin.flush)
    ),
]
"""The gateway's routes; a path none matches goes to :data:`~agl_trainer.gateway.endpoints.UNMATCHED` (404)."""
_TABLE_ROUTER = RouteTable(TABLE, redirect_slashes=False, default=UNMATCHED)


def routes() -> list[tuple[str, str]]:
    """Every route of the gateway as ``(method, path)``, the rollout's id as ``{rollout_id}``: what
    :class:`GatewayApp` serves (anything else is 404, another method 405)."""
    return [(route.method, route.path.replace("{rollout_id:path}", "{rollout_id}")) for route in TABLE]


async def send_error(
    send: Callable, err: GatewayError, error_body: Callable[[GatewayError], bytes] = openai_error_body
) -> None:
    """Answer ``err``, its body made by ``error_body`` (the shape the route's clients read)."""
    headers = [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    await send_json(send, err.status, error_body(err), headers)


def _error_body(scope: dict) -> Callable[[GatewayError], bytes]:
    """How errors are told on the route a request came by (OpenAI's shape where none matched)."""
    route = scope.get("route")
    return route.error_body if isinstance(route, GatewayRoute) else openai_error_body


def _as_gateway_error(exc: Exception) -> GatewayError:
    """What the client is told of ``exc``: a :class:`GatewayError` as it is, a store that could not be
    asked 503, a bug 500."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, StoreUnavailable):  # the store could not say whose key this is
        return server_error(503, "the store is unavailable; retry shortly", str(exc), headers={"Retry-After": "1"})
    log.exception("gateway: internal error", exc_info=exc)  # its details go to the log, not to the client
    return server_error(500, "internal gateway error", f"{type(exc).__name__}: {exc}")


async def _read_whole(resp: UpstreamResponse) -> bytes:
    """The engine's whole answer; 502 when the engine cut it short."""
    try:
        return await resp.read()
    except ConnectionError as exc:
        raise server_error(
            502, "the engine's answer was cut short", str(exc), type="upstream_error", code="engine_error"
        ) from None


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
        req = json_codec.parse(body)
    except ValueError as exc:
        raise GatewayError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise invalid("body", "nests too deeply", code="invalid_json") from None
    validate.check_body(req, body)
    return req


def _with_request_id(headers: list, request_id: str) -> list:
    """``headers`` with the answer's request id as ``x-request-id`` (OpenAI's SDK reads it) and ``request-id``
    (Anthropic's): an id already there (a 5xx's, which the log names) is kept."""
    named = [(k.lower(), v) for k, v in headers if k.lower() in _REQUEST_ID_HEADERS]
    if not named:  # as every answer but a 5xx
        value = request_id.encode()
        return [*headers, (b"x-request-id", value), (b"request-id", value)]
    given = dict(named)
    value = given.get(b"x-request-id") or given.get(b"request-id") or request_id.encode()
    out = [(k, v) for k, v in headers if k.lower() not in _REQUEST_ID_HEADERS]
    return out + [(b"x-request-id", value), (b"request-id", value)]


def _replica_status(r: Replica) -> dict:
    return {"url": r.url, "in_flight": r.in_flight, "served_model": r.served_model}
