"""Scopes on the store server: admin, runner and rollout-key credentials, with real servers on 127.0.0.1.

A runner token claims, heartbeats, finishes and writes observations of running rollouts, and
nothing else; a rollout key writes its own rollout only, while its attempt runs; ``agl run``
gives its child that key and no token.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from agl.credentials import RolloutKeys
from agl.schema import Reward, Rollout, RolloutStatus, Span, Task
from agl.store.http import Forbidden, HttpStore, Unauthorized
from agl.store.sqlite import SqliteStore
from agl_trainer.store_server import ServerThread
from tests.conftest import wait_until, wait_until_serving
from tests.fake_engine import FakeEngine

REPO = Path(__file__).resolve().parents[2]
ADMIN = "store-admin-token-0123456789"
RUNNER = "store-runner-token-0123456789"
KEYS = RolloutKeys("rollout-key-secret-0123456789abcdef")


@contextlib.contextmanager
def server(tmp_path, *, runner_token: str | None = RUNNER, keys: RolloutKeys | None = KEYS):
    backing = SqliteStore(tmp_path / "agl.db")
    backing.add_tasks([Task(task_id="t0", input={"secret": "the answer"})])
    backing.enqueue([Rollout(rollout_id=f"ro{i}", task_id="t0", max_attempts=2) for i in range(3)])
    try:
        with ServerThread(backing, token=ADMIN, runner_token=runner_token, keys=keys) as srv:
            srv.backing = backing
            yield srv
    finally:
        backing.close()


def _client(srv, token: str) -> HttpStore:
    return HttpStore(srv.url, token=token, retries=0, backoff_s=0.01)


def _raw(srv, token: str, method: str, path: str, body=None) -> httpx.Response:
    return httpx.request(method, f"{srv.url}{path}", json=body, headers={"Authorization": f"Bearer {token}"})


def test_a_runner_token_cannot_enqueue_or_read_other_rollouts(tmp_path):
    with server(tmp_path) as srv, contextlib.closing(_client(srv, RUNNER)) as runner:
        (mine,) = runner.claim("runner-a", limit=1)
        assert mine.task.input == {"secret": "the answer"}  # what claiming needs
        refused = [
            ("POST", "/v1/rollouts", {"rollouts": [{"task_id": "t0"}]}),
            ("POST", "/v1/tasks", {"tasks": [{"input": {}}]}),
            ("GET", "/v1/tasks/t0", None),
            ("GET", "/v1/tasks/query", None),
            ("GET", "/v1/rollouts/ro1", None),
            ("GET", "/v1/spans/query", None),
            ("GET", "/v1/llm_calls/query", None),
            ("POST", "/v1/cancellations", {"rollout_ids": ["ro1"]}),
            ("POST", "/v1/expirations", {"heartbeat_timeout_s": 1}),
            ("GET", "/v1/stats", None),
            ("POST", "/v1/model_versions", {"version": "mine"}),
        ]
        for method, path, body in refused:
            r = _raw(srv, RUNNER, method, path, body)
            assert r.status_code == 403, (method, path, r.text)
            assert r.json()["error"]["type"] == "Forbidden" and "runner scope" in r.json()["error"]["reason"]
        with pytest.raises(Forbidden, match="rollout_ids"):
            list(runner.query_rollouts())  # listing everything is not what claiming needs
        # the status of rollouts it names, without their output or error
        srv.backing.claim("runner-b", limit=1)
        srv.backing.finish("ro1", RolloutStatus.SUCCEEDED, output={"private": 1})
        (other,) = runner.query_rollouts(rollout_ids=["ro1"])
        assert other.status == RolloutStatus.SUCCEEDED and other.output is None and other.task is None
        # writes: its running rollouts yes, a rollout that is not running no
        runner.add_spans([Span(rollout_id=mine.rollout_id, name="step")])
        with pytest.raises(Forbidden, match="ro1"):
            runner.add_rewards([Reward(rollout_id="ro1", value=1.0)])
        with pytest.raises(Forbidden, match="ro2"):
            runner.add_spans([Span(rollout_id="ro2", name="into the queue")])
        runner.heartbeat([mine.rollout_id], "runner-a")
        assert runner.finish(mine.rollout_id, RolloutStatus.SUCCEEDED, attempt=1).status == RolloutStatus.SUCCEEDED
        assert [s.name for s in srv.backing.query_spans()] == ["step"]
        assert list(srv.backing.query_rewards()) == []


def test_claims_hand_out_keys_that_open_their_own_rollout_only(tmp_path):
    with server(tmp_path) as srv, contextlib.closing(_client(srv, RUNNER)) as runner:
        first, second = runner.claim("runner-a", limit=2)
        key = runner.rollout_key(first.rollout_id, first.attempt)
        assert KEYS.check(key) == (first.rollout_id, 1)
        with contextlib.closing(_client(srv, key)) as agent:
            agent.add_spans([Span(rollout_id=first.rollout_id, name="mine")])
            agent.add_rewards([Reward(rollout_id=first.rollout_id, value=0.5)])
            assert agent.get_rollout(first.rollout_id).status == RolloutStatus.RUNNING
            assert agent.get_task("t0").input == {"secret": "the answer"}  # its own rollout's task
            srv.backing.add_tasks([Task(task_id="t-other", input={})])
            with pytest.raises(Forbidden, match="task_id"):
                agent.get_task("t-other")
            with pytest.raises(Forbidden, match=second.rollout_id):
                agent.add_spans([Span(rollout_id=second.rollout_id, name="not mine")])
            with pytest.raises(Forbidden):
                agent.add_spans([Span(rollout_id=None, name="production traffic")])
            with pytest.raises(Forbidden):
                agent.get_rollout(second.rollout_id)
            with pytest.raises(Forbidden):
                agent.finish(second.rollout_id, RolloutStatus.FAILED)
            with pytest.raises(Forbidden):
                agent.claim("agent-as-runner")
            for method, path, body in [
                ("POST", "/v1/rollouts", {"rollouts": [{"task_id": "t0"}]}),
                ("GET", "/v1/rollouts/query", None),
                ("GET", "/v1/spans/query", None),
                ("POST", "/v1/heartbeats", {"runner_id": "x", "rollout_ids": [second.rollout_id]}),
            ]:
                assert _raw(srv, key, method, path, body).status_code == 403, path
            assert [s.name for s in srv.backing.query_spans(rollout_id=second.rollout_id)] == []
            # the key dies with its attempt
            srv.backing.finish(first.rollout_id, RolloutStatus.SUCCEEDED)
            with pytest.raises(Unauthorized, match="expired"):
                _write_until_refused(agent, first.rollout_id)  # the server trusts "running" for 1 s
        names = [s.name for s in srv.backing.query_spans(rollout_id=first.rollout_id)]
        assert names[0] == "mine" and set(names[1:]) <= {"late"} and len(names) <= 12


def _write_until_refused(agent: HttpStore, rollout_id: str) -> None:
    """Write a span every 0.1 s until the server refuses (the refusal is raised)."""

    def write() -> bool:
        agent.add_spans([Span(rollout_id=rollout_id, name="late")])
        return False

    wait_until(write, "the server refuses the ended attempt's key", step_s=0.1)


def test_without_the_secret_rollout_keys_are_refused_and_claims_carry_none(tmp_path):
    with server(tmp_path, keys=None) as srv, contextlib.closing(_client(srv, RUNNER)) as runner:
        (mine,) = runner.claim("runner-a", limit=1)
        assert runner.rollout_key(mine.rollout_id, mine.attempt) is None
        r = _raw(srv, KEYS.mint(mine.rollout_id, 1), "POST", "/v1/spans", {"spans": []})
        assert r.status_code == 401


def test_the_admin_and_a_lowercase_bearer_scheme(tmp_path):
    with server(tmp_path) as srv:
        r = httpx.get(f"{srv.url}/v1/stats", headers={"Authorization": f"bearer {ADMIN}"})
        assert r.status_code == 200 and r.json()["tasks"] == 1
        assert httpx.get(f"{srv.url}/v1/stats", headers={"Authorization": f"Basic {ADMIN}"}).status_code == 401
        with contextlib.closing(_client(srv, ADMIN)) as admin:
            assert len(list(admin.query_rollouts())) == 3


AGENT = """
import json, os, sys
import agl
from agl.schema import Rollout
from agl.store import open_store
from openai import OpenAI

