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

import json
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Unpack
from urllib.parse import quote, urlsplit

from pydantic import TypeAdapter

from agl.env import ROLLOUT_KEY, STORE_TOKEN
from agl.errors import StoreUnavailable
from agl.retry import RetryPolicy
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
from agl.store.http_coalesce import Coalescer, Op
from agl.store.http_errors import (
    RETRY_STATUSES,
    Forbidden,
    RequestRejected,
    StoreServerError,
    Unauthorized,
    error_from,
)
from agl.store.http_requests import _ADAPTERS as _ADAPTERS  # noqa: F401  (the store benchmark encodes with them)
from agl.store.http_requests import ROLLOUT_LIST, HttpRequests
from agl.store.http_transport import KEEPALIVE_S, BatchConnections, http_client
from agl.tokens import STORED

__all__ = [
    "KEEPALIVE_S",
    "MAX_BATCH_BYTES",
    "MAX_KEPT_KEYS",
    "RETRY_STATUSES",
    "Forbidden",
    "HttpStore",
    "RequestRejected",
    "StoreServerError",
    "Unauthorized",
    "error_from",
]

MAX_KEPT_KEYS = 100_000
"""Rollout keys from claim answers kept for :meth:`HttpStore.rollout_key`, the oldest dropped first."""
MAX_BATCH_BYTES = 8 * 1024 * 1024
"""Largest body the coalescer builds; one caller's larger write is split to fit."""


class HttpStore(HttpRequests, Store):
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
        self._client = http_client(self.url, headers, timeout_s, max_connections)
        http_url = urlsplit(self.url).scheme == "http"
        self._batch = BatchConnections(self.url, headers, timeout_s, max_connections) if http_url else None
        self._coalescer = Coalescer(self, senders, max_batch_bytes, linger_s)
        self._closed = False
        self._keys: dict[tuple[str, int], str] = {}
        self._keys_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"HttpStore({self.url!r})"

    def add_tasks(self, tasks: Iterable[Task]) -> None:
        body = TypeAdapter(list[Task]).dump_json(list(tasks))
        self._post("/v1/tasks", b'{"tasks":' + body + b"}")

    def get_task(self, task_id: str) -> Task:
        return Task.model_validate_json(self._request("GET", f"/v1/tasks/{_seg(task_id)}").content, context=STORED)

    def query_tasks(self, *, split: str | None = None) -> Iterator[Task]:
        return self._stream("/v1/tasks/query", {"split": split}, Task)

    # -- rollouts ------------------------------------------------------------------
    def enqueue(self, rollouts: Sequence[Rollout]) -> list[Rollout]:
        body = ROLLOUT_LIST.dump_json(list(rollouts))
        answer = self._post("/v1/rollouts", b'{"rollouts":' + body + b"}")
        return ROLLOUT_LIST.validate_python(answer.json()["rollouts"], context=STORED)

    def claim(self, runner_id: str, *, limit: int = 1, claim_id: str | None = None) -> list[Rollout]:
        if limit < 1:
            raise ValueError(f"limit: must be at least 1, got {limit}")
        payload = {"runner_id": runner_id, "limit": limit, "claim_id": claim_id or f"claim-{uuid.uuid4().hex}"}
        [result] = self._coalescer.submit([Op("claims", json.dumps(payload).encode())])
        claimed = ROLLOUT_LIST.validate_python(result["rollouts"], context=STORED)
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
        [result] = self._coalescer.submit([Op("finishes", encoded)])
        return Rollout.model_validate(result["rollout"], context=STORED)

    def cancel(self, rollout_ids: Sequence[str]) -> None:
        self._post("/v1/cancellations", {"rollout_ids": list(rollout_ids)})

    def expire(self, *, heartbeat_timeout_s: float, now: float | None = None) -> list[Rollout]:
        answer = self._post("/v1/expirations", {"heartbeat_timeout_s": heartbeat_timeout_s, "now": now})
        return ROLLOUT_LIST.validate_python(answer.json()["rollouts"], context=STORED)

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
