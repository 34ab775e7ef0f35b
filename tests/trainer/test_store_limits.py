"""The store server's limits (issue 16): a body limit on every route, compressed bodies
inflated in pieces and capped, 5xx answers without the server's internals, and a locked
database answered 503 before the client would give up."""

from __future__ import annotations

import contextlib
import gzip
import inspect
import json
import logging
import resource
import sqlite3
import time
import zlib

import httpx
import pytest

from agl.credentials import new_token
from agl.schema import Span
from agl.store.http import HttpStore
from agl.store.sqlite import SqliteStore
from agl_trainer.http.request_body import inflate
from agl_trainer.store_server import DEFAULT_MAX_LOCK_WAIT_S, ServerThread
from tests.conftest import wait_until

LIMIT = 64 * 1024


@contextlib.contextmanager
def served(store, **app_options):
    token = new_token(16)
    with (
        ServerThread(store, token=token, **app_options) as server,
        httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as raw,
    ):
        yield raw, server


@pytest.fixture
def store(tmp_path):
    with SqliteStore(tmp_path / "secret-dir" / "agl.db", busy_timeout_s=0.1) as s:
        yield s


def _spans_body(n: int, text: str = "") -> bytes:
    spans = [{"span_id": f"sp{i}", "name": f"s{i}", "attributes": {"t": text}} for i in range(n)]
    return json.dumps({"spans": spans}).encode()


def _bomb(members: int, member_bytes: int = 16 << 20) -> bytes:
    """``members`` gzip members of ``member_bytes`` zeros each: about 1 MB per GiB inflated."""
    one = gzip.compress(b"\0" * member_bytes, compresslevel=9)
    return one * members


def _post_routes(server) -> list[str]:
    app = server.servers[0].config.app
    while not hasattr(app, "routes"):
        app = app.app
    return sorted({r.path.replace("{rollout_id:path}", "ro-1") for r in app.routes if "POST" in (r.methods or ())})


def test_every_post_route_refuses_a_body_past_the_limit(store):
    big = b'{"x": "' + b"y" * (LIMIT + 10) + b'"}'

    def chunked():
        for i in range(0, len(big), 4096):
            yield big[i : i + 4096]

    with served(store, max_body_bytes=LIMIT) as (raw, server):
        # the dashboard's routes have a limit of their own: tests/reliability/test_body_limits.py
        routes = [path for path in _post_routes(server) if not path.startswith("/ui/")]
        assert {"/v1/batch", "/v1/spans", "/v1/traces", "/v1/rollouts/ro-1/finish"} <= set(routes)
        for path in routes:
            # a body sent without a length is refused as it is read: /v1/flush reads none
            for content in (big, chunked()) if path != "/v1/flush" else (big,):
                answer = raw.post(path, content=content, headers={"Content-Type": "application/json"})
                assert answer.status_code == 413, (path, answer.status_code, answer.text)
                assert answer.json()["error"]["limit"] == LIMIT
        assert raw.post("/v1/spans", content=_spans_body(3)).status_code == 200
        assert store.stats().spans == 3


def test_compressed_bodies_are_inflated_on_every_route(store):
    with served(store, max_body_bytes=LIMIT) as (raw, _):
        body = _spans_body(5)
        deflated = zlib.compress(body)
        bare = zlib.compressobj(wbits=-15)
        bare_deflated = bare.compress(body) + bare.flush()
        for path, content, encoding in [
            ("/v1/spans", gzip.compress(body), "gzip"),
            ("/v1/spans", deflated, "deflate"),
            ("/v1/spans", bare_deflated, "deflate"),
            ("/v1/batch", gzip.compress(body), "gzip"),  # the fast route
            ("/v1/spans", gzip.compress(body[:40]) + gzip.compress(body[40:]), "gzip"),  # two members
        ]:
            answer = raw.post(path, content=content, headers={"Content-Encoding": encoding})
            assert answer.status_code == 200, (path, encoding, answer.text)
        assert store.stats().spans == 5  # the same ids each time: stored once
        cut = raw.post("/v1/spans", content=gzip.compress(body)[:-12], headers={"Content-Encoding": "gzip"})
        assert cut.status_code == 400 and cut.json()["error"]["type"] == "BadEncoding"
        junk = raw.post("/v1/spans", content=b"not gzip at all", headers={"Content-Encoding": "gzip"})
        assert junk.status_code == 400 and "not valid gzip" in junk.json()["error"]["reason"]
        brotli = raw.post("/v1/spans", content=body, headers={"Content-Encoding": "br"})
        assert brotli.status_code == 415 and brotli.json()["error"]["field"] == "Content-Encoding"
        # small compressed, too big inflated
        inflated_big = _spans_body(1, "z" * LIMIT)
        assert len(gzip.compress(inflated_big)) < LIMIT // 10
        for path in ("/v1/spans", "/v1/batch", "/v1/traces"):
            answer = raw.post(path, content=gzip.compress(inflated_big), headers={"Content-Encoding": "gzip"})
            assert answer.status_code == 413, (path, answer.text)


