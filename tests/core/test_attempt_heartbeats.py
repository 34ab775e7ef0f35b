"""Each attempt keeps when its runner was last heard from, and a database from before that
column gains it when opened (the ``_added_columns`` migration)."""

from __future__ import annotations

import sqlite3

from agl.schema import Rollout, RolloutStatus, Task, now
from agl.store.sqlite import SqliteStore
from tests.conftest import wait_until


def test_an_ended_attempt_keeps_its_last_heartbeat(tmp_path):
    with SqliteStore(tmp_path / "agl.db") as store:
        store.add_tasks([Task(task_id="t", input=1)])
        store.enqueue([Rollout(rollout_id="ro", task_id="t", max_attempts=2)])
        [claimed] = store.claim("runner-a")
        wait_until(lambda: now() > claimed.heartbeat_at, "the clock has moved past the claim")
        store.heartbeat(["ro"], "runner-a")
        beat = store.get_rollout("ro").heartbeat_at
        assert beat > claimed.heartbeat_at
        [running] = store.attempts("ro")
        assert running.status == RolloutStatus.RUNNING and running.heartbeat_at == beat
        wait_until(lambda: now() > beat + 0.01, "runner-a has been silent for longer than the lease")
        store.expire(heartbeat_timeout_s=0.01)
        store.claim("runner-b")
        first, second = store.attempts("ro")
        assert (first.runner_id, first.status, first.heartbeat_at) == ("runner-a", RolloutStatus.TIMED_OUT, beat)
        assert first.ended_at > first.heartbeat_at
        assert second.runner_id == "runner-b" and second.heartbeat_at >= first.ended_at


def test_a_database_without_the_column_gains_it(tmp_path):
    path = tmp_path / "agl.db"
    with SqliteStore(path) as store:
        store.add_tasks([Task(task_id="t", input=1)])
        store.enqueue([Rollout(rollout_id="ro", task_id="t")])
        store.claim("runner-a")
        store.finish("ro", RolloutStatus.SUCCEEDED)
    with sqlite3.connect(path) as db:  # as an older agl left it
        db.execute("ALTER TABLE attempts DROP COLUMN heartbeat_at")
    with SqliteStore(path) as store:
        [attempt] = store.attempts("ro")
        assert attempt.status == RolloutStatus.SUCCEEDED and attempt.heartbeat_at is None
    with sqlite3.connect(path) as db:
        assert "heartbeat_at" in {row[1] for row in db.execute("PRAGMA table_info(attempts)")}
