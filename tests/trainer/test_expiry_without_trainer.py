"""Expiry without a trainer: the store server itself takes back a silent runner's rollouts.

Real parts: a SqliteStore served by the store server (uvicorn on 127.0.0.1), reached by
the HTTP client as a runner would; no trainer runs and nobody calls ``expire`` by hand,
except where a trainer expiring alongside the server is the point.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time

from agl.credentials import new_token
from agl.schema import Rollout, RolloutStatus, Task
from agl.schema import now as schema_now
from agl.store.http import HttpStore
from agl.store.sqlite import SqliteStore
from agl_trainer.cli import main
from agl_trainer.store_server import ServerThread
from tests.conftest import free_port, wait_until, wait_until_serving


def _setup(store, n: int, **rollout_options) -> None:
    store.add_tasks([Task(task_id=f"t{i}", input=i) for i in range(n)])
    store.enqueue([Rollout(rollout_id=f"ro{i}", task_id=f"t{i}", **rollout_options) for i in range(n)])


class ClockedStore(SqliteStore):
    """A real SQLite store whose expiry passes are recorded (``passes``: monotonic times) and
    judge heartbeats at the test's clock, ``now``, instead of the wall clock. A pass waits
    for ``judging`` (set unless the test clears it) before it judges."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.now = schema_now()
        self.passes: list[float] = []
        self.judging = threading.Event()
        self.judging.set()

    def expire(self, *, heartbeat_timeout_s: float, now: float | None = None) -> list[Rollout]:
        self.passes.append(time.monotonic())
        assert self.judging.wait(30), "the test never let the expiry pass judge"
        return super().expire(heartbeat_timeout_s=heartbeat_timeout_s, now=self.now if now is None else now)


def test_a_silent_runners_rollout_is_requeued_and_a_live_ones_is_kept(tmp_path):
    lease = 1.0
    backing = ClockedStore(tmp_path / "agl.db")
    _setup(backing, 2, max_attempts=2)
    token = new_token(16)
    with ServerThread(backing, token=token, expire_every_s=0.05, heartbeat_timeout_s=lease) as server:
        client = HttpStore(server.url, token=token)
        try:
            [dead] = client.claim("dead-runner", limit=1)  # claims, then never heartbeats again
            [live] = client.claim("live-runner", limit=1)
            client.heartbeat([live.rollout_id], "live-runner")
            heard = backing.get_rollout(live.rollout_id).heartbeat_at
            assert heard > dead.heartbeat_at
            # the test's clock: the dead runner silent for longer than the lease, the live one not
            backing.now = (dead.heartbeat_at + heard) / 2 + lease
            wait_until(
                lambda: backing.get_rollout(dead.rollout_id).status == RolloutStatus.QUEUED,
                "the dead runner's rollout is queued again",
            )
            assert backing.get_rollout(live.rollout_id).status == RolloutStatus.RUNNING
            [attempt] = client.attempts(dead.rollout_id)
            assert attempt.runner_id == "dead-runner" and attempt.status == RolloutStatus.TIMED_OUT
            assert attempt.error.startswith("no heartbeat for 1")
            [again] = client.claim("new-runner", limit=1)  # the requeued rollout goes to another runner
            assert again.rollout_id == dead.rollout_id and again.attempt == 2
            assert server.expirer is not None and server.expirer.expired == 1
        finally:
            client.close()
    backing.close()


def test_server_expiry_beside_a_trainer_expiring_ends_each_attempt_once(tmp_path):
    backing = SqliteStore(tmp_path / "agl.db")
    _setup(backing, 6, max_attempts=1)
    token = new_token(16)
    with ServerThread(backing, token=token, expire_every_s=0.05, heartbeat_timeout_s=0.5) as server:
        client = HttpStore(server.url, token=token)
        try:
            claimed = client.claim("dead-runner", limit=6)
            trainer_took: list[str] = []

            def trainer_pass() -> bool:  # the trainer's loop, expiring with the same lease
                trainer_took.extend(r.rollout_id for r in client.expire(heartbeat_timeout_s=0.5))
                return all(backing.get_rollout(r.rollout_id).status.terminal for r in claimed)

            wait_until(trainer_pass, "every claimed rollout has ended", step_s=0.02)
            for r in claimed:
                assert backing.get_rollout(r.rollout_id).status == RolloutStatus.TIMED_OUT
                assert [a.status for a in client.attempts(r.rollout_id)] == [RolloutStatus.TIMED_OUT]
            assert len(trainer_took) + server.expirer.expired == 6  # each taken back by exactly one of them
        finally:
            client.close()
    backing.close()