def test_a_gzip_bomb_is_refused_without_inflating_it(store):
    bomb = _bomb(64)  # 1 GiB of zeros
    assert len(bomb) < 1_200_000
    with served(store) as (raw, _):  # the default limit, 32 MiB
        ok = raw.post(
            "/v1/traces",
            content=gzip.compress(b'{"resourceSpans": []}'),
            headers={
                "Content-Encoding": "gzip",
                "Content-Type": "application/json",
            },
        )
        assert ok.status_code == 200, ok.text
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB, the peak so far
        started = time.monotonic()
        for path in ("/v1/traces", "/v1/spans", "/v1/batch"):
            answer = raw.post(path, content=bomb, headers={"Content-Encoding": "gzip"})
            assert answer.status_code == 413, answer.text
        took = time.monotonic() - started
        grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        assert grown_mib < 8, f"the peak memory grew by {grown_mib:.1f} MiB"
        assert took < 10
        assert raw.get("/v1/stats").status_code == 200


def test_inflate_holds_one_piece_at_a_time():
    pieces = inflate(_bomb(1, 1 << 20), b"gzip", 1 << 20)
    sizes = [len(p) for p in pieces]
    assert sum(sizes) == 1 << 20 and max(sizes) <= 64 * 1024


class FailingStore(SqliteStore):
    def add_spans(self, spans):
        raise sqlite3.IntegrityError(f"NOT NULL constraint failed: spans.start_time in {self.path}")


def test_a_500_names_no_database_text_and_gives_a_request_id(tmp_path, caplog):
    with FailingStore(tmp_path / "secret-dir" / "agl.db") as failing, served(failing) as (raw, _):
        for path in ("/v1/spans", "/v1/batch"):
            with caplog.at_level(logging.ERROR, logger="agl_trainer.store_server"):
                answer = raw.post(path, content=_spans_body(1))
            assert answer.status_code == 500
            error = answer.json()["error"]
            assert "secret-dir" not in answer.text and "NOT NULL" not in answer.text
            assert error["request_id"] == answer.headers["X-Request-Id"]
            assert error["request_id"] in error["reason"]
            logged = [r for r in caplog.records if error["request_id"] in r.getMessage()]
            assert logged and "secret-dir" in logged[0].getMessage()


def test_a_locked_database_answers_503_with_retry_after_in_bounded_time(store, caplog):
    lock = sqlite3.connect(store.path, isolation_level=None, timeout=0)
    with served(store, max_lock_wait_s=0.5) as (raw, _):
        lock.execute("BEGIN IMMEDIATE")  # another process writing, for longer than anyone waits
        try:
            for path in ("/v1/spans", "/v1/batch"):
                started = time.monotonic()
                answer = raw.post(path, content=_spans_body(1))
                took = time.monotonic() - started
                assert answer.status_code == 503, answer.text
                assert answer.headers["Retry-After"] == "1"
                assert answer.json()["error"]["request_id"] == answer.headers["X-Request-Id"]
                assert "secret-dir" not in answer.text and "locked" not in answer.text
                assert took < 0.5 + 0.1 + 2.0  # the bound, one busy wait, slack for a loaded machine
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        assert raw.post("/v1/spans", content=_spans_body(1)).status_code == 200


