"""The client of the store server: the full :class:`agl.store.Store` interface over HTTP.

``HttpStore("http://127.0.0.1:4317")`` (token from ``token=``, else ``$AGL_STORE_TOKEN``,
else ``$AGL_ROLLOUT_KEY``, the rollout key ``agl run`` gives its child) talks to ``agl
store serve`` (see :mod:`agl_trainer.store_server` for the routes and
:mod:`agl_trainer.store_server.auth` for what each credential may do). A claim's answer carries
each claimed rollout's key when the server has the key secret: :meth:`HttpStore.rollout_key`
gives it to the runner, which hands it to the agent.

Writes that many threads make at once are coalesced: ``add_spans``,
``add_llm_calls``, ``add_rewards``, ``claim`` and ``finish`` calls waiting at the
same moment travel in one ``/v1/batch`` request, and each caller returns once the
server has acknowledged its own part. While the sender threads are busy, new
calls pile up and go in the next request, so batches grow with load and a lone
caller is never delayed.

Requests go through one pooled ``httpx.Client`` (HTTP/1.1 keep-alive, ``httpx.Limits``;
its transport retries a failed connect once), except the ``/v1/batch`` POSTs to an
``http://`` server: those use :class:`_BatchConnections`, a small pool of
``http.client`` keep-alive connections, because over httpx they miss the W1 target
(5k spans/s). A lone writer makes five sequential ``/v1/batch`` requests per
rollout, so the client's time per request sets its rate. Same-run figures from
``bench_store --only http`` (W1 spans/s at 1 / 32 / 256 writers; three runs on the
shared 2-core host at load average 0.5-5, where every figure is several times under
a quiet host's): batches over the ``httpx.Client`` 354-632 / 1546-1961 / 1456-2273,
over ``http.client`` 539-757 / 1908-2972 / 1886-2816; ``http.client`` measured
5.2k-5.6k at 1 writer on a quiet host. The 1-writer column is the noisiest, so it
was also measured in A/B runs taking turns (300 rollouts, seven turns):
``httpx.Client`` 324-680, ``httpx.HTTPTransport`` called directly 470-807,
``http.client`` 706-1173, about 0.55x and 0.7x, under 5k on any host where
``http.client`` makes 5.2k-5.6k. Client CPU per batch request measured alone:
``httpx.Client`` 850-910 us, ``httpx.HTTPTransport`` 640-690 us, ``http.client``
300-330 us. W2 (claim + finish, 256 runners) meets its target over httpx as well:
2086-2208 rollouts/s, against 2010-2335 with ``http.client`` (target 1k).

Transient failures (connection errors, dropped connections, timeouts, 502/503/504)
are retried by the client's :class:`~agl.retry.RetryPolicy` (exponential backoff with
jitter); they and every other 5xx answer are :class:`~agl.errors.Transient`, so the
runner rides them out too, while any 4xx is final. Every write is idempotent by id, a claim
carries a ``claim_id`` made here, and each request sends an ``Idempotency-Key``
that stays the same across its retries, so a retried write is never stored twice.
Server errors come back as the exceptions an embedded store raises:
:class:`~agl.errors.NotFound`, :class:`~agl.errors.InvalidTransition`,
:class:`~agl.errors.StoreUnavailable` (502, 503, 504, or the server not reached),
:class:`RequestRejected` (a ``ValueError`` naming the field) for a body the server
refused, :class:`Unauthorized` and :class:`Forbidden` (401, 403), :class:`StoreServerError`
(another 5xx) and :class:`~agl.errors.Refused` (another 4xx).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar, Unpack
from urllib.parse import quote, urlsplit

import httpx
from pydantic import BaseModel, TypeAdapter

from agl.env import ROLLOUT_KEY, STORE_TOKEN
from agl.errors import AglError, IdConflict, InvalidTransition, NotFound, Refused, StoreUnavailable, Transient
from agl.retry import Attempts, RetryPolicy
from agl.schema import Attempt, LLMCall, ModelVersion, Reward, Rollout, RolloutStatus, Span, StoreStats, Task
from agl.store.base import (
    FinishOptions,
    LLMCallQuery,
    RewardQuery,
    RolloutQuery,
    SpanQuery,
    Store,
    step_record_row,
    with_defaults,
)
from agl.tokens import STORED

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

RETRY_STATUSES = frozenset({502, 503, 504})
MAX_KEPT_KEYS = 100_000
"""Rollout keys from claim answers kept for :meth:`HttpStore.rollout_key`, the oldest dropped first."""
MAX_BATCH_BYTES = 8 * 1024 * 1024
"""Largest body the coalescer builds; one caller's larger write is split to fit."""

