"""The requests :class:`~agl.store.http.HttpStore` makes of its server: one request with retries,
a streamed query resumed where a broken stream stopped, and a coalesced ``/v1/batch``."""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter

from agl.errors import AglError, StoreUnavailable
from agl.retry import Attempts, RetryPolicy
from agl.schema import LLMCall, Reward, Rollout, Span
from agl.store.http_coalesce import Coalescer, Op
from agl.store.http_errors import RequestRejected, Unauthorized, error_from, response_error, status_of
from agl.store.http_transport import BatchConnections
from agl.tokens import STORED

log = logging.getLogger("agl.store.http")

M = TypeVar("M", bound=BaseModel)

_ADAPTERS: dict[str, TypeAdapter] = {
    "spans": TypeAdapter(list[Span]),
    "llm_calls": TypeAdapter(list[LLMCall]),
    "rewards": TypeAdapter(list[Reward]),
}
_MODELS: dict[str, type[BaseModel]] = {"spans": Span, "llm_calls": LLMCall, "rewards": Reward}
ROLLOUT_LIST = TypeAdapter(list[Rollout])
_KINDS = ("spans", "llm_calls", "rewards", "claims", "finishes")


class HttpRequests:
    """The request half of :class:`~agl.store.http.HttpStore` (a mixin: the store sets ``url``,
    ``retry``, ``_client``, ``_batch`` and ``_coalescer``)."""

    url: str
    retry: RetryPolicy
    _client: httpx.Client
    _batch: BatchConnections | None
    _coalescer: Coalescer

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
                raise response_error(response)
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
                raise response_error(response)
            rest = b""
            for chunk in response.iter_bytes():
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    if line.startswith(b'{"agl_stream_error"'):
                        error = json.loads(line)["agl_stream_error"]
                        raise error_from(status_of(error), error)
                    if line:
                        yield line
            if rest.strip():
                raise StoreUnavailable(f"store server {self.url}: stream of {path} ended mid-line")

    # -- coalesced writes ----------------------------------------------------------
    def _send_batch(self, ops: list[Op]) -> None:
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
                op.future.set_exception(error_from(status_of(error), error))
            else:
                op.future.set_result(result)

    def _observations(self, kind: str, items: Iterable[Any]) -> None:
        model = _MODELS[kind]
        values = [item if isinstance(item, model) else model.model_validate(item) for item in items]
        if not values:
            return
        self._coalescer.submit(self._split(kind, values))

    def _split(self, kind: str, values: list[Any]) -> list[Op]:
        payload = _ADAPTERS[kind].dump_json(values)[1:-1]
        if len(payload) <= self._coalescer.max_bytes or len(values) == 1:
            return [Op(kind, payload)]
        half = len(values) // 2
        return self._split(kind, values[:half]) + self._split(kind, values[half:])

    # -- tasks ---------------------------------------------------------------------
