"""The runner rides out a store outage: a real store server on 127.0.0.1 is stopped while a
rollout ends, then started again on the same port and database; the rollout's result is
delivered and the runner keeps going. A refused token, or a store that stays away past
``store_outage_s``, stops the runner with a one-line error."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agl.credentials import new_token
from agl.errors import StoreUnavailable
from agl.runner import RolloutResult, Runner
from agl.schema import Rollout, RolloutStatus, Span, Task
from agl.store.http import HttpStore, Unauthorized
from agl.store.sqlite import SqliteStore
from agl_trainer.store_server import ServerThread
from tests.conftest import wait_until

AGL = [sys.executable, "-c", "import sys; from agl_trainer.cli import main; sys.exit(main(sys.argv[1:]))"]
REPO = Path(__file__).resolve().parents[2]


def _status(path, rollout_id: str) -> RolloutStatus:
    with SqliteStore(path) as store:
        return store.get_rollout(rollout_id).status


def test_a_rollout_that_ends_while_the_store_is_down_is_finished_when_it_is_back(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    path = tmp_path / "agl.db"
    token = new_token(16)
    backing = SqliteStore(path)
    backing.add_tasks([Task(task_id="t0", input={"q": 1}), Task(task_id="t1", input={"q": 2})])
    backing.enqueue([Rollout(rollout_id="ro0", task_id="t0")])
    server = ServerThread(backing, token=token).start()
    port = server.port
    client = HttpStore(server.url, token=token)
    release = threading.Event()

    def agent(task_input, ctx):
        if ctx.rollout_id == "ro0":
            assert release.wait(30)
        return RolloutResult(output={"answer": task_input["q"]}, reward=0.75)

    # concurrency 2: the loop keeps claiming for the free slot all through the outage
    runner = Runner(agent, client, concurrency=2, heartbeat_s=0.3, poll_s=0.05, store_outage_s=60)
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(counts=runner.run_sync()), daemon=True)
    thread.start()
    try:
        wait_until(lambda: backing.get_rollout("ro0").status == RolloutStatus.RUNNING, "ro0 runs")
        server.stop()  # the store server goes away, and its database is closed
        backing.close()
        release.set()  # the agent finishes while nothing answers
        wait_until(
            lambda: runner.writer.write_errors >= 2 and runner.writer.pending() >= 1,
            "the runner has failed twice to write ro0's reward and still holds it",
            30,
        )
        assert _status(path, "ro0") == RolloutStatus.RUNNING  # not finished, not given back: kept
        assert thread.is_alive(), outcome

        backing = SqliteStore(path)  # the same database, served on the same port
        server = ServerThread(backing, token=token, port=port).start()
        wait_until(lambda: backing.get_rollout("ro0").status == RolloutStatus.SUCCEEDED, "ro0 succeeds", 20)
        done = backing.get_rollout("ro0")
        assert done.output == {"answer": 1} and done.attempt == 1
        assert [(r.value, r.source) for r in backing.query_rewards(rollout_id="ro0")] == [(0.75, "return")]

        backing.enqueue([Rollout(rollout_id="ro1", task_id="t1")])  # the runner kept running
        wait_until(lambda: backing.get_rollout("ro1").status == RolloutStatus.SUCCEEDED, "ro1 succeeds", 20)
        assert thread.is_alive()
    finally:
        release.set()
        runner.stop()
        thread.join(timeout=30)
        runner.close()
        client.close()
        server.stop()
        backing.close()
    assert outcome["counts"] == {"succeeded": 2}
    lines = [r.getMessage() for r in caplog.records if r.name == "agl.runner"]
    assert sum("the store is unreachable" in line for line in lines) == 1, lines
    assert sum("the store is back" in line for line in lines) == 1, lines
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_a_refused_token_stops_the_runner_with_the_reason(tmp_path):
    backing = SqliteStore(tmp_path / "agl.db")
    with ServerThread(backing, token=new_token(16)) as server:
        client = HttpStore(server.url, token="not-the-token")
        runner = Runner(lambda task_input: 1.0, client, heartbeat_s=0.3)
        started = time.monotonic()
        try:
            with pytest.raises(Unauthorized, match="wrong bearer token"):
                runner.run_sync()
        finally:
            runner.close()
            client.close()
        assert time.monotonic() - started < 5
    backing.close()


def test_a_store_away_past_the_limit_stops_the_runner(tmp_path):
    backing = SqliteStore(tmp_path / "agl.db")
    server = ServerThread(backing, token="t").start()
    url = server.url
    server.stop()
    client = HttpStore(url, token="t", retries=0)
    runner = Runner(lambda task_input: 1.0, client, heartbeat_s=0.3, store_outage_s=1.0, stop_grace_s=1.0)
    runner.writer.put(Span(span_id="left-over", rollout_id="ro-x", name="step"))  # cannot be written
    started = time.monotonic()
    try:
        with pytest.raises(StoreUnavailable, match=r"unreachable for over 1s \(--store-outage\)"):
            runner.run_sync()
    finally:
        runner.close()  # waits stop_grace_s for the writer, not the writer's own retry bound
        client.close()
        backing.close()
    assert time.monotonic() - started < 10


def test_agl_runner_exits_with_one_line_when_the_store_stays_away(tmp_path):
    (tmp_path / "agent_mod.py").write_text("def agent(task_input):\n    return 1.0\n")
    backing = SqliteStore(tmp_path / "agl.db")
    server = ServerThread(backing, token="t").start()
    url = server.url
    server.stop()  # nothing listens there any more
    backing.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    proc = subprocess.run(
        [*AGL, "runner", "agent_mod.py:agent", "--store", url, "--store-outage", "1"],
        cwd=tmp_path,
        env=env | {"PYTHONPATH": str(REPO), "AGL_STORE_TOKEN": "t"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("agl: error: ")]
    assert len(errors) == 1 and "unreachable for over 1s (--store-outage)" in errors[0], proc.stderr
    assert proc.stderr.count("the store is unreachable") == 1 and "Traceback" not in proc.stderr


def test_an_output_the_store_refuses_is_left_out_and_the_rollout_still_finishes(tmp_path):
    store = SqliteStore(tmp_path / "agl.db")
    store.add_tasks([Task(task_id="t0", input=1)])
    store.enqueue([Rollout(rollout_id="ro0", task_id="t0")])
    runner = Runner(lambda task_input: {"score": float("nan")}, store)  # an output no JSON column holds
    try:
        assert runner.run_sync(until_idle=True) == {"succeeded": 1}
    finally:
        runner.close()
    done = store.get_rollout("ro0")
    assert done.status == RolloutStatus.SUCCEEDED and done.output is None
    assert "the store refused the rollout's output" in done.error and "output" in done.error
    store.close()
