"""Drill: the store server dies while an ``agl runner`` agent is finishing, and comes back seconds later.

Everything is a real process: ``agl store serve`` on a SQLite file, ``agl runner`` with
an agent module that holds its rollout until the test releases it. The server is
SIGKILLed while the rollout runs, the agent then returns, and the server is started
again on the same file and port three seconds later. The rollout must end succeeded
with the agent's output and reward, and the runner must still be alive and claiming.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from agl.credentials import new_token
from agl.schema import Rollout, RolloutStatus, Task
from agl.store.sqlite import SqliteStore
from tests.conftest import free_port, wait_until
from tests.reliability.conftest import AGL, StoreProcess, agl_env

AGENT = """
import pathlib, time
from agl.runner import RolloutResult

def agent(task_input):
    release = pathlib.Path(task_input["release"])
    if task_input.get("hold"):
        pathlib.Path(task_input["started"]).touch()  # the runner has everything it needs from the store
    deadline = time.monotonic() + 60
    while task_input.get("hold") and not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return RolloutResult(output={"answer": task_input["q"] * 2}, reward=0.75)
"""

pytestmark = pytest.mark.slow  # real subprocess servers, restarted: tens of seconds on a busy host


def _rollout(db, rollout_id: str):
    with SqliteStore(db) as store:
        return store.get_rollout(rollout_id)


def test_a_rollout_finishing_during_a_store_outage_succeeds_and_the_runner_lives_on(tmp_path):
    db, release, started = tmp_path / "agl.db", tmp_path / "release", tmp_path / "started"
    (tmp_path / "drill_agent.py").write_text(AGENT)
    token_file = tmp_path / "token"
    token_file.write_text(new_token(16))
    with SqliteStore(db) as seed:
        hold = {"hold": True, "release": str(release), "started": str(started)}
        seed.add_tasks([Task(task_id="t0", input={"q": 21, **hold})])
        seed.add_tasks([Task(task_id="t1", input={"q": 5, "release": str(release)})])
        seed.enqueue([Rollout(rollout_id="ro0", task_id="t0")])
    server = StoreProcess(db, free_port(), token_file).start()
    runner_log = (tmp_path / "runner.log").open("w+")
    runner = subprocess.Popen(
        [*AGL, "runner", "drill_agent.py:agent", "--store", server.url, "--store-token-file", str(token_file)]
        + ["--heartbeat", "0.5", "--store-outage", "120", "--concurrency", "2"],
        cwd=tmp_path,
        env=agl_env(),
        stdout=runner_log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: _rollout(db, "ro0").status == RolloutStatus.RUNNING, "ro0 is claimed", 30)
        # the agent is running: killed any earlier, the runner could still be reading the task from the store
        wait_until(started.exists, "ro0's agent has started", 30, detail=lambda: _tail(runner_log))
        server.kill()
        release.touch()  # the agent returns while nothing answers
        wait_until(  # the agent's reward is all it has to write
            lambda: "agl writer: the store is unavailable" in (tmp_path / "runner.log").read_text(),
            "the runner's writer holds ro0's reward while the store is down",
            60,  # well under the runner's 120 s outage budget; a loaded host has taken over 30 s to get here
            step_s=0.1,
            detail=lambda: _tail(runner_log),
        )
        assert runner.poll() is None, _tail(runner_log)
        assert _rollout(db, "ro0").status == RolloutStatus.RUNNING  # kept, not lost or given back

        server.start()
        wait_until(lambda: _rollout(db, "ro0").status.terminal, "ro0 has ended", 30, detail=lambda: _tail(runner_log))
        done = _rollout(db, "ro0")
        assert done.status == RolloutStatus.SUCCEEDED, (done, _tail(runner_log))
        assert done.output == {"answer": 42} and done.attempt == 1
        with SqliteStore(db) as store:
            assert [(r.value, r.source) for r in store.query_rewards(rollout_id="ro0")] == [(0.75, "return")]
            store.enqueue([Rollout(rollout_id="ro1", task_id="t1")])
        wait_until(
            lambda: _rollout(db, "ro1").status == RolloutStatus.SUCCEEDED,
            "ro1 succeeds",
            30,
            detail=lambda: _tail(runner_log),
        )
        assert runner.poll() is None, _tail(runner_log)
    finally:
        if runner.poll() is None:
            runner.send_signal(signal.SIGTERM)
            try:
                runner.wait(timeout=30)
            except subprocess.TimeoutExpired:
                runner.kill()
        server.kill()
    log = _tail(runner_log)
    assert runner.returncode == 0, log
    assert "Traceback" not in log and "never retrieved" not in log, log
    runner_lines = [line for line in log.splitlines() if "agl.runner:" in line]
    assert sum("the store is unreachable" in line for line in runner_lines) == 1, log  # one line per outage
    assert sum("the store is back" in line for line in runner_lines) == 1, log
    assert "done: 2 succeeded" in log, log


def _tail(f) -> str:
    f.flush()
    f.seek(0)
    return f.read()[-4000:]