reply = OpenAI(max_retries=0).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
agl.emit_reward(0.5)  # written to the store server with the rollout's key (flushed at exit)
store = open_store(os.environ["AGL_STORE_URL"])
try:
    store.enqueue([Rollout(task_id="t0")])
    enqueued = "yes"
except Exception as exc:
    enqueued = type(exc).__name__
json.dump({"env": dict(os.environ), "reply": reply.choices[0].message.content, "enqueue": enqueued},
          open(sys.argv[1], "w"))
"""


def test_agl_run_gives_its_child_the_rollout_key_and_no_token(tmp_path):
    from agl_trainer.gateway import Gateway

    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(AGENT))
    out = tmp_path / "seen.json"
    with (
        server(tmp_path) as srv,
        FakeEngine() as engine,
        Gateway(
            srv.backing, [engine.url], token="gw-token-0123456789", admin_token="gw-admin-0123456789", keys=KEYS
        ) as gw,
    ):
        secrets = {
            "AGL_STORE_TOKEN": RUNNER,
            "AGL_GATEWAY_TOKEN": gw.token,
            "AGL_GATEWAY_ADMIN_TOKEN": gw.admin_token,
            "AGL_ROLLOUT_KEY_SECRET": KEYS.secret,
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
        env |= {"PYTHONPATH": str(REPO / "core" / "src"), "AGL_GATEWAY_URL": gw.url, **secrets}
        cli = "import sys; from agl_trainer.cli import main; sys.exit(main(sys.argv[1:]))"
        proc = subprocess.run(
            [sys.executable, "-c", cli, "run", "--store", srv.url, "--", sys.executable, str(script), str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        seen = json.loads(out.read_text())
        child = seen["env"]
        rid = child["AGL_ROLLOUT_ID"]
        assert child["OPENAI_API_KEY"] == child["AGL_ROLLOUT_KEY"] == KEYS.mint(rid, 1)
        assert child["OPENAI_BASE_URL"] == f"{gw.url}/rollouts/{rid}/v1" and seen["reply"] == "echo: hi"
        for name, value in secrets.items():
            assert name not in child and value not in child.values(), name
        assert all(v not in proc.stderr for v in secrets.values())
        assert seen["enqueue"] == "Forbidden"  # the child's store credential is its rollout's key
        gw.flush()
        assert srv.backing.get_rollout(rid).status == RolloutStatus.SUCCEEDED
        assert [w.value for w in srv.backing.query_rewards(rollout_id=rid)] == [0.5]
        assert len(list(srv.backing.query_llm_calls(rollout_id=rid))) == 1


def test_agl_store_serve_reads_its_tokens_and_key_secret_from_files(tmp_path):
    """Nothing secret on the command line (the process list shows it): files, read once at start."""
    from tests.conftest import free_port

    files = {"admin": ADMIN, "runner": RUNNER, "secret": KEYS.secret}
    for name, value in files.items():
        (tmp_path / name).write_text(value + "\n")
    seed = SqliteStore(tmp_path / "agl.db")
    seed.add_tasks([Task(task_id="t0", input={})])
    seed.enqueue([Rollout(rollout_id="ro0", task_id="t0")])
    seed.close()
    port = free_port()
    args = ["store", "serve", "--store", f"sqlite:///{tmp_path / 'agl.db'}", "--port", str(port)]
    args += ["--admin-token-file", str(tmp_path / "admin"), "--runner-token-file", str(tmp_path / "runner")]
    args += ["--rollout-key-secret-file", str(tmp_path / "secret")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    cli = "import sys; from agl_trainer.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", cli, *args], env=env, stdout=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(f"{url}/healthz", proc, 20)
        assert all(value not in " ".join(args) for value in files.values())
        with contextlib.closing(HttpStore(url, token=RUNNER, retries=0)) as runner:
            (claimed,) = runner.claim("runner-a")
            assert runner.rollout_key("ro0", claimed.attempt) == KEYS.mint("ro0", 1)
            with pytest.raises(Forbidden):
                runner.enqueue([Rollout(task_id="t0")])
        with contextlib.closing(HttpStore(url, token=ADMIN, retries=0)) as admin:
            assert admin.get_rollout("ro0").status == RolloutStatus.RUNNING
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert ADMIN not in out and RUNNER not in out and KEYS.secret not in out


def test_a_runner_over_http_hands_each_agent_the_key_the_claim_carried(tmp_path):
    """agl runner's path: a runner token, keys from the store server's claims, agents that reach
    the gateway with ctx.api_key and write their rewards; no key secret in the runner."""
    from agl.runner import Runner
    from agl_trainer.gateway import Gateway

    seen: dict[str, str] = {}

    def agent(task_input, ctx):
        seen[ctx.rollout_id] = ctx.api_key
        reply = httpx.post(
            f"{ctx.base_url}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {ctx.api_key}"},
            timeout=10,
        )
        reply.raise_for_status()
        return 1.0

    with (
        server(tmp_path) as srv,
        FakeEngine() as engine,
        Gateway(srv.backing, [engine.url], token="gw-token-0123456789", keys=KEYS) as gw,
        contextlib.closing(_client(srv, RUNNER)) as store,
    ):
        runner = Runner(agent, store, gateway_url=gw.url, api_key="not-a-key", concurrency=3)
        try:
            assert runner.run_sync(until_idle=True) == {"succeeded": 3}
        finally:
            runner.close()
        gw.flush()
        assert seen == {rid: KEYS.mint(rid, 1) for rid in ("ro0", "ro1", "ro2")}
        for rid in seen:
            assert len(list(srv.backing.query_llm_calls(rollout_id=rid))) == 1
            assert [w.value for w in srv.backing.query_rewards(rollout_id=rid)] == [1.0]


def test_agl_store_serve_refuses_a_runner_token_equal_to_the_admin_token(tmp_path, monkeypatch, capsys):
    from agl_trainer.cli import main

    monkeypatch.setenv("AGL_STORE_TOKEN", ADMIN)
    monkeypatch.setenv("AGL_STORE_RUNNER_TOKEN", ADMIN)
    assert main(["store", "serve", "--store", f"sqlite:///{tmp_path / 'a.db'}", "--port", "0"]) == 2
    assert "--runner-token: must differ from the admin token" in capsys.readouterr().err
    assert not (tmp_path / "a.db").exists()