def test_runners_get_one_lease_after_the_server_starts(tmp_path):
    lease = 1.0
    backing = ClockedStore(tmp_path / "agl.db")
    _setup(backing, 1)
    [cut_off] = backing.claim("runner-cut-off", limit=1)  # last heard from then; the server was down since
    backing.now = cut_off.heartbeat_at + 2.2 * lease  # a pass now would take the rollout back
    backing.judging.clear()  # until the runner has been heard, however slow the host
    token = new_token(16)
    started = time.monotonic()
    with ServerThread(backing, token=token, expire_every_s=0.05, heartbeat_timeout_s=lease) as server:
        client = HttpStore(server.url, token=token)
        try:
            client.heartbeat(["ro0"], "runner-cut-off")  # the runner is heard again in time
            backing.now = backing.get_rollout("ro0").heartbeat_at + 0.5 * lease
            backing.judging.set()
            wait_until(lambda: len(backing.passes) >= 2, "the server has made two expiry passes")
            assert backing.passes[0] - started >= lease  # the first pass waited one lease
            assert backing.get_rollout("ro0").status == RolloutStatus.RUNNING
            backing.now += lease  # the runner is silent again, past the lease of its heartbeat
            wait_until(lambda: backing.get_rollout("ro0").status == RolloutStatus.TIMED_OUT, "ro0 is timed out")
        finally:
            client.close()
    backing.close()


def test_serve_checks_its_expiry_flags(capsys):
    assert main(["store", "serve", "--expire-every", "-1"]) == 2
    assert "--expire-every: must be 0 (never) or more, got -1" in capsys.readouterr().err
    assert main(["store", "serve", "--heartbeat-timeout", "0"]) == 2
    assert "--heartbeat-timeout: must be positive, got 0" in capsys.readouterr().err


def _row(lines: list[str], first_cell: str) -> str:
    return next(line for line in lines if line.strip("│┃ ").startswith(first_cell + " "))


def test_rollouts_show_and_list_tell_the_attempts_apart(tmp_path, capsys):
    """After a runner died and another took over, ``agl rollouts show`` gives each attempt its
    runner, times, status, error and last heartbeat, and ``list`` says which attempt runs where."""
    path = tmp_path / "agl.db"
    backing = SqliteStore(path)
    _setup(backing, 1, max_attempts=2)
    token = new_token(16)
    with ServerThread(backing, token=token, expire_every_s=0.1, heartbeat_timeout_s=0.5) as server:
        client = HttpStore(server.url, token=token)
        try:
            client.claim("dead-runner", limit=1)
            wait_until(lambda: backing.get_rollout("ro0").status == RolloutStatus.QUEUED, "ro0 is queued again")
            server.expirer.stop()  # its work is done: the second runner's attempt stays running, however slow the host
            client.claim("second-runner", limit=1)
            client.heartbeat(["ro0"], "second-runner")
            first, second = client.attempts("ro0")
            assert first.heartbeat_at is not None and first.heartbeat_at <= first.ended_at
            assert second.heartbeat_at is not None and second.ended_at is None
        finally:
            client.close()
        url = f"sqlite:///{path}"
        assert main(["rollouts", "show", "ro0", "--store", url]) == 0
        lines = capsys.readouterr().out.splitlines()
        header = next(line for line in lines if "last heartbeat" in line and "attempt" in line)
        assert "ended" in header and "runner" in header
        dead, alive = _row(lines, "1"), _row(lines, "2")
        assert "dead-runner" in dead and "timed_out" in dead and "no heartbeat" in dead
        assert "second-runner" in alive and "running" in alive and "s ago" in alive
        assert "last heartbeat" in _row(lines, "last")
        assert main(["rollouts", "list", "--store", url]) == 0
        listed = _row(capsys.readouterr().out.splitlines(), "ro0")
        assert "2/2" in listed and "second-runner (" in listed and "s ago)" in listed
    backing.close()


def test_agl_store_serve_takes_back_a_silent_runners_rollout(tmp_path):
    """The command itself, as a deployment runs it: ``agl store serve`` with short expiry settings."""
    path = tmp_path / "agl.db"
    with SqliteStore(path) as seed:
        _setup(seed, 1, max_attempts=2)
    port, token = free_port(), new_token(16)
    args = ["store", "serve", "--store", f"sqlite:///{path}", "--port", str(port)]
    args += ["--expire-every", "0.2", "--heartbeat-timeout", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")} | {"AGL_STORE_TOKEN": token}
    cli = "import sys; from agl_trainer.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", cli, *args], env=env, stdout=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(f"{url}/healthz", proc)
        with contextlib.closing(HttpStore(url, token=token)) as client:
            client.claim("dead-runner")
            wait_until(lambda: client.get_rollout("ro0").status == RolloutStatus.QUEUED, "ro0 is queued again")
            [attempt] = client.attempts("ro0")
            assert attempt.status == RolloutStatus.TIMED_OUT and attempt.runner_id == "dead-runner"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert "runners silent for 1s are taken back (checked every 0.2s)" in out