_ADAPTERS: dict[str, TypeAdapter] = {
    "spans": TypeAdapter(list[Span]),
    "llm_calls": TypeAdapter(list[LLMCall]),
    "rewards": TypeAdapter(list[Reward]),
}
_MODELS: dict[str, type[BaseModel]] = {"spans": Span, "llm_calls": LLMCall, "rewards": Reward}
_ROLLOUTS = TypeAdapter(list[Rollout])
_KINDS = ("spans", "llm_calls", "rewards", "claims", "finishes")


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


def _response_error(response: httpx.Response) -> Exception:
    try:
        error = response.json()["error"]
        if not isinstance(error, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        error = {"reason": response.text[:500] or response.reason_phrase}
    return error_from(response.status_code, error)


KEEPALIVE_S = 4.0
"""How long the httpx client keeps an idle connection: under uvicorn's 5 s, so the client closes it first."""


def _client(url: str, headers: dict[str, str], timeout_s: float, max_connections: int) -> httpx.Client:
    """The pooled HTTP/1.1 client: keep-alive connections, and a refused connect retried once by the transport.

    Proxies from the environment are not used: a store server is reached directly.
    """
    limits = httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections, keepalive_expiry=KEEPALIVE_S
    )
    return httpx.Client(
        base_url=url,
        headers=headers,
        timeout=httpx.Timeout(timeout_s),
        transport=httpx.HTTPTransport(limits=limits, retries=1),
        trust_env=False,
    )


class _BatchConnections:
    """Keep-alive ``http.client`` connections for ``/v1/batch`` on ``http://`` servers (see the module docstring).

    A connection is taken for one request and put back after it; when the server
    has closed a kept-alive one, the request goes once more, at once, on a fresh
    connection. Failures raise :class:`httpx.TransportError`, so the caller retries
    them as it does httpx's.
    """

    def __init__(self, url: str, headers: dict[str, str], timeout_s: float, max_idle: int):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = parts.path.rstrip("/") + "/v1/batch"
        self.headers = {**headers, "Content-Type": "application/json"}
        self.timeout_s = timeout_s
        self.max_idle = max_idle
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def post(self, body: bytes, key: str) -> httpx.Response:
        """POST ``body`` with ``Idempotency-Key: key``; the answer, read in full."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is not None:
            try:
                return self._exchange(conn, body, key)
            except httpx.RemoteProtocolError:
                pass  # the server had closed this idle connection: once more on a fresh one
        return self._exchange(self._connect(), body, key)

    def _connect(self) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            conn.close()
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        return conn

    def _exchange(self, conn: http.client.HTTPConnection, body: bytes, key: str) -> httpx.Response:
        try:
            conn.request("POST", self.path, body=body, headers={**self.headers, "Idempotency-Key": key})
            answer = conn.getresponse()
            content = answer.read()
        except (http.client.RemoteDisconnected, ConnectionResetError, ConnectionAbortedError, BrokenPipeError) as exc:
            conn.close()
            raise httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}") from exc
        except TimeoutError as exc:
            conn.close()
            raise httpx.ReadTimeout(f"no answer in {self.timeout_s} s") from exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from exc
        self._put_back(conn, answer.will_close)
        return httpx.Response(answer.status, content=content)

    def _put_back(self, conn: http.client.HTTPConnection, will_close: bool) -> None:
        with self._lock:
            if not (will_close or self._closed or len(self._idle) >= self.max_idle):
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close the idle connections; one in use closes when it comes back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _Op:
    """One caller's part of a coalesced request."""

    __slots__ = ("future", "kind", "payload")

    def __init__(self, kind: str, payload: bytes):
        self.kind = kind
        self.payload = payload
        self.future: Future = Future()


