"""The embedded SQLite store under locks, crashes and many threads."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from agl.errors import IncompatibleStore, NotFound, StoreUnavailable
from agl.schema import Rollout, Span, Task
from agl.store.sqlite import SqliteStore
from tests.conftest import wait_until


def _quick(path, **options) -> SqliteStore:
    """A store with a small retry budget: 50 ms busy wait, 3 retries from 10 ms."""
    return SqliteStore(path, busy_timeout_s=0.05, retries=3, retry_delay_s=0.01, **options)


def test_a_lock_that_outlives_the_retries_fails_clearly_then_writes_resume(tmp_path):
    path = tmp_path / "agl.db"
    store = _quick(path)
    try:
        store.add_tasks([Task(task_id="before", input=0)])
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=rf"sqlite store {path}.*3 retries.*locked"):
            store.add_tasks([Task(task_id="during", input=1)])
        assert time.monotonic() - started < 2
        assert store.get_task("before").input == 0  # WAL: reads go on under the lock
        locker.execute("ROLLBACK")
        locker.close()
        store.add_tasks([Task(task_id="after", input=2)])
        assert [t.task_id for t in store.query_tasks()] == ["before", "after"]
    finally:
        store.close()


_LOCKER = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    sys.stdin.readline()  # held until the test says
    conn.execute("ROLLBACK")
    """
)


