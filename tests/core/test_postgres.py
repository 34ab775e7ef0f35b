"""PostgreSQL-specific behaviour: claims across processes, no open read transactions,
dropped connections, a server that goes away. The shared conformance suite runs on
PostgreSQL too (tests/core/backends/postgres.py); this adds what only a server has."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading
import time

import psycopg
import pytest

from agl.errors import StoreUnavailable
from agl.schema import Rollout, RolloutStatus, Span, Task
from agl.store import open_store
from agl.store.postgres import PostgresDialect, PostgresStore
from tests.pg import create_database, drop_database, postgres_server, restart, shared_server_url

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_url():
    url = create_database(shared_server_url())
    yield url
    drop_database(url)


@pytest.fixture
def pg_store(pg_url):
    store = PostgresStore(pg_url, application_name="agl-test")
    yield store
    store.close()


def _ours(url: str, application_name: str) -> list[tuple[str, str]]:
    """(application_name, state) of every connection a store made to this database."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT application_name, state FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE %s",
            (f"{application_name}-%",),
        ).fetchall()


_CLAIMER = textwrap.dedent(
    """
    import json, sys, threading
    from agl.schema import RolloutStatus, Span
    from agl.store.postgres import PostgresStore

    store = PostgresStore(sys.argv[1])      # every process creates the schema at once
    print("ready", flush=True)
    sys.stdin.readline()                    # go
    got, lock = [], threading.Lock()

    def run():                              # three threads: their writes share group commits
        while True:
            claimed = store.claim(sys.argv[2], limit=2)
            if not claimed:
                return
            for r in claimed:
                store.add_spans([Span(rollout_id=r.rollout_id, name="step", seq=0)])
                store.finish(r.rollout_id, RolloutStatus.SUCCEEDED, output=sys.argv[2])
            with lock:
                got.extend(r.rollout_id for r in claimed)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    print(json.dumps(got), flush=True)
    """
)


def test_claims_are_atomic_across_processes(pg_url):
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CLAIMER, pg_url, f"proc-{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        with PostgresStore(pg_url) as store:
            store.add_tasks([Task(task_id=f"t{i}", input=i) for i in range(30)])
            rollouts = store.enqueue([Rollout(task_id=f"t{i % 30}") for i in range(240)])
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            per_process = [json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for p in procs]
            claimed = [rid for ids in per_process for rid in ids]
            assert len(claimed) == len(set(claimed)), "a rollout was claimed twice"
            assert sorted(claimed) == sorted(r.rollout_id for r in rollouts)
            assert sum(1 for ids in per_process if ids) >= 2, "the claims did not actually run concurrently"
            assert store.stats().rollouts == {"succeeded": 240}
            assert store.stats().spans == 240
            for i, ids in enumerate(per_process):  # each rollout was finished by the process that claimed it
                for r in store.query_rollouts(rollout_ids=ids):
                    assert r.output == f"proc-{i}" and r.attempt == 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_reads_leave_no_transaction_open(pg_url, pg_store):
    pg_store.add_spans(Span(rollout_id="ro-1", seq=i, name="s") for i in range(1200))
    stream = pg_store.query_spans(rollout_id="ro-1")
    first = [next(stream) for _ in range(700)]  # paused in the middle of the second page
    assert first[-1].seq == 699
    pg_store.stats()
    with pytest.raises(KeyError):
        pg_store.get_rollout("ro-missing")
    states = _ours(pg_url, "agl-test")
    assert {name for name, _ in states} == {"agl-test-writer", "agl-test-reader"}
    assert all(state == "idle" for _, state in states), states
    assert [s.seq for s in stream] == list(range(700, 1200))


def test_a_dropped_connection_is_reconnected(pg_url, pg_store):
    pg_store.add_tasks([Task(task_id="t", input=1)])
    assert pg_store.get_task("t").input == 1
    with psycopg.connect(pg_url, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name LIKE 'agl-test-%'"
        ).fetchone()[0]
    assert killed == 2  # the writer and the one reader
    pg_store.enqueue([Rollout(task_id="t", rollout_id="ro-after")])  # the writer reconnects
    assert pg_store.get_rollout("ro-after").status == RolloutStatus.QUEUED  # so does the reader
    assert [r.rollout_id for r in pg_store.claim("r")] == ["ro-after"]


def test_a_locked_table_is_waited_for(pg_url, pg_store):
    pg_store.add_tasks([Task(task_id="t", input=1)])
    done = threading.Event()
    with psycopg.connect(pg_url) as locker:
        locker.execute("LOCK TABLE rollouts IN ACCESS EXCLUSIVE MODE")
        writer = threading.Thread(target=lambda: (pg_store.enqueue([Rollout(task_id="t")]), done.set()))
        writer.start()
        assert not done.wait(0.3), "the write went through a table lock"
        locker.rollback()
    writer.join(10)
    assert done.is_set()
    assert pg_store.stats().rollouts == {"queued": 1}


