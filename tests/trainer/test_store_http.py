"""The store server and its client: auth, bad input, streaming, coalescing, retries."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time

import httpx
import pytest
from starlette.responses import JSONResponse
from starlette.routing import Route

import agl
from agl import plugins
from agl.credentials import new_token
from agl.errors import InvalidTransition, NotFound, StoreUnavailable
from agl.schema import Rollout, RolloutStatus, Span, Task
from agl.store.http import HttpStore, RequestRejected, Unauthorized
from agl.store.sqlite import SqliteStore
from agl_trainer.store_server import ServerThread
from tests.conftest import wait_until


class CountingStore(SqliteStore):
    """A SqliteStore that counts the calls the server makes and how far queries were read."""

    def __init__(self, path):
        super().__init__(path)
        self.calls: dict[str, int] = {}
        self.spans_read = 0
        self._count_lock = threading.Lock()

    def _count(self, name: str) -> None:
        with self._count_lock:
            self.calls[name] = self.calls.get(name, 0) + 1

    def add_spans(self, spans):
        self._count("add_spans")
        return super().add_spans(spans)

    def claim(self, runner_id, *, limit=1, claim_id=None):
        self._count("claim")
        return super().claim(runner_id, limit=limit, claim_id=claim_id)

    fail_after: int | None = None

    def query_spans(self, **filters):
        for span in super().query_spans(**filters):
            if self.fail_after is not None and self.spans_read >= self.fail_after:
                raise StoreUnavailable("database went away mid-query")
            self.spans_read += 1
            yield span


@contextlib.contextmanager
def served(tmp_path, middleware=None, **app_options):
    backing = CountingStore(tmp_path / "agl.db")
    token = new_token(16)
    try:
        with (
            ServerThread(backing, token=token, middleware=middleware, **app_options) as server,
            httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}) as raw,
        ):
            client = HttpStore(server.url, token=token, backoff_s=0.01)
            try:
                yield backing, client, raw, server
            finally:
                client.close()
    finally:
        backing.close()


def _seed(store, n=2):
    store.add_tasks([Task(task_id="t0", input={"q": 1})])
    return store.enqueue([Rollout(task_id="t0") for _ in range(n)])


def test_token_is_required_and_compared(tmp_path):
    with served(tmp_path) as (_, client, raw, server):
        assert httpx.get(f"{server.url}/healthz").json() == {"ok": True}
        missing = httpx.get(f"{server.url}/v1/stats")
        assert missing.status_code == 401 and missing.json()["error"]["reason"] == "missing bearer token"
        wrong = httpx.get(f"{server.url}/v1/stats", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["reason"] == "wrong bearer token"
        assert raw.get("/v1/stats").status_code == 200
        with HttpStore(server.url, token="wrong") as bad:
            with pytest.raises(Unauthorized, match="AGL_STORE_TOKEN"):
                bad.stats()
            with pytest.raises(Unauthorized):
                bad.add_spans([Span(name="s")])
        assert client.stats().spans == 0


def test_oversized_bodies_get_413(tmp_path):
    with served(tmp_path, max_body_bytes=4096) as (backing, client, raw, _):
        big = {"spans": [{"name": "s", "attributes": {"text": "x" * 5000}}]}
        declared = raw.post("/v1/spans", json=big)
        assert declared.status_code == 413 and declared.json()["error"]["field"] == "body"

        def chunks():  # no Content-Length: the streamed size is checked
            payload = json.dumps(big).encode()
            for i in range(0, len(payload), 1000):
                yield payload[i : i + 1000]

        streamed = raw.post("/v1/spans", content=chunks())
        assert streamed.status_code == 413
        with pytest.raises(RequestRejected, match="body: request body exceeds the limit of 4096 bytes"):
            client.add_spans([Span(name="s", attributes={"text": "x" * 5000})])
        client.add_spans([Span(name="small")])  # a small one still goes through
        assert backing.stats().spans == 1


def test_bad_bodies_get_422_naming_the_field(tmp_path):
    with served(tmp_path) as (backing, client, raw, _):
        no_name = raw.post("/v1/spans", json={"spans": [{"name": "ok"}, {"kind": "llm"}]})
        assert no_name.status_code == 422
        assert no_name.json()["error"]["field"] == "spans.1.name"
        assert no_name.json()["error"]["reason"] == "Field required"
        bad_kind = raw.post("/v1/spans", json={"spans": [{"name": "s", "kind": "banana"}]})
        assert bad_kind.json()["error"]["field"] == "spans.0.kind"
        not_json = raw.post("/v1/claims", content=b"{nope", headers={"Content-Type": "application/json"})
        assert not_json.status_code == 422 and not_json.json()["error"]["field"] == "body"
        assert "invalid JSON" in not_json.json()["error"]["reason"]
        limit = raw.post("/v1/claims", json={"runner_id": "r", "limit": 0})
        assert limit.status_code == 422 and limit.json()["error"]["field"] == "limit"
        finish = {"rollout_id": "ro-1", "status": "succeeded", "attempt": 0}
        attempt = raw.post("/v1/batch", json={"finishes": [finish]})
        assert attempt.status_code == 422 and attempt.json()["error"]["field"] == "finishes.0.attempt"
        call = {"call_id": "c", "prompt_ids": "!!", "response_ids": []}
        tokens = raw.post("/v1/llm_calls", json={"llm_calls": [call]})
        assert tokens.json()["error"]["field"] == "llm_calls.0.prompt_ids"
        extra = raw.post("/v1/rollouts/query", json={"bogus": 1})
        assert extra.status_code == 422 and extra.json()["error"]["field"] == "bogus"
        with pytest.raises(RequestRejected, match="^kind: ") as caught:
            list(client.query_spans(kind="banana"))
        assert caught.value.field == "kind" and isinstance(caught.value, ValueError)
        assert backing.stats().spans == 0  # nothing half-stored from the refused bodies


def test_unknown_ids_get_404_and_forbidden_transitions_409(tmp_path):
    with served(tmp_path) as (_, client, raw, _server):
        [r] = _seed(client, 1)
        missing = raw.get("/v1/rollouts/ro-nope")
        assert missing.status_code == 404
        assert missing.json()["error"] == {
            "type": "NotFound",
            "kind": "rollout",
            "ident": "ro-nope",
            "reason": "unknown rollout 'ro-nope'",
        }
        assert raw.get("/v1/rollouts/ro-nope/attempts").status_code == 404
        assert raw.get("/v1/tasks/t-nope").status_code == 404
        assert raw.get("/v1/model_versions/v9").status_code == 404
        early = raw.post(f"/v1/rollouts/{r.rollout_id}/finish", json={"status": "succeeded"})
        assert early.status_code == 409 and early.json()["error"]["type"] == "InvalidTransition"
        with pytest.raises(NotFound, match="ro-nope"):
            client.finish("ro-nope", RolloutStatus.SUCCEEDED)
        with pytest.raises(InvalidTransition):
            client.finish(r.rollout_id, RolloutStatus.SUCCEEDED)


def test_get_queries_take_repeated_parameters(tmp_path):
    with served(tmp_path) as (_, client, raw, _server):
        _seed(client, 3)
        client.claim("r")
        response = raw.get("/v1/rollouts/query", params=[("status", "queued"), ("status", "running")])
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in response.text.splitlines()]
        assert sorted(line["status"] for line in lines) == ["queued", "queued", "running"]
        bad = raw.get("/v1/rollouts/query", params={"status": "sleeping"})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "status.0"


def test_large_queries_stream(tmp_path):
    total = 30_000
    with served(tmp_path) as (backing, client, raw, _):
        pad = "x" * 1000
        for start in range(0, total, 5000):
            backing.add_spans(
                Span(rollout_id="ro-big", seq=i, name="s", attributes={"pad": pad}) for i in range(start, start + 5000)
            )
        with raw.stream("POST", "/v1/spans/query", json={"rollout_id": "ro-big"}) as response:
            first = next(response.iter_lines())
            assert json.loads(first)["seq"] == 0
            time.sleep(0.3)  # the server stops at the socket's buffer, not at the end of the table
            assert backing.spans_read < total / 2
        seqs = [s.seq for s in client.query_spans(rollout_id="ro-big")]
        assert seqs == list(range(total))


def test_concurrent_writes_are_coalesced_and_acknowledged(tmp_path):
    threads, calls_each = 48, 5
    with served(tmp_path) as (backing, client, _raw, _server):
        barrier = threading.Barrier(threads)
        failures: list[BaseException] = []

        def writer(w: int) -> None:
            try:
                barrier.wait()
                for c in range(calls_each):
                    span = Span(span_id=f"s-{w}-{c}", rollout_id=f"ro-{w}", seq=c, name="chat", kind="llm")
                    client.add_spans([span])
                    # acknowledged means stored: the server's own store has it already
                    assert [s.span_id for s in backing.query_spans(rollout_id=f"ro-{w}")][-1] == span.span_id
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                failures.append(exc)

        pool = [threading.Thread(target=writer, args=(w,)) for w in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        assert not failures, failures[:3]
        assert backing.stats().spans == threads * calls_each
        requests = backing.calls["add_spans"]
        assert requests < threads * calls_each / 2, f"{requests} requests for {threads * calls_each} calls"


class FailAfterServing:
    """ASGI middleware: the first ``times`` matching requests are served, then answered 503.

    The server stores the write but the client sees a failure, as when a proxy
    drops the answer: the client must retry, and the retry must not store twice.
    The ``Idempotency-Key`` is recorded, then hidden from the server (as after a
    restart that emptied its cache of answers), so ids alone must prevent doubles.
    """

    def __init__(self, app, path: str, times: int):
        self.app, self.path, self.left = app, path, times
        self.seen_keys: list[str] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != self.path:
            return await self.app(scope, receive, send)
        if self.left <= 0:
            scope = dict(scope, headers=[(k, v) for k, v in scope["headers"] if k != b"idempotency-key"])
            return await self.app(scope, receive, send)
        self.left -= 1
        self.seen_keys.append(dict(scope["headers"]).get(b"idempotency-key", b"").decode())
        scope = dict(scope, headers=[(k, v) for k, v in scope["headers"] if k != b"idempotency-key"])

        async def swallow(message):
            pass

        await self.app(scope, receive, swallow)
        lost = JSONResponse({"error": {"type": "Injected", "reason": "answer lost"}}, status_code=503)
        await lost(scope, receive, send)


def test_a_retried_write_is_stored_once(tmp_path):
    faults: list[FailAfterServing] = []

    def inject(app):
        faults.append(FailAfterServing(app, "/v1/batch", times=2))
        return faults[0]

    with served(tmp_path, middleware=inject) as (backing, client, _raw, _server):
        spans = [Span(span_id=f"s{i}", rollout_id="ro-1", seq=i, name="chat") for i in range(3)]
        client.add_spans(spans)  # served, answer lost, retried, served again, lost again, retried
        assert faults[0].left == 0
        assert len(set(faults[0].seen_keys)) == 1 and faults[0].seen_keys[0]  # one key across retries
        assert backing.stats().spans == 3
        assert [s.span_id for s in backing.query_spans(rollout_id="ro-1")] == ["s0", "s1", "s2"]


def test_a_retried_claim_claims_once(tmp_path):
    faults: list[FailAfterServing] = []

    def inject(app):
        faults.append(FailAfterServing(app, "/v1/batch", times=0))
        return faults[0]

    with served(tmp_path, middleware=inject) as (backing, client, _raw, server):
        _seed(backing, 4)
        faults[0].left = 1
        got = client.claim("runner", limit=2)
        assert len(got) == 2 and all(r.status == RolloutStatus.RUNNING for r in got)
        assert backing.stats().rollouts == {"running": 2, "queued": 2}
        assert backing.calls["claim"] == 1 + 1  # served twice, claimed once (same claim_id)


def test_the_server_cache_is_not_needed_for_idempotency(tmp_path):
    with served(tmp_path) as (backing, _client, raw, _server):
        body = {"spans": [{"span_id": "same", "name": "s"}]}
        for key in ("k1", "k2", "k1"):
            assert raw.post("/v1/batch", json=body, headers={"Idempotency-Key": key}).status_code == 200
        assert backing.stats().spans == 1


def test_transient_connection_failures_are_retried(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="agl.store.http")
    backing = SqliteStore(tmp_path / "agl.db")
    token = new_token(8)
    server = ServerThread(backing, token=token)
    port = server.port
    client = HttpStore(server.url, token=token, backoff_s=0.2, retries=6)
    try:
        done = threading.Event()

        def late_start():
            wait_until(
                lambda: any("retrying" in r.getMessage() for r in caplog.records if r.name == "agl.store.http"),
                "the client has failed to connect and retries",
            )
            server.start()

        threading.Thread(target=late_start).start()
        # nothing listens yet: the first tries fail to connect, later ones reach the server
        client.add_spans([Span(span_id="early", name="s")])
        done.set()
        assert backing.stats().spans == 1 and server.port == port
    finally:
        client.close()
        server.stop()
        backing.close()


def test_connections_kept_alive_across_a_server_restart_are_replaced_without_a_retry(tmp_path):
    backing = SqliteStore(tmp_path / "agl.db")
    token = new_token(8)
    first = ServerThread(backing, token=token).start()
    port = first.port
    client = HttpStore(first.url, token=token, retries=0)  # any failed request would raise
    try:
        client.add_spans([Span(span_id="before", name="s")])  # a kept-alive batch connection
        assert client.stats().spans == 1  # and a kept-alive one of the httpx client
        first.stop()  # closes both on the server's side
        with ServerThread(backing, token=token, port=port):
            client.add_spans([Span(span_id="after", name="s")])
            assert client.stats().spans == 2
    finally:
        client.close()
        backing.close()


def test_proxies_from_the_environment_are_not_used(tmp_path, monkeypatch):
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there: a proxied request would fail
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with served(tmp_path) as (backing, _, _raw, server), HttpStore(server.url, token=server.token, retries=0) as c:
        c.add_spans([Span(span_id="s", name="s")])
        assert c.stats().spans == 1 and backing.stats().spans == 1


class RoutesPlugin:
    @agl.hookimpl
    def agl_store_routes(self, store):
        async def ping(request):
            return JSONResponse({"spans": store.stats().spans})

        return [Route("/v1/plugin/ping", ping)]


def test_plugin_routes_are_mounted_behind_the_token(tmp_path):
    plugin = RoutesPlugin()
    plugins.register(plugin, name="test-routes")
    try:
        with served(tmp_path) as (_, _client, raw, server):
            assert raw.get("/v1/plugin/ping").json() == {"spans": 0}
            assert httpx.get(f"{server.url}/v1/plugin/ping").status_code == 401
    finally:
        plugins.unregister(name="test-routes")


def test_ids_with_slashes_and_spaces_round_trip(tmp_path):
    with served(tmp_path) as (_, client, _raw, _server):
        client.add_tasks([Task(task_id="gsm8k/train 17", input={"q": 1})])
        assert client.get_task("gsm8k/train 17").task_id == "gsm8k/train 17"
        [r] = client.enqueue([Rollout(rollout_id="ro/1", task_id="gsm8k/train 17")])
        client.claim("r")
        assert client.finish("ro/1", RolloutStatus.SUCCEEDED).status == RolloutStatus.SUCCEEDED
        assert [a.attempt for a in client.attempts("ro/1")] == [1]
        assert client.get_rollout("ro/1").rollout_id == "ro/1"
        from agl.schema import ModelVersion

        client.add_model_version(ModelVersion(version="ckpt/step-10"))
        assert client.get_model_version("ckpt/step-10").version == "ckpt/step-10"
        with pytest.raises(NotFound, match="ckpt/none"):
            client.get_model_version("ckpt/none")


def test_a_query_failing_midway_ends_with_an_error_line(tmp_path):
    with served(tmp_path) as (backing, client, raw, _server):
        backing.add_spans(Span(rollout_id="ro-1", seq=i, name="s") for i in range(1000))
        backing.fail_after = 600
        lines = raw.post("/v1/spans/query", json={}).text.splitlines()
        assert len(lines) == 601
        assert json.loads(lines[-1])["agl_stream_error"]["type"] == "StoreUnavailable"
        backing.spans_read = 0
        seen = []
        with pytest.raises(StoreUnavailable, match="unavailable; retry shortly \\(request id "):  # no database text
            for span in client.query_spans():
                seen.append(span.seq)
        assert seen == list(range(600))  # what came before the failure is not lost or repeated


def test_one_large_write_is_split_to_fit_the_batch_limit(tmp_path):
    with served(tmp_path) as (backing, _client, _raw, server):
        with HttpStore(server.url, token=server.token, max_batch_bytes=20_000) as small:
            small.add_spans([Span(span_id=f"s{i}", name="s", attributes={"pad": "x" * 1000}) for i in range(60)])
        assert backing.stats().spans == 60
        assert backing.calls["add_spans"] >= 3


class ThreadRecordingStore(SqliteStore):
    """A SqliteStore that records which thread queued each write (the server's batch path stays on)."""

    def __init__(self, path):
        super().__init__(path)
        self.write_threads: list[threading.Thread] = []

    def _write_all(self, fns):
        self.write_threads.append(threading.current_thread())
        return super()._write_all(fns)


def test_a_lone_caller_sends_itself_and_the_idle_server_commits_on_its_event_loop(tmp_path, monkeypatch):
    from agl_trainer.store_server import app as server_module

    # no batch counts as slow, however busy the shared host: only the idle path is under test here
    monkeypatch.setattr(server_module, "INLINE_MAX_S", 60.0)
    backing = ThreadRecordingStore(tmp_path / "agl.db")
    token = new_token(16)
    with ServerThread(backing, token=token) as server:
        client = HttpStore(server.url, token=token)
        senders: list[threading.Thread] = []
        send_batch = client._send_batch
        client._send_batch = lambda ops: (senders.append(threading.current_thread()), send_batch(ops))[1]
        try:
            _seed(client, 3)
            del backing.write_threads[:]
            for _ in range(3):
                [rollout] = client.claim("r1")
                client.add_spans([Span(rollout_id=rollout.rollout_id, name="chat", kind="llm")])
                client.finish(rollout.rollout_id, RolloutStatus.SUCCEEDED)
        finally:
            client.close()
        loop_thread = server.thread
    backing.close()
    assert senders and set(senders) == {threading.current_thread()}  # no hand-off to a sender thread
    assert backing.write_threads and set(backing.write_threads) == {loop_thread}  # nor to a worker thread
    assert backing.stats().rollouts == {"succeeded": 3}


def test_more_callers_than_senders_are_all_answered_and_close_is_prompt(tmp_path):
    threads, calls_each, senders = 16, 10, 2
    with served(tmp_path) as (backing, _client, raw, server):
        client = HttpStore(server.url, token=raw.headers["Authorization"].removeprefix("Bearer "), senders=senders)
        in_flight, most = [0], [0]
        lock = threading.Lock()
        send_batch = client._send_batch

        def counted(ops):
            with lock:
                in_flight[0] += 1
                most[0] = max(most[0], in_flight[0])
            try:
                time.sleep(0.002)  # long enough for calls to pile up behind the busy senders
                send_batch(ops)
            finally:
                with lock:
                    in_flight[0] -= 1

        client._send_batch = counted
        barrier = threading.Barrier(threads)

        def writer(w: int) -> None:
            barrier.wait()
            for c in range(calls_each):
                client.add_spans([Span(span_id=f"s-{w}-{c}", rollout_id=f"ro-{w}", name="chat", kind="llm")])

        pool = [threading.Thread(target=writer, args=(w,)) for w in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in pool)
        started = time.monotonic()
        client.close()
        assert time.monotonic() - started < 5
        assert 1 < most[0] <= senders
        assert backing.stats().spans == threads * calls_each


def test_a_slow_batch_on_the_event_loop_sends_the_next_ones_to_threads(tmp_path, monkeypatch):
    from agl_trainer.store_server import app as server_module

    backing = ThreadRecordingStore(tmp_path / "agl.db")
    token = new_token(16)
    monkeypatch.setattr(server_module, "INLINE_MAX_S", 0.0)  # every inline batch counts as slow
    with ServerThread(backing, token=token) as server:
        client = HttpStore(server.url, token=token)
        try:
            _seed(client, 2)
            del backing.write_threads[:]
            for rollout in client.claim("r1", limit=2):
                client.finish(rollout.rollout_id, RolloutStatus.SUCCEEDED)
        finally:
            client.close()
        loop_thread = server.thread
    backing.close()
    assert backing.write_threads[0] is loop_thread
    assert all(t is not loop_thread for t in backing.write_threads[1:]) and len(backing.write_threads) == 3