class _Coalescer:
    """Sends whatever calls are waiting as one ``/v1/batch`` request, at most ``senders`` at a time.

    A caller that finds a sending slot free sends its own calls itself, with whatever
    is queued ahead of and behind them, so a lone caller never waits on another
    thread. Calls that arrive while every slot is busy wait in the queue: a caller
    whose own calls have been answered passes its slot, queue and all, to a helper
    thread rather than keep sending for the others, and the helper sends until the
    queue is empty.
    """

    def __init__(self, store: HttpStore, senders: int, max_bytes: int, linger_s: float):
        self.store = store
        self.max_bytes = max_bytes
        self.linger_s = linger_s
        self.senders = senders
        self._pending: deque[_Op] = deque()
        self._cond = threading.Condition()
        self._busy = 0  # slots in use: callers and helpers sending
        self._handed = 0  # slots passed on, not yet taken up by a helper
        self._closed = False
        self._helpers = [
            threading.Thread(target=self._help, name=f"agl-http-sender-{i}", daemon=True) for i in range(senders)
        ]
        for thread in self._helpers:
            thread.start()

    def submit(self, ops: list[_Op]) -> list[Any]:
        with self._cond:
            if self._closed:
                raise StoreUnavailable("the HTTP store is closed")
            self._pending.extend(ops)
            lead = self._busy < self.senders
            if lead:
                self._busy += 1
        if lead:
            self._send(ops)
        return [op.future.result() for op in ops]

    def _send(self, mine: list[_Op] | None) -> None:
        """Send batches from the queue on one slot: until ``mine`` are answered (a caller)
        or the queue is empty (a helper); then pass the slot on or give it back."""
        while True:
            batch = self._take()
            if batch:
                self.store._send_batch(batch)  # settles every op's future; never raises
            with self._cond:
                if not self._pending:
                    self._busy -= 1
                    if self._closed:
                        self._cond.notify_all()  # helpers waiting for the last sender to leave
                    return
                if mine is not None and all(op.future.done() for op in mine):
                    self._handed += 1
                    self._cond.notify()
                    return

    def _take(self) -> list[_Op]:
        if self.linger_s:
            time.sleep(self.linger_s)
        with self._cond:
            batch: list[_Op] = []
            size = 0
            while self._pending and (not batch or size + len(self._pending[0].payload) <= self.max_bytes):
                op = self._pending.popleft()
                size += len(op.payload)
                batch.append(op)
            return batch

    def _help(self) -> None:
        while True:
            with self._cond:
                while not self._handed:
                    if self._closed and not self._busy:
                        return
                    self._cond.wait()
                self._handed -= 1
            self._send(None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._helpers:
            thread.join(timeout=30)


class HttpStore(Store):
    """A :class:`Store` on a store server (``agl store serve``).

    ``retries`` transient failures are retried per request, with backoff from
    ``backoff_s`` doubling up to 2 s; then :class:`StoreUnavailable` is raised.
    Writes are coalesced: at most ``senders`` ``/v1/batch`` requests are in flight,
    each carrying every call that was waiting when it left; ``linger_s`` makes each
    wait that long for more calls before sending (0: send at once). Up to
    ``max_connections`` keep-alive connections are pooled.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 5,
        backoff_s: float = 0.05,
        senders: int = 4,
        linger_s: float = 0.0,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        max_connections: int = 64,
    ):
        if retries < 0:
            raise ValueError(f"retries: must be at least 0, got {retries}")
        if senders < 1:
            raise ValueError(f"senders: must be at least 1, got {senders}")
        self.url = url.rstrip("/")
        if token is None:
            token = STORE_TOKEN.get() or ROLLOUT_KEY.get()
        self.retries = retries
        self.backoff_s = backoff_s
        self.retry = RetryPolicy(max_attempts=retries + 1, first_delay_s=backoff_s, retry_on=(StoreUnavailable,))
        """Per request: 502/503/504 and connection failures (both :class:`StoreUnavailable`)."""
        headers = {"User-Agent": "agl-http-store"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._client = _client(self.url, headers, timeout_s, max_connections)
        http_url = urlsplit(self.url).scheme == "http"
        self._batch = _BatchConnections(self.url, headers, timeout_s, max_connections) if http_url else None
        self._coalescer = _Coalescer(self, senders, max_batch_bytes, linger_s)
        self._closed = False
        self._keys: dict[tuple[str, int], str] = {}
        self._keys_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"HttpStore({self.url!r})"

    # -- transport -----------------------------------------------------------------
    def _retrying(self, what: str):
        """The ``on_retry`` and ``give_up`` for :attr:`retry`: a debug line, then :class:`StoreUnavailable`."""

        def on_retry(exc: BaseException, wait: float) -> None:
            log.debug("store server %s: %s failed (%s); retrying in %.2fs", self.url, what, exc, wait)

        def give_up(exc: BaseException, attempts: Attempts) -> StoreUnavailable:
            return StoreUnavailable(f"store server {self.url} unavailable after {attempts.failures - 1} retries: {exc}")

        return {"on_retry": on_retry, "give_up": give_up}

    def _unreachable(self, exc: httpx.TransportError) -> StoreUnavailable:
        return StoreUnavailable(f"store server {self.url}: {type(exc).__name__}: {exc}")

    def _request(self, method: str, path: str, *, body: bytes | None = None) -> httpx.Response:
        """Send one request, retrying transient failures; a POST keeps one ``Idempotency-Key`` across retries."""
        key = uuid.uuid4().hex
        headers = {"Content-Type": "application/json", "Idempotency-Key": key} if method == "POST" else None
        batch = self._batch if path == "/v1/batch" else None

        def once() -> httpx.Response:
            try:
                if batch is not None and body is not None:
                    response = batch.post(body, key)
                else:
                    response = self._client.request(method, path, content=body, headers=headers)
            except httpx.TransportError as exc:
                raise self._unreachable(exc) from exc
            if response.status_code >= 400:
                raise _response_error(response)
            return response

        return self.retry.call(once, **self._retrying(f"{method} {path}"))

    def _get(self, path: str) -> Any:
        return self._request("GET", path).json()

    def _post(self, path: str, payload: Any) -> httpx.Response:
        body = payload if isinstance(payload, bytes) else json.dumps(payload, separators=(",", ":")).encode()
        return self._request("POST", path, body=body)

    def _stream(self, path: str, filters: dict[str, Any], model: type[M]) -> Iterator[M]:
        """POST ``filters`` and yield the NDJSON lines as models; a broken stream resumes where it stopped."""
        body = json.dumps({k: v for k, v in filters.items() if v is not None}, separators=(",", ":")).encode()
        attempts = self.retry.start()
        retrying = self._retrying(f"POST {path}")
        yielded = 0
        while True:
            seen = 0
            try:
                with contextlib.closing(self._stream_lines(path, body)) as lines:  # a reader that stops early
                    for line in lines:
                        seen += 1
                        if seen > yielded:
                            yielded = seen
                            attempts.reset()
                            yield model.model_validate_json(line, context=STORED)
                return
            except httpx.TransportError as exc:
                error: Exception = self._unreachable(exc)
            except StoreUnavailable as exc:
                error = exc
            self.retry.sleep(attempts.wait_or_raise(error, **retrying))

    def _stream_lines(self, path: str, body: bytes) -> Iterator[bytes]:
        """One try at a query: its NDJSON lines; a server error in the stream is raised as its exception."""
        with self._client.stream("POST", path, content=body, headers={"Content-Type": "application/json"}) as response:
            if response.status_code >= 400:
                response.read()
                raise _response_error(response)
            rest = b""
            for chunk in response.iter_bytes():
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    if line.startswith(b'{"agl_stream_error"'):
                        error = json.loads(line)["agl_stream_error"]
                        raise error_from(_status_of(error), error)
                    if line:
                        yield line
            if rest.strip():
                raise StoreUnavailable(f"store server {self.url}: stream of {path} ended mid-line")

    # -- coalesced writes ----------------------------------------------------------
    def _send_batch(self, ops: list[_Op]) -> None:
        """Send ``ops`` as one request and settle each one's future (called by sender threads)."""
        parts: dict[str, list[bytes]] = {kind: [] for kind in _KINDS}
        for op in ops:
            parts[op.kind].append(op.payload)
        body = b"{" + b",".join(b'"' + k.encode() + b'":[' + b",".join(v) + b"]" for k, v in parts.items() if v) + b"}"
        try:
            response = self._request("POST", "/v1/batch", body=body)
            answer = response.json()
        except (RequestRejected, AglError) as exc:
            if len(ops) > 1 and not isinstance(exc, (StoreUnavailable, Unauthorized)):
                for op in ops:  # find whose part the server refused; the others go through
                    self._send_batch([op])
                return
            for op in ops:
                op.future.set_exception(exc)
            return
        except BaseException as exc:
            for op in ops:
                op.future.set_exception(exc)
            return
        results = {"claims": iter(answer.get("claims", [])), "finishes": iter(answer.get("finishes", []))}
        for op in ops:
            if op.kind not in results:
                op.future.set_result(None)
                continue
            result = next(results[op.kind], None)
            if result is None:
                op.future.set_exception(AglError(f"store server {self.url}: batch answer is missing a result"))
            elif "error" in result:
                error = result["error"]
                op.future.set_exception(error_from(_status_of(error), error))
            else:
                op.future.set_result(result)

    def _observations(self, kind: str, items: Iterable[Any]) -> None:
        model = _MODELS[kind]
        values = [item if isinstance(item, model) else model.model_validate(item) for item in items]
        if not values:
            return
        self._coalescer.submit(self._split(kind, values))

    def _split(self, kind: str, values: list[Any]) -> list[_Op]:
        payload = _ADAPTERS[kind].dump_json(values)[1:-1]
        if len(payload) <= self._coalescer.max_bytes or len(values) == 1:
            return [_Op(kind, payload)]
        half = len(values) // 2
        return self._split(kind, values[:half]) + self._split(kind, values[half:])

    # -- tasks ---------------------------------------------------------------------
    def add_tasks(self, tasks: Iterable[Task]) -> None:
        body = TypeAdapter(list[Task]).dump_json(list(tasks))
        self._post("/v1/tasks", b'{"tasks":' + body + b"}")

    def get_task(self, task_id: str) -> Task:
        return Task.model_validate_json(self._request("GET", f"/v1/tasks/{_seg(task_id)}").content, context=STORED)

    def query_tasks(self, *, split: str | None = None) -> Iterator[Task]:
        return self._stream("/v1/tasks/query", {"split": split}, Task)

    # -- rollouts ------------------------------------------------------------------
    def enqueue(self, rollouts: Sequence[Rollout]) -> list[Rollout]:
        body = _ROLLOUTS.dump_json(list(rollouts))
        answer = self._post("/v1/rollouts", b'{"rollouts":' + body + b"}")
        return _ROLLOUTS.validate_python(answer.json()["rollouts"], context=STORED)

    def claim(self, runner_id: str, *, limit: int = 1, claim_id: str | None = None) -> list[Rollout]:
        if limit < 1:
            raise ValueError(f"limit: must be at least 1, got {limit}")
        payload = {"runner_id": runner_id, "limit": limit, "claim_id": claim_id or f"claim-{uuid.uuid4().hex}"}
        [result] = self._coalescer.submit([_Op("claims", json.dumps(payload).encode())])
        claimed = _ROLLOUTS.validate_python(result["rollouts"], context=STORED)
        keys = result.get("keys") or {}
        if keys:
            with self._keys_lock:
                for r in claimed:
                    if r.rollout_id in keys:
                        self._keys[(r.rollout_id, r.attempt)] = keys[r.rollout_id]
                while len(self._keys) > MAX_KEPT_KEYS:
                    self._keys.pop(next(iter(self._keys)))
        return claimed

    def rollout_key(self, rollout_id: str, attempt: int) -> str | None:
        """The key the server handed out when this process claimed the attempt (None: it gave none)."""
        with self._keys_lock:
            return self._keys.get((rollout_id, attempt))

    def heartbeat(self, rollout_ids: Sequence[str], runner_id: str) -> None:
        self._post("/v1/heartbeats", {"runner_id": runner_id, "rollout_ids": list(rollout_ids)})

    def finish(self, rollout_id: str, status: RolloutStatus, **options: Unpack[FinishOptions]) -> Rollout:
        payload = {"rollout_id": rollout_id, "status": RolloutStatus(status).value}
        payload.update(with_defaults(FinishOptions, options, "finish"))
        if payload["attempt"] is None:
            del payload["attempt"]
        try:
            encoded = json.dumps(payload, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"output: not JSON-serialisable: {exc}") from exc
        [result] = self._coalescer.submit([_Op("finishes", encoded)])
        return Rollout.model_validate(result["rollout"], context=STORED)

    def cancel(self, rollout_ids: Sequence[str]) -> None:
        self._post("/v1/cancellations", {"rollout_ids": list(rollout_ids)})

    def expire(self, *, heartbeat_timeout_s: float, now: float | None = None) -> list[Rollout]:
        answer = self._post("/v1/expirations", {"heartbeat_timeout_s": heartbeat_timeout_s, "now": now})
        return _ROLLOUTS.validate_python(answer.json()["rollouts"], context=STORED)

    def get_rollout(self, rollout_id: str) -> Rollout:
        answer = self._request("GET", f"/v1/rollouts/{_seg(rollout_id)}").content
        return Rollout.model_validate_json(answer, context=STORED)

    def query_rollouts(self, **query: Unpack[RolloutQuery]) -> Iterator[Rollout]:
        filters = _id_lists(with_defaults(RolloutQuery, query, "query_rollouts"))
        status = filters["status"]
        if status is not None:
            statuses = [status] if isinstance(status, (str, RolloutStatus)) else list(status)
            filters["status"] = [RolloutStatus(s).value for s in statuses]
        return self._stream("/v1/rollouts/query", filters, Rollout)

    def attempts(self, rollout_id: str) -> list[Attempt]:
        answer = self._get(f"/v1/rollouts/{_seg(rollout_id)}/attempts")
        return [Attempt.model_validate(a) for a in answer["attempts"]]

    # -- observations --------------------------------------------------------------
    def add_spans(self, spans: Iterable[Span]) -> None:
        self._observations("spans", spans)

    def add_llm_calls(self, calls: Iterable[LLMCall]) -> None:
        self._observations("llm_calls", calls)

    def add_rewards(self, rewards: Iterable[Reward]) -> None:
        self._observations("rewards", rewards)

    def query_spans(self, **query: Unpack[SpanQuery]) -> Iterator[Span]:
        filters = _id_lists(with_defaults(SpanQuery, query, "query_spans"))
        return self._stream("/v1/spans/query", filters, Span)

    def query_llm_calls(self, **query: Unpack[LLMCallQuery]) -> Iterator[LLMCall]:
        filters = _id_lists(with_defaults(LLMCallQuery, query, "query_llm_calls"))
        return self._stream("/v1/llm_calls/query", filters, LLMCall)

    def query_rewards(self, **query: Unpack[RewardQuery]) -> Iterator[Reward]:
        filters = _id_lists(with_defaults(RewardQuery, query, "query_rewards"))
        return self._stream("/v1/rewards/query", filters, Reward)

    # -- model versions ------------------------------------------------------------
    def add_model_version(self, version: ModelVersion) -> None:
        self._post("/v1/model_versions", version.model_dump_json().encode())

    def get_model_version(self, version: str) -> ModelVersion:
        answer = self._request("GET", f"/v1/model_versions/{_seg(version)}").content
        return ModelVersion.model_validate_json(answer, context=STORED)

    def latest_model_version(self) -> ModelVersion | None:
        answer = self._get("/v1/model_versions/latest")
        return None if answer is None else ModelVersion.model_validate(answer)

    # -- step records ---------------------------------------------------------------
    def add_step_record(self, run_id: str, record: dict) -> None:
        run_id, _, _, body = step_record_row(run_id, record)  # NaN as null: the server refuses NaN
        self._post("/v1/run_steps", b'{"run_id":' + json.dumps(run_id).encode() + b',"record":' + body.encode() + b"}")

    def step_records(self, run_id: str | None = None) -> list[dict]:
        path = "/v1/run_steps" + (f"?run_id={quote(run_id, safe='')}" if run_id is not None else "")
        return self._get(path)["records"]

    # -- the rest ------------------------------------------------------------------
    def stats(self) -> StoreStats:
        return StoreStats.model_validate_json(self._request("GET", "/v1/stats").content)

    def flush(self) -> None:
        self._request("POST", "/v1/flush", body=b"{}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._coalescer.close()
        if self._batch is not None:
            self._batch.close()
        self._client.close()


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


def _status_of(error: dict[str, Any]) -> int:
    status = error.get("status")
    return int(status) if isinstance(status, int) else _STATUS_BY_TYPE.get(str(error.get("type")), 500)


def _seg(value: str) -> str:
    """``value`` as one URL path segment."""
    return quote(value, safe="")


def _id_lists(filters: dict[str, Any]) -> dict[str, Any]:
    """``filters`` with its sequences of ids (``rollout_ids``, ``call_ids``) as JSON lists."""
    for name in ("rollout_ids", "call_ids"):
        if name in filters:
            ids = filters[name]
            filters[name] = None if ids is None else list(ids)
    return filters