def test_deadlocks_and_serialization_failures_count_as_transient(pg_url, pg_store):
    dialect = pg_store.dialect
    with psycopg.connect(pg_url) as a, psycopg.connect(pg_url) as b:
        a.execute("CREATE TABLE pair (k INT PRIMARY KEY, v INT)")
        a.execute("INSERT INTO pair VALUES (1, 0), (2, 0)")
        a.commit()
        a.execute("SET deadlock_timeout = '100ms'")
        b.execute("SET deadlock_timeout = '100ms'")
        a.execute("UPDATE pair SET v = 1 WHERE k = 1")
        b.execute("UPDATE pair SET v = 1 WHERE k = 2")
        errors: list[BaseException] = []

        def cross(conn, key):
            try:
                conn.execute("UPDATE pair SET v = 2 WHERE k = %s", (key,))
            except psycopg.Error as exc:
                errors.append(exc)
                conn.rollback()

        threads = [threading.Thread(target=cross, args=(a, 2)), threading.Thread(target=cross, args=(b, 1))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        a.rollback()
        b.rollback()
    assert len(errors) == 1 and isinstance(errors[0], psycopg.errors.DeadlockDetected)
    assert dialect.is_transient(errors[0])
    assert dialect.is_transient(psycopg.errors.SerializationFailure())
    assert dialect.is_transient(psycopg.errors.AdminShutdown())
    assert not dialect.is_transient(psycopg.errors.UniqueViolation())
    assert not dialect.is_transient(psycopg.errors.UndefinedTable())
    assert not dialect.is_transient(ValueError("not a database error"))


def test_an_unreachable_server_fails_clearly():
    from tests.conftest import free_port

    port = free_port()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match=rf"postgresql store at 127\.0\.0\.1:{port}/nowhere.*2 retries"):
        PostgresStore(f"postgresql://agl:secret@127.0.0.1:{port}/nowhere", retries=2, connect_timeout_s=1)
    assert time.monotonic() - started < 10


def test_a_server_that_restarts_is_ridden_out(caplog):
    caplog.set_level(logging.WARNING, logger="agl.store.sql")
    with postgres_server() as base:
        url = create_database(base)
        with PostgresStore(url, retries=10, retry_delay_s=0.05, connect_timeout_s=2) as store:
            store.add_tasks([Task(task_id="t", input=0)])
            store.get_task("t")
            outage = threading.Thread(target=restart, args=(base,), kwargs={"down_s": 0.5})
            outage.start()
            written = []
            while outage.is_alive() or len(written) < 2:  # writes before, through and after the outage
                rollout = Rollout(task_id="t")
                store.enqueue([rollout])  # each returns only once committed
                written.append(rollout.rollout_id)
                time.sleep(0.01)  # the writer's pace
            outage.join()
            assert {r.rollout_id for r in store.query_rollouts()} == set(written)
            assert store.get_task("t").input == 0
    assert any("transient error" in r.getMessage() for r in caplog.records), "the writes never met the outage"


def test_a_server_that_goes_away_fails_writes_clearly_and_never_shows_the_password():
    with postgres_server() as base:
        url = create_database(base)
        store = PostgresStore(url, retries=2, connect_timeout_s=1)
        store.add_tasks([Task(task_id="t", input=1)])
    # the server is stopped now
    try:
        with pytest.raises(StoreUnavailable, match="still unavailable after 2 retries") as info:
            store.add_tasks([Task(task_id="u", input=2)])
        password = url.split(":")[2].split("@")[0]
        assert password not in str(info.value)
        with pytest.raises(StoreUnavailable):
            store.get_task("t")
    finally:
        store.close()


def test_a_retried_finish_of_a_requeued_attempt_is_a_no_op(pg_store):
    pg_store.add_tasks([Task(task_id="t", input=0)])
    [r] = pg_store.enqueue([Rollout(task_id="t", max_attempts=2)])
    pg_store.claim("r")
    assert pg_store.finish(r.rollout_id, "failed").status == "queued"
    assert pg_store.finish(r.rollout_id, "failed").status == "queued"
    assert len(pg_store.attempts(r.rollout_id)) == 1


def test_open_store_picks_postgres(pg_url):
    with open_store(pg_url) as store:
        assert isinstance(store, PostgresStore)
        store.add_tasks([Task(task_id="t", input={"x": [1, 2]})])
        assert store.get_task("t").input == {"x": [1, 2]}


def test_bad_urls_and_options_are_named():
    with pytest.raises(ValueError, match="url"):
        PostgresDialect("postgresql://host:notaport:/x?bad==")
    with pytest.raises(ValueError, match="retries"):
        PostgresStore("postgresql://agl@127.0.0.1:1/x", retries=-1)