def test_writes_queued_behind_a_locked_one_are_answered_in_the_same_bound(store, caplog):
    import threading

    caplog.set_level(logging.WARNING, logger="agl.store.sql")
    lock = sqlite3.connect(store.path, isolation_level=None, timeout=0)
    with served(store, max_lock_wait_s=3.0) as (raw, _):
        lock.execute("BEGIN IMMEDIATE")
        answers: list[tuple[int, float]] = []

        def write(i: int) -> None:
            started = time.monotonic()
            status = raw.post("/v1/spans", content=_spans_body(1).replace(b"sp0", f"w{i}".encode())).status_code
            answers.append((status, time.monotonic() - started))

        try:
            writers = [threading.Thread(target=write, args=(i,)) for i in range(6)]
            writers[0].start()
            # the others queue behind the first one's retries
            wait_until(
                lambda: any("retrying" in r.getMessage() for r in caplog.records if r.name == "agl.store.sql"),
                "the first write retries the locked database",
            )
            for w in writers[1:]:
                w.start()
            for w in writers:
                w.join()
        finally:
            lock.execute("ROLLBACK")
            lock.close()
    assert [status for status, _ in answers] == [503] * 6
    # each within the bound and a busy wait (about 3.1 s), not one bound after another (about 5.9 s)
    assert max(took for _, took in answers) < 4.5, answers


def test_the_default_lock_wait_ends_before_the_client_gives_up():
    busy = inspect.signature(SqliteStore).parameters["busy_timeout_s"].default
    client_timeout = inspect.signature(HttpStore).parameters["timeout_s"].default
    # the retries stop within the bound; the try under way may still wait one busy timeout, and
    # so may the one try of the writes that queued behind it
    assert DEFAULT_MAX_LOCK_WAIT_S + 2 * busy + 2.0 < client_timeout


def test_the_client_still_sees_a_503_as_unavailable(store):
    token = new_token(16)
    with ServerThread(store, token=token, max_lock_wait_s=0.2) as server:
        lock = sqlite3.connect(store.path, isolation_level=None, timeout=0)
        lock.execute("BEGIN IMMEDIATE")
        try:
            with HttpStore(server.url, token=token, retries=1, backoff_s=0.01) as client:
                from agl.errors import StoreUnavailable

                with pytest.raises(StoreUnavailable, match="request id"):
                    client.add_spans([Span(name="s")])
        finally:
            lock.execute("ROLLBACK")
            lock.close()


BAD_BODIES = [
    b"",
    b"null",
    b"[]",
    b'"x"',
    b"{nope",
    b'{"spans": [null], "rollouts": [1], "tasks": {}, "status": 7}',
    b'{"runner_id": "r", "limit": 99999999999999999999999}',
    b'{"status": "succeeded", "output": NaN, "attempt": 1e400}',
    b'{"heartbeat_timeout_s": Infinity, "now": NaN}',
    b'{"rewards": [{"value": 1, "seq": -99999999999999999999}]}',
    b'{"llm_calls": [{"call_id": "c", "prompt_ids": [1e10], "response_ids": [-1]}]}',
    b"[" * 3000 + b"]" * 3000,
    b'{"a": ' + b"{" * 3000 + b"}" * 3000,
]
BAD_QUERIES = ["step=99999999999999999999", "since=nan", "until=inf", "status=nope", "production=maybe", "x=1"]


def test_no_bad_input_gets_a_5xx_and_the_server_stays_up(store):
    with served(store) as (raw, server):
        routes = _post_routes(server)
        for path in routes:
            for body in BAD_BODIES:
                answer = raw.post(path, content=body, headers={"Content-Type": "application/json"})
                assert answer.status_code < 500, (path, body[:60], answer.status_code, answer.text)
        for path in ("/v1/rollouts/query", "/v1/spans/query", "/v1/llm_calls/query", "/v1/tasks/query", "/v1/stats"):
            for query in BAD_QUERIES:
                answer = raw.get(f"{path}?{query}")
                assert answer.status_code < 500, (path, query, answer.text)
                assert "agl_stream_error" not in answer.text, (path, query, answer.text)
        assert raw.post("/v1/spans", content=_spans_body(2)).status_code == 200
        assert store.stats().spans == 2