def test_a_lock_held_by_another_process_is_retried_until_it_goes(tmp_path, caplog):
    path = tmp_path / "agl.db"
    store = SqliteStore(path, busy_timeout_s=0.05, retries=10, retry_delay_s=0.02)
    locker = subprocess.Popen(
        [sys.executable, "-c", _LOCKER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    released = threading.Event()

    def release_once_retried() -> None:
        wait_until(
            lambda: any("locked" in r.getMessage() and "retrying" in r.getMessage() for r in caplog.records),
            "the store retries the locked write",
        )
        released.set()  # before the lock goes: the write cannot end before this
        locker.stdin.write("go\n")
        locker.stdin.flush()

    try:
        assert locker.stdout.readline().strip() == "locked"
        with caplog.at_level(logging.WARNING, logger="agl.store.sql"):
            releaser = threading.Thread(target=release_once_retried)
            releaser.start()
            store.add_tasks([Task(task_id="t", input=1)])
        releaser.join(10)
        assert released.is_set()  # it did wait for the other process
        assert any("locked" in r.getMessage() and "retrying" in r.getMessage() for r in caplog.records)
        assert store.get_task("t").input == 1
    finally:
        if locker.poll() is None and not locker.stdin.closed:
            locker.stdin.close()  # a locker still waiting reads EOF and lets go
        locker.wait(10)
        store.close()


def test_a_store_opened_on_a_locked_file_fails_clearly(tmp_path):
    path = tmp_path / "agl.db"
    SqliteStore(path).close()
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreUnavailable, match="locked"):
            _quick(path)
    finally:
        locker.execute("ROLLBACK")
        locker.close()


_WRITER = textwrap.dedent(
    """
    import sys, threading
    from agl.schema import Span
    from agl.store.sqlite import SqliteStore

    store = SqliteStore(sys.argv[1])
    lock = threading.Lock()

    def write(prefix):
        i = 0
        while True:
            span = Span(span_id=f"{prefix}-{i}", rollout_id="ro-kill", name="s", seq=i)
            store.add_spans([span])             # returns once committed
            with lock:
                print(span.span_id, flush=True)  # acknowledged
            i += 1

    for n in range(4):
        threading.Thread(target=write, args=(f"w{n}",), daemon=True).start()
    threading.Event().wait()
    """
)


def test_a_sigkilled_writer_loses_nothing_it_acknowledged(tmp_path):
    path = tmp_path / "agl.db"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    acknowledged = []
    try:
        while len(acknowledged) < 400:
            line = proc.stdout.readline()
            assert line, "the writer died on its own"
            acknowledged.append(line.strip())
        os.kill(proc.pid, signal.SIGKILL)
        acknowledged += [line.strip() for line in proc.stdout if line.strip()]  # printed before the kill
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    with SqliteStore(path) as store:
        stored = {s.span_id for s in store.query_spans(rollout_id="ro-kill")}
    missing = set(acknowledged) - stored
    assert not missing, f"{len(missing)} acknowledged spans lost, e.g. {sorted(missing)[:3]}"


class _CountingStore(SqliteStore):
    """Records the size of every group the writer thread commits."""

    def __init__(self, *args, **kwargs):
        self.groups: list[int] = []
        super().__init__(*args, **kwargs)

    def _run_in_transaction(self, jobs, **kwargs):
        self.groups.append(len(jobs))
        return super()._run_in_transaction(jobs, **kwargs)


def test_many_threads_share_group_commits_and_one_bad_write_fails_alone(tmp_path):
    store = _CountingStore(tmp_path / "agl.db")
    store.add_tasks([Task(task_id="t", input=0)])
    errors: list[BaseException] = []
    barrier = threading.Barrier(33)

    def spans(n):
        barrier.wait()
        for i in range(40):
            store.add_spans([Span(span_id=f"t{n}-{i}", rollout_id=f"ro-{n}", name="s", seq=i)])

    def bad():
        barrier.wait()
        for _ in range(20):
            try:
                store.enqueue([Rollout(task_id="no-such-task")])
            except NotFound as exc:
                errors.append(exc)

    threads = [threading.Thread(target=spans, args=(n,)) for n in range(32)] + [threading.Thread(target=bad)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert store.stats().spans == 32 * 40
        assert len(errors) == 20 and all("no-such-task" in str(e) for e in errors)
        assert store.stats().rollouts == {}
        written = 32 * 40 + 20 + 1
        assert sum(store.groups) == written + 1  # + the schema
        assert max(store.groups) > 1 and len(store.groups) < written, "no writes shared a commit"
    finally:
        store.close()


def test_readers_are_bounded_and_shared_between_threads(tmp_path):
    store = SqliteStore(tmp_path / "agl.db", max_readers=2)
    store.add_spans(Span(rollout_id="ro", seq=i, name="s") for i in range(1100))
    counts: list[int] = []

    def read():
        counts.append(sum(1 for _ in store.query_spans(rollout_id="ro")))

    threads = [threading.Thread(target=read) for _ in range(12)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert counts == [1100] * 12
        assert store._pool._count <= 2
    finally:
        store.close()


def test_a_closed_store_refuses_writes(tmp_path):
    store = SqliteStore(tmp_path / "agl.db")
    store.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        store.add_tasks([Task(input=1)])


@pytest.mark.parametrize(
    ("options", "field"),
    [({"retries": -1}, "retries"), ({"max_readers": 0}, "max_readers"), ({"busy_timeout_s": -1}, "busy_timeout_s")],
)
def test_bad_options_are_named(tmp_path, options, field):
    with pytest.raises(ValueError, match=field):
        SqliteStore(tmp_path / "agl.db", **options)


def test_memory_databases_are_refused():
    with pytest.raises(ValueError, match="path"):
        SqliteStore(":memory:")


def test_a_retried_finish_of_a_requeued_attempt_is_a_no_op(tmp_path):
    with SqliteStore(tmp_path / "agl.db") as store:
        store.add_tasks([Task(task_id="t", input=0)])
        [r] = store.enqueue([Rollout(task_id="t", max_attempts=2)])
        store.claim("r")
        first = store.finish(r.rollout_id, "failed", error="boom")
        again = store.finish(r.rollout_id, "failed", error="boom")  # the reply to the first was lost
        assert first.status == again.status == "queued" and again.attempt == 1
        assert [a.status for a in store.attempts(r.rollout_id)] == ["failed"]
        with pytest.raises(ValueError, match="cannot go from 'queued' to 'succeeded'"):
            store.finish(r.rollout_id, "succeeded")


def test_checkpoints_run_off_the_commit_path_and_the_log_stays_bounded(tmp_path, monkeypatch):
    import agl.store.sqlite as sqlite_module

    monkeypatch.setattr(sqlite_module, "CHECKPOINT_INTERVAL_S", 0.05)
    monkeypatch.setattr(sqlite_module, "WAL_BACKSTOP_PAGES", 4096)  # reached by the writes below
    path = tmp_path / "agl.db"
    pad = "x" * 2000
    with SqliteStore(path) as store:
        for i in range(300):  # about 4 MiB, well under the writer's own checkpoint threshold
            store.add_spans(
                [
                    Span(span_id=f"s{i}-{k}", rollout_id=f"ro-{i}", seq=k, name="s", attributes={"pad": pad})
                    for k in range(6)
                ]
            )
        wait_until(  # the background thread copies the log into the file
            lambda: os.path.getsize(path) >= 3 * 2**20,
            "a checkpoint has copied the log into the database file",
            step_s=0.05,
            detail=lambda: f"the file is {os.path.getsize(path)} bytes",
        )
        for i in range(300, 2000):  # sustained writes: the writer's own checkpoint bounds the log
            store.add_spans(
                [
                    Span(span_id=f"s{i}-{k}", rollout_id=f"ro-{i}", seq=k, name="s", attributes={"pad": pad})
                    for k in range(6)
                ]
            )
        page = store._read("PRAGMA page_size")[0][0]
        # (the writer's checkpoint is skipped while the background one holds the checkpoint lock,
        # and tried again on the next commit, so the bound is soft)
        assert os.path.getsize(f"{path}-wal") < 2 * sqlite_module.WAL_BACKSTOP_PAGES * (page + 24)
        assert store.stats().spans == 12000


def test_a_caller_interrupted_while_waiting_does_not_stall_the_writes(tmp_path):
    """A caller that stops waiting (KeyboardInterrupt in the main thread) leaves its write
    queued, and the lead it would have been handed passes on: later writes still go through."""
    import signal

    class Interrupted(Exception):
        pass

    interrupted = threading.Event()

    def interrupt(signum, frame):
        interrupted.set()
        raise Interrupted

    store = SqliteStore(tmp_path / "agl.db")
    started = threading.Event()

    def slow_write():
        def run(cur):
            started.set()
            assert interrupted.wait(10)  # the leader is busy: the main thread's write waits behind it

        store._write(run)

    previous = signal.signal(signal.SIGALRM, interrupt)
    leader = threading.Thread(target=slow_write)
    try:
        leader.start()
        assert started.wait(5)
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(Interrupted):
            store.add_tasks([Task(task_id="interrupted", input=0)])
        leader.join(10)
        done = threading.Event()
        threading.Thread(target=lambda: (store.add_tasks([Task(task_id="after", input=1)]), done.set())).start()
        assert done.wait(10), "writes stalled after an interrupted caller"
        assert {t.task_id for t in store.query_tasks()} == {"interrupted", "after"}  # the queued write still committed
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        store.close()


def test_transition_rows_read_the_fields_copied_into_columns(tmp_path):
    from agl.schema import LLMCall

    store = _quick(tmp_path / "agl.db")
    try:
        spans = [
            Span(
                span_id="s1",
                rollout_id="r",
                seq=3,
                name="llm",
                kind="llm",
                start_time=1.0,
                end_time=2.5,
                attributes={"gen_ai.response.id": "c1", "gen_ai.agent.name": "planner"},
            ),
            Span(
                span_id="s2",
                rollout_id="r",
                seq=4,
                name="llm",
                kind="llm",
                start_time=3.0,
                attributes={"gen_ai.response.id": 7, "gen_ai.agent.name": ["a", 1]},
            ),
            Span(span_id="s3", rollout_id="r", seq=5, name="tool", kind="tool", start_time=4.0),
        ]
        calls = [
            LLMCall(
                call_id="c1",
                rollout_id="r",
                seq=2,
                prompt_ids=[1, 2],
                response_ids=[3],
                created_at=9.5,
                model_version="v1",
            ),
            LLMCall(call_id="c2", rollout_id="r", seq=6, prompt_ids=[4], response_ids=[5], created_at=10.0),
        ]
        store.add_spans(spans)
        store.add_spans(spans)  # idempotent
        store.add_llm_calls(calls)
        store.add_llm_calls(calls)
        rows = store.transition_rows(["r"])
        assert [row[:5] for row in rows.calls.rows()] == [("r", "c1", 2, 9.5, "v1"), ("r", "c2", 6, 10.0, None)]
        assert rows.spans.rows() == [
            ("r", "s1", 3, 1.0, 2.5, "c1", "planner"),
            ("r", "s2", 4, 3.0, None, "7", '["a",1]'),
        ]
        # The JSON bodies stay the records.
        assert list(store.query_spans(rollout_id="r")) == spans
        assert [c.model_dump() for c in store.query_llm_calls(rollout_id="r")] == [c.model_dump() for c in calls]
    finally:
        store.close()


def test_a_database_from_an_older_schema_fails_naming_the_missing_columns(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute(
        """CREATE TABLE spans (pk INTEGER PRIMARY KEY AUTOINCREMENT, span_id TEXT NOT NULL UNIQUE, rollout_id TEXT,
        kind TEXT NOT NULL, start_time REAL NOT NULL, body TEXT NOT NULL)"""
    )
    conn.commit()
    conn.close()
    with pytest.raises(
        IncompatibleStore, match=r"table spans has no column seq, end_time, response_id, agent.*older version"
    ):
        _quick(path)


def test_a_database_from_before_the_response_cap_gains_its_column_and_keeps_its_rows(tmp_path):
    path = tmp_path / "before-cap.db"
    store = _quick(path)
    store.add_tasks([Task(task_id="t", input={})])
    store.enqueue([Rollout(rollout_id="old", task_id="t")])
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE rollouts DROP COLUMN max_response_tokens")  # as an older agl created it
    conn.commit()
    conn.close()
    store = _quick(path)
    try:
        store.enqueue([Rollout(rollout_id="new", task_id="t", max_response_tokens=32)])
        assert {r.rollout_id: r.max_response_tokens for r in store.query_rollouts()} == {"old": None, "new": 32}
    finally:
        store.close()


def test_batches_of_any_size_share_a_few_insert_statements_and_keep_every_row(tmp_path):
    # Each distinct statement text is a compiled statement the writer connection keeps: one per
    # batch size made its statement cache the largest part of a capturing process's memory.
    store = SqliteStore(tmp_path / "agl.db")
    try:
        written = 0
        for n in [*range(1, 70), 127, 128, 129, 200, 511, 512]:
            store.add_spans([Span(rollout_id="ro", name=f"s{written + i}", seq=written + i) for i in range(n)])
            written += n
        spans = list(store.query_spans(rollout_id="ro"))
        assert [s.seq for s in spans] == list(range(written))
        assert [s.name for s in spans] == [f"s{i}" for i in range(written)]
        sizes = sorted(n for table, n in store._insert_texts if table == "spans")
        assert sizes == [1, 2, 4, 8, 16, 32, 64]
    finally:
        store.close()
