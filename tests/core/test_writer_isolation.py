"""The buffered writer never wedges: refused items are isolated and dropped, outages are bounded, flush has a timeout.

Real stores: a SqliteStore, and a store server (uvicorn on 127.0.0.1) over one,
reached by the real HTTP client. A span with a NaN start time cannot be built
through validation any more, so it is made with ``model_construct``, as a client
older than the validation (or one that skips it) would send it.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import time

import pytest
from starlette.responses import JSONResponse

from agl.capture import BufferedWriter
from agl.capture.writer import DROPPED_SPAN
from agl.credentials import new_token
from agl.errors import StoreUnavailable
from agl.schema import Rollout, Span, Task
from agl.store.http import HttpStore
from agl.store.sqlite import SqliteStore
from agl_trainer.store_server import ServerThread
from tests.conftest import read_asgi_body


def _good(n: int, rollout_id: str = "ro") -> list[Span]:
    return [Span(span_id=f"good{i}", rollout_id=rollout_id, name="step", seq=i) for i in range(n)]


def _nan_span(rollout_id: str = "ro") -> Span:
    fields = Span(span_id="bad-nan", rollout_id=rollout_id, name="step", seq=99).model_dump()
    return Span.model_construct(**{**fields, "start_time": math.nan})


def _split(spans):
    spans = list(spans)
    ids = sorted(s.span_id for s in spans if s.name != DROPPED_SPAN)
    markers = [s for s in spans if s.name == DROPPED_SPAN]
    return ids, markers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PoisonIs500:
    """ASGI middleware: a ``/v1/batch`` body that holds ``marker`` is answered 500, as a buggy server would."""

    def __init__(self, app, marker: bytes):
        self.app, self.marker = app, marker
        self.refused = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/v1/batch":
            return await self.app(scope, receive, send)
        body = await read_asgi_body(receive)
        if self.marker in body:
            self.refused += 1
            answer = JSONResponse({"error": {"type": "IntegrityError", "reason": "boom"}}, status_code=500)
            return await answer(scope, receive, send)
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


def test_one_nan_span_among_good_ones_is_dropped_and_counted_embedded(tmp_path):
    store = SqliteStore(tmp_path / "agl.db")
    w = BufferedWriter(store, interval_s=60)
    try:
        for span in [*_good(3), _nan_span(), *_good(5)[3:]]:
            w.put(span)
        w.flush(timeout_s=10)
        ids, markers = _split(store.query_spans(rollout_id="ro"))
        assert ids == [f"good{i}" for i in range(5)]
        assert w.dropped == {"span": 1} and w.written >= 5
        [(item, error)] = w.rejected
        assert item.span_id == "bad-nan" and "start_time" in str(error)
        [marker] = markers  # the rollout's record of what it lost
        assert marker.status == "error" and marker.attributes["agl.dropped.span"] == 1
        assert "start_time" in marker.attributes["agl.dropped.reason"]
        assert w.pending() == 0
    finally:
        w.close()
        store.close()


def test_one_nan_span_among_good_ones_over_http(tmp_path):
    backing = SqliteStore(tmp_path / "agl.db")
    token = new_token(16)
    with ServerThread(backing, token=token) as server:
        client = HttpStore(server.url, token=token)
        w = BufferedWriter(client, interval_s=60)
        try:
            for span in [*_good(5), _nan_span()]:
                w.put(span)
            w.flush(timeout_s=10)
            ids, markers = _split(backing.query_spans(rollout_id="ro"))
            assert ids == [f"good{i}" for i in range(5)]
            assert w.dropped == {"span": 1} and len(markers) == 1
        finally:
            w.close()
            client.close()
    backing.close()


def test_a_500_is_split_too_and_only_the_item_it_follows_is_dropped(tmp_path):
    backing = SqliteStore(tmp_path / "agl.db")
    token = new_token(16)
    faults: list[PoisonIs500] = []

    def inject(app):
        faults.append(PoisonIs500(app, b"poison"))
        return faults[0]

    with ServerThread(backing, token=token, middleware=inject) as server:
        client = HttpStore(server.url, token=token)
        w = BufferedWriter(client, interval_s=60)
        try:
            spans = _good(7)
            spans.insert(4, Span(span_id="poison", rollout_id="ro", name="step"))
            for span in spans:
                w.put(span)
            w.flush(timeout_s=10)
            ids, markers = _split(backing.query_spans(rollout_id="ro"))
            assert ids == [f"good{i}" for i in range(7)]
            assert w.dropped == {"span": 1} and [i.span_id for i, _ in w.rejected] == ["poison"]
            assert markers[0].attributes["agl.dropped.span"] == 1
            assert faults[0].refused >= 2  # the whole batch, then the halves that held it
        finally:
            w.close()
            client.close()
    backing.close()


def test_a_server_answering_500_to_everything_is_retried_not_emptied(tmp_path):
    backing = SqliteStore(tmp_path / "agl.db")
    token = new_token(16)
    faults: list[PoisonIs500] = []

    def inject(app):
        faults.append(PoisonIs500(app, b'"spans"'))  # every batch of spans fails
        return faults[0]

    with ServerThread(backing, token=token, middleware=inject) as server:
        client = HttpStore(server.url, token=token)
        w = BufferedWriter(client, interval_s=0.05)
        try:
            for span in _good(4):
                w.put(span)
            with pytest.raises(StoreUnavailable, match="4 observations still buffered"):
                w.flush(timeout_s=1)
            assert not w.dropped  # nothing went through, so nothing is blamed on the data
            faults[0].marker = b"never in a body"  # the server is fixed
            w.flush(timeout_s=10)
            assert _split(backing.query_spans(rollout_id="ro"))[0] == [f"good{i}" for i in range(4)]
        finally:
            w.close()
            client.close()
    backing.close()


def test_flush_against_a_down_store_returns_on_time_with_a_clear_error():
    client = HttpStore(f"http://127.0.0.1:{_free_port()}", token="t")
    w = BufferedWriter(client, interval_s=0.05)
    try:
        for span in _good(3):
            w.put(span)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            w.flush(timeout_s=1)
        took = time.monotonic() - started
        assert 0.9 <= took < 1.6, f"flush(timeout_s=1) took {took:.2f}s"
        message = str(caught.value)
        assert "3 observations still buffered after 1s" in message and "last error" in message
        assert w.pending() == 3 and not w.dropped
    finally:
        with pytest.raises(StoreUnavailable):
            w.close(timeout_s=0.1)  # still down: close says so too
        client.close()


def test_transient_retries_are_bounded_in_time():
    client = HttpStore(f"http://127.0.0.1:{_free_port()}", token="t", retries=0)
    w = BufferedWriter(client, interval_s=0.05, retry_for_s=0.5)
    try:
        for span in _good(3):
            w.put(span)
        started = time.monotonic()
        w.flush(timeout_s=10)  # returns once the items are given up on
        assert time.monotonic() - started < 5
        assert w.dropped.get("span", 0) >= 3 and w.pending() == 0
        assert any("failed for over 0.5s" in str(exc) for _, exc in w.rejected)
    finally:
        with contextlib.suppress(StoreUnavailable):
            w.close(timeout_s=5)
        client.close()


def test_dropped_counts_are_json_attributes(tmp_path):
    store = SqliteStore(tmp_path / "agl.db")
    w = BufferedWriter(store, interval_s=60)
    try:
        w.put(_nan_span("ro-a"))
        w.put(_good(1, "ro-b")[0])
        w.flush(timeout_s=10)
        [marker] = [s for s in store.query_spans(rollout_id="ro-a") if s.name == DROPPED_SPAN]
        json.dumps(marker.attributes)
        assert not [s for s in store.query_spans(rollout_id="ro-b") if s.name == DROPPED_SPAN]
    finally:
        w.close()
        store.close()


def test_writes_a_runner_token_may_not_make_are_dropped_not_retried(tmp_path):
    """A runner token writes running rollouts only: a late span of an ended rollout is refused
    (403) and dropped, and the running rollout's spans behind it are not held up."""
    backing = SqliteStore(tmp_path / "agl.db")
    backing.add_tasks([Task(task_id="t0", input=0), Task(task_id="t1", input=1)])
    backing.enqueue([Rollout(rollout_id="ro-live", task_id="t0"), Rollout(rollout_id="ro-ended", task_id="t1")])
    admin, runner = new_token(16), new_token(16)
    with ServerThread(backing, token=admin, runner_token=runner) as server:
        client = HttpStore(server.url, token=runner)
        w = BufferedWriter(client, interval_s=60)
        try:
            [claimed] = client.claim("runner-a", limit=1)
            ended = "ro-ended" if claimed.rollout_id == "ro-live" else "ro-live"
            backing.cancel([ended])
            w.put(Span(span_id="late", rollout_id=ended, name="step"))
            for span in _good(3, claimed.rollout_id):
                w.put(span)
            started = time.monotonic()
            w.flush(timeout_s=10)
            assert time.monotonic() - started < 5
            ids = _split(backing.query_spans(rollout_id=claimed.rollout_id))[0]
            assert ids == ["good0", "good1", "good2"]
            # the late span, then its record of loss, refused for the same reason (and not recorded again)
            late, record = (item for item, _ in w.rejected)
            assert late.span_id == "late" and record.name == DROPPED_SPAN and w.dropped == {"span": 2}
            assert w.pending() == 0
        finally:
            w.close()
            client.close()
    backing.close()
