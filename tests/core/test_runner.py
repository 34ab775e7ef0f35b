"""The runner on a real SqliteStore, real threads, a real gateway over HTTP, and `agl run` / `agl runner` as processes.

The model behind the gateway is tests/fake_engine.py (a test double: no real model fits a
fast unit test); the gateway, the store and the runner are the real ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

import agl
from agl.runner import RolloutResult, Runner, read_result
from agl.schema import Rollout, RolloutStatus, Task
from agl_trainer.transitions import build_transitions
from tests.conftest import wait_until
from tests.fake_engine import FakeEngine

AGL = [sys.executable, "-c", "import sys; from agl_trainer.cli import main; sys.exit(main(sys.argv[1:]))"]
REPO = Path(__file__).resolve().parents[2]


def _enqueue(store, n, **kw):
    tasks = [Task(task_id=f"t{i}", input={"i": i}) for i in range(n)]
    store.add_tasks(tasks)
    return store.enqueue([Rollout(rollout_id=f"ro{i}", task_id=t.task_id, **kw) for i, t in enumerate(tasks)])


def _run(runner, **kw):
    try:
        return runner.run_sync(until_idle=True, **kw)
    finally:
        runner.close()


def test_read_result_rules():
    assert read_result(None) == (None, None)
    assert read_result(0.5) == (None, 0.5)
    assert read_result(True) == (None, 1.0)
    assert read_result("42") == ("42", None)
    assert read_result({"a": 1}) == ({"a": 1}, None)
    assert read_result(RolloutResult(output="x", reward=2)) == ("x", 2.0)


def test_a_rollouts_own_resources_override_the_runners_and_the_modes(sqlite_store):
    """What an algorithm put on a rollout (agl-apo's prompt) wins over the runner's configured resources."""
    tasks = [Task(task_id=f"t{i}", input={"i": i}) for i in range(2)]
    sqlite_store.add_tasks(tasks)
    chosen = {"system_prompt": "Be brief.", "few_shot": ["Question: 2+2\nAnswer: 4"]}
    sqlite_store.enqueue(
        [
            Rollout(rollout_id="chosen", task_id="t0", mode="val", resources=chosen, resources_version="r1"),
            Rollout(rollout_id="configured", task_id="t1", mode="val"),
        ]
    )
    seen = {}

    def agent(task_input, ctx):
        seen[ctx.rollout_id] = dict(ctx.resources)
        return 1.0

    configured = {"system_prompt": "Be thorough.", "temperature": 0.7}
    _run(Runner(agent, sqlite_store, resources=configured, mode_resources={"val": {"temperature": 0.0}}))
    assert seen["chosen"] == {
        "system_prompt": "Be brief.",
        "few_shot": chosen["few_shot"],
        "temperature": 0.0,
        "mode": "val",
    }
    assert seen["configured"] == {"system_prompt": "Be thorough.", "temperature": 0.0, "mode": "val"}


def test_sync_and_async_agents_return_rewards_and_outputs(sqlite_store):
    _enqueue(sqlite_store, 4)

    def sync_agent(task_input, ctx):
        assert ctx.rollout_id and ctx.task.input == task_input
        assert agl.current_rollout() is ctx  # inside use_rollout, in the worker thread
        return float(task_input["i"])

    counts = _run(Runner(sync_agent, sqlite_store, concurrency=2))
    assert counts == {"succeeded": 4}
    rewards = {w.rollout_id: (w.value, w.source) for w in sqlite_store.query_rewards()}
    assert rewards == {f"ro{i}": (float(i), "return") for i in range(4)}

    sqlite_store.add_tasks([Task(task_id="a", input={"q": "x"})])
    sqlite_store.enqueue([Rollout(rollout_id="ra", task_id="a")])

    async def async_agent(task_input):  # one parameter: no context
        await asyncio.sleep(0.01)
        assert agl.current_rollout().rollout_id == "ra"
        return RolloutResult(output={"answer": task_input["q"]}, reward=0.25)

    assert _run(Runner(async_agent, sqlite_store)) == {"succeeded": 1}
    r = sqlite_store.get_rollout("ra")
    assert r.status == RolloutStatus.SUCCEEDED and r.output == {"answer": "x"}
    assert [w.value for w in sqlite_store.query_rewards(rollout_id="ra")] == [0.25]


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_concurrency_runs_rollouts_at_once(sqlite_store, kind):
    _enqueue(sqlite_store, 8)
    live, peak = [0], [0]
    lock = threading.Lock()
    four_at_once = threading.Event()  # the first four hold until all four run

    def enter():
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            if live[0] == 4:
                four_at_once.set()

    def leave():
        with lock:
            live[0] -= 1

    async def async_agent(task_input, ctx):
        enter()
        assert await asyncio.to_thread(four_at_once.wait, 10), "four rollouts never ran at once"
        await asyncio.sleep(0.3)  # a slow agent: a runner over its limit would start a fifth meanwhile
        leave()

    def sync_agent(task_input, ctx):
        enter()
        assert four_at_once.wait(10), "four rollouts never ran at once"
        time.sleep(0.3)
        leave()

    counts = _run(Runner(async_agent if kind == "async" else sync_agent, sqlite_store, concurrency=4))
    assert counts == {"succeeded": 8} and peak[0] == 4  # two waves of four, not eight of one


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_timeout_becomes_timed_out_with_error_and_the_loop_goes_on(sqlite_store, kind):
    sqlite_store.add_tasks([Task(task_id="slow", input={"slow": True}), Task(task_id="fast", input={"slow": False})])
    sqlite_store.enqueue(
        [
            Rollout(rollout_id="slow", task_id="slow", timeout_s=0.2),
            Rollout(rollout_id="fast", task_id="fast", timeout_s=5),
        ]
    )

    async def async_agent(task_input):
        await asyncio.sleep(30 if task_input["slow"] else 0)
        return 1.0

    def sync_agent(task_input):
        time.sleep(1.0 if task_input["slow"] else 0)
        return 1.0

    t = time.monotonic()
    counts = _run(Runner(async_agent if kind == "async" else sync_agent, sqlite_store, concurrency=2))
    assert time.monotonic() - t < 3
    assert counts == {"timed_out": 1, "succeeded": 1}
    slow = sqlite_store.get_rollout("slow")
    assert slow.status == RolloutStatus.TIMED_OUT and "timeout of 0.2s" in slow.error
    assert sqlite_store.get_rollout("fast").status == RolloutStatus.SUCCEEDED


def test_exception_becomes_failed_with_type_message_and_traceback(sqlite_store):
    _enqueue(sqlite_store, 2)

    def agent(task_input):
        if task_input["i"] == 0:
            raise ValueError("the tool returned nonsense")
        return 1.0

    assert _run(Runner(agent, sqlite_store)) == {"failed": 1, "succeeded": 1}
    r = sqlite_store.get_rollout("ro0")
    assert r.status == RolloutStatus.FAILED
    assert r.error.startswith("ValueError: the tool returned nonsense")
    assert "test_runner.py" in r.error and "in agent" in r.error  # the traceback's frames
    assert sqlite_store.attempts("ro0")[0].error == r.error


def test_an_agent_timeout_error_of_its_own_is_a_failure_not_a_timeout(sqlite_store):
    _enqueue(sqlite_store, 1, timeout_s=10)

    async def agent(task_input):
        raise TimeoutError("the search API did not answer")

    assert _run(Runner(agent, sqlite_store)) == {"failed": 1}
    assert sqlite_store.get_rollout("ro0").error.startswith("TimeoutError: the search API did not answer")


def test_retries_follow_max_attempts(sqlite_store):
    _enqueue(sqlite_store, 2, max_attempts=3)
    tries: dict[int, int] = {}

    def agent(task_input):
        i = task_input["i"]
        tries[i] = tries.get(i, 0) + 1
        if i == 0 and tries[i] < 3:
            raise RuntimeError(f"flaky {tries[i]}")
        if i == 1:
            raise RuntimeError("always")
        return 1.0

    counts = _run(Runner(agent, sqlite_store))
    assert counts == {"failed": 5, "succeeded": 1}
    assert sqlite_store.get_rollout("ro0").status == RolloutStatus.SUCCEEDED
    assert [a.status for a in sqlite_store.attempts("ro0")] == ["failed", "failed", "succeeded"]
    assert sqlite_store.get_rollout("ro1").status == RolloutStatus.FAILED and tries[1] == 3


def test_heartbeats_while_the_agent_runs(sqlite_store):
    _enqueue(sqlite_store, 1)
    seen = []

    def agent(task_input, ctx):
        def moved_twice() -> bool:
            r = sqlite_store.get_rollout(ctx.rollout_id)
            seen.append(r.heartbeat_at)
            return len(set(seen)) >= 3 and r.heartbeat_at > r.started_at + 0.2

        wait_until(moved_twice, "the heartbeat has moved twice while the agent runs", step_s=0.05)

    _run(Runner(agent, sqlite_store, heartbeat_s=0.1))
    r = sqlite_store.get_rollout("ro0")
    assert len(set(seen)) >= 3  # the heartbeat moved while the agent ran
    assert r.heartbeat_at > r.started_at + 0.2


def test_rewards_emitted_inside_the_agent_are_stored_before_the_rollout_ends(sqlite_store):
    _enqueue(sqlite_store, 6)

    def agent(task_input):
        with agl.span("tool", kind="tool"):
            agl.emit_reward(0.5, name="step")
        agl.emit_reward(float(task_input["i"]))

    runner = Runner(agent, sqlite_store, concurrency=3)
    missing = []

    done: set[str] = set()

    def all_seen_done() -> bool:
        # Whenever a rollout is seen finished, its rewards must already be in the store.
        for r in sqlite_store.query_rollouts(status=RolloutStatus.SUCCEEDED):
            if r.rollout_id not in done:
                done.add(r.rollout_id)
                if len(list(sqlite_store.query_rewards(rollout_id=r.rollout_id))) != 2:
                    missing.append(r.rollout_id)
        return len(done) == 6

    def watch():
        wait_until(all_seen_done, "the watcher has seen the 6 rollouts succeed", step_s=0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    _run(runner)
    watcher.join()
    assert len(done) == 6 and missing == []
    rewards = list(sqlite_store.query_rewards(rollout_id="ro3"))
    assert sorted((w.name, w.value, w.source) for w in rewards) == [("reward", 3.0, "agent"), ("step", 0.5, "agent")]
    assert len(list(sqlite_store.query_spans(rollout_id="ro3", kind="tool"))) == 1


def test_a_rollout_cancelled_in_the_store_is_stopped_and_not_finished_twice(sqlite_store):
    _enqueue(sqlite_store, 2)
    started = threading.Event()

    async def agent(task_input, ctx):
        if task_input["i"] == 0:
            started.set()
            await asyncio.sleep(30)
        return 1.0

    runner = Runner(agent, sqlite_store, heartbeat_s=0.05, concurrency=2)
    t = threading.Thread(target=lambda: _run(runner))
    t.start()
    assert started.wait(5)
    sqlite_store.cancel(["ro0"])
    t.join(10)
    assert not t.is_alive()
    assert runner.counts == {"taken_back": 1, "succeeded": 1}
    assert sqlite_store.get_rollout("ro0").status == RolloutStatus.CANCELLED


def test_stopping_the_runner_gives_in_flight_rollouts_back_to_the_queue(sqlite_store):
    _enqueue(sqlite_store, 1, max_attempts=2)
    started = threading.Event()

    async def agent(task_input):
        started.set()
        await asyncio.sleep(30)

    runner = Runner(agent, sqlite_store)
    t = threading.Thread(target=lambda: _run(runner))
    t.start()
    assert started.wait(5)
    runner.stop()
    t.join(10)
    r = sqlite_store.get_rollout("ro0")
    assert r.status == RolloutStatus.QUEUED and "RunnerStopped" in sqlite_store.attempts("ro0")[0].error


def test_agents_reach_the_gateway_and_calls_become_transitions(sqlite_store):
    from agl_trainer.gateway import Gateway

    _enqueue(sqlite_store, 3)

    def agent(task_input, ctx):
        with httpx.Client(base_url=ctx.base_url, headers={"Authorization": f"Bearer {ctx.api_key}"}) as client:
            for turn in range(2):
                r = client.post(
                    "/chat/completions",
                    json={
                        "model": ctx.model,
                        "messages": [{"role": "user", "content": f"q{task_input['i']} turn {turn}"}],
                    },
                )
                r.raise_for_status()
        return 1.0

    with FakeEngine() as engine, Gateway(sqlite_store, [engine.url], token="secret", model_version="v0") as gw:
        # each agent gets its rollout's key (made with the gateway's secret), never the gateway token
        counts = _run(Runner(agent, sqlite_store, gateway_url=gw.url, rollout_keys=gw.keys, concurrency=3))
        gw.flush()
    assert counts == {"succeeded": 3}
    ts, report = build_transitions(sqlite_store, list(sqlite_store.query_rollouts()))
    assert len(ts) == 6 and report.gateway_only == 6
    assert all(t.token_source == "engine" and len(t.prompt_ids) > 0 and t.model_version == "v0" for t in ts)
    assert {t.rollout_id for t in ts} == {"ro0", "ro1", "ro2"}


def test_set_env_points_openai_and_anthropic_clients_at_the_rollouts_route(sqlite_store, monkeypatch):
    import anthropic
    import openai

    from agl_trainer.gateway import Gateway

    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_URL", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    _enqueue(sqlite_store, 1)

    def agent(task_input, ctx):  # clients made as scripts make them: everything from the environment
        claude = anthropic.Anthropic(max_retries=0)
        said = claude.messages.create(model="claude-x", max_tokens=32, messages=[{"role": "user", "content": "hi"}])
        gpt = openai.OpenAI(max_retries=0).chat.completions.create(
            model="gpt-x", messages=[{"role": "user", "content": "hey"}]
        )
        assert os.environ["ANTHROPIC_BASE_URL"] == ctx.base_url.removesuffix("/v1")
        return 1.0 if (said.content[0].text, gpt.choices[0].message.content) == ("echo: hi", "echo: hey") else 0.0

    with FakeEngine() as engine, Gateway(sqlite_store, [engine.url], token="secret", model_version="v0") as gw:
        runner = Runner(agent, sqlite_store, gateway_url=gw.url, rollout_keys=gw.keys, concurrency=1, set_env=True)
        assert _run(runner) == {"succeeded": 1}
        gw.flush()
    [rollout] = sqlite_store.query_rollouts()
    calls = sorted(sqlite_store.query_llm_calls(rollout_id=rollout.rollout_id), key=lambda c: c.seq)
    assert [c.endpoint for c in calls] == ["messages", "chat.completions"]
    assert [r.value for r in sqlite_store.query_rewards(rollout_id=rollout.rollout_id)] == [1.0]
    assert "ANTHROPIC_API_KEY" not in os.environ  # put back as it was


RUN_TOKEN = "run-token-0123456789abcdefg"


def _write_script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "their_agent.py"
    path.write_text(textwrap.dedent(body))
    return path


@pytest.mark.slow
def test_agl_run_wraps_an_unmodified_script_as_one_rollout(tmp_path):
    from agl.store.sqlite import SqliteStore
    from agl_trainer.gateway import Gateway

    db = tmp_path / "agl.db"
    url = f"sqlite:///{db}"
    script = _write_script(
        tmp_path,
        """
        import json, os, sys
        import agl
        from openai import OpenAI
        client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment, as such scripts do
        reply = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hello"}])
        keys = ["OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY"]
        keys += ["AGL_ROLLOUT_ID", "AGL_STORE_URL", "AGL_TASK_INPUT"]
        json.dump({k: os.environ.get(k) for k in keys} | {"reply": reply.choices[0].message.content},
                  open(sys.argv[1], "w"))
        agl.emit_reward(0.75)  # lands on the rollout agl run created (AGL_ROLLOUT_ID, AGL_STORE_URL)
        sys.exit(int(sys.argv[2]))
    """,
    )
    store = SqliteStore(db)
    try:
        with FakeEngine() as engine, Gateway(store, [engine.url], token=RUN_TOKEN, model_version="v7") as gw:
            # agl run makes the rollout's key with the gateway's secret; the gateway token stays with the caller
            env = dict(
                os.environ,
                PYTHONPATH=str(REPO / "core" / "src"),
                AGL_ROLLOUT_KEY_SECRET=gw.keys.secret,
                AGL_GATEWAY_TOKEN=RUN_TOKEN,
            )
            ok = subprocess.run(
                [
                    *AGL,
                    "run",
                    "--store",
                    url,
                    "--gateway",
                    gw.url,
                    "--input",
                    '{"question": "hi"}',
                    "--max-response-tokens",
                    "4",
                    "--",
                    sys.executable,
                    str(script),
                    str(tmp_path / "ok.json"),
                    "0",
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert ok.returncode == 0, ok.stderr
            # it says what it hands the child: the route, the variables, the rollout's key shortened
            assert f"OPENAI_BASE_URL=OPENAI_API_BASE={gw.url}/rollouts/" in ok.stderr
            assert "OPENAI_API_KEY=AGL_ROLLOUT_KEY=this rollout's key: agl-... (" in ok.stderr
            assert f"AGL_STORE_URL={url}" in ok.stderr and RUN_TOKEN not in ok.stderr
            seen = json.loads((tmp_path / "ok.json").read_text())
            rid = seen["AGL_ROLLOUT_ID"]
            assert seen["OPENAI_BASE_URL"] == seen["OPENAI_API_BASE"] == f"{gw.url}/rollouts/{rid}/v1"
            assert seen["OPENAI_API_KEY"] == gw.rollout_key(rid, 1) and seen["AGL_STORE_URL"] == url
            assert json.loads(seen["AGL_TASK_INPUT"]) == {"question": "hi"}
            assert seen["reply"] == "echo"  # "echo: hello" cut at the rollout's cap of 4 tokens (bytes)
            gw.flush()
            assert store.get_rollout(rid).status == RolloutStatus.SUCCEEDED
            (call,) = store.query_llm_calls(rollout_id=rid)
            assert call.requested_model == "gpt-4o" and call.model_version == "v7" and call.max_response_tokens == 4
            assert [(w.value, w.source) for w in store.query_rewards(rollout_id=rid)] == [(0.75, "agent")]
            (t,) = build_transitions(store, [store.get_rollout(rid)])[0]
            assert t.reward == 0.75 and t.token_source == "engine" and t.call_id == call.call_id

            bad = subprocess.run(
                [
                    *AGL,
                    "run",
                    "--store",
                    url,
                    "--gateway",
                    gw.url,
                    "--",
                    sys.executable,
                    "-c",
                    "import sys; print('it broke', file=sys.stderr); sys.exit(3)",
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert bad.returncode == 3 and "it broke" in bad.stderr
            failed = list(store.query_rollouts(status=RolloutStatus.FAILED))
            assert len(failed) == 1 and "exited with code 3" in failed[0].error and "it broke" in failed[0].error
    finally:
        store.close()


def _agl_env(**extra: str) -> dict[str, str]:
    """The caller's environment without agl's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    path = os.pathsep.join(filter(None, [str(REPO / "core" / "src"), os.environ.get("PYTHONPATH")]))
    return env | {"PYTHONPATH": path} | extra  # the caller's path after: a worktree's own packages


def test_agl_run_and_the_gateway_read_the_same_key_secret_variable(tmp_path):
    """Only AGL_GATEWAY_URL and AGL_ROLLOUT_KEY_SECRET set, as agl gateway serve prints them:
    the child's call is not a 401, and the child never sees the secret or a token."""
    from agl.store.sqlite import SqliteStore
    from agl_trainer.gateway import Gateway

    db = tmp_path / "agl.db"
    script = _write_script(
        tmp_path,
        """
        from openai import OpenAI
        reply = OpenAI().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        print(reply.choices[0].message.content)
    """,
    )
    store = SqliteStore(db)
    try:
        with FakeEngine() as engine, Gateway(store, [engine.url], token=RUN_TOKEN) as gw:
            env = _agl_env(AGL_GATEWAY_URL=gw.url, AGL_ROLLOUT_KEY_SECRET=gw.keys.secret, AGL_GATEWAY_TOKEN=RUN_TOKEN)
            proc = subprocess.run(
                [*AGL, "run", "--store", f"sqlite:///{db}", "--", sys.executable, str(script)],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert proc.returncode == 0, proc.stderr
            assert proc.stdout.startswith("echo: hi")
            assert "OPENAI_API_KEY=AGL_ROLLOUT_KEY=this rollout's key" in proc.stderr
            assert RUN_TOKEN not in proc.stderr and gw.keys.secret not in proc.stderr
            gw.flush()
            (rollout,) = store.query_rollouts(status=RolloutStatus.SUCCEEDED)
            assert len(list(store.query_llm_calls(rollout_id=rollout.rollout_id))) == 1
    finally:
        store.close()


def test_agl_run_with_a_gateway_and_no_key_secret_says_which_flag(tmp_path):
    proc = subprocess.run(
        [*AGL, "run", "--store", f"sqlite:///{tmp_path}/a.db", "--gateway", "http://127.0.0.1:9", "--", "true"],
        env=_agl_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "agl: error: --gateway: no rollout key for the child" in proc.stderr
    assert "$AGL_ROLLOUT_KEY_SECRET" in proc.stderr
    assert not (tmp_path / "a.db").exists()  # refused before any rollout was claimed


def test_agl_run_without_a_gateway_leaves_the_callers_openai_variables(tmp_path):
    out = tmp_path / "seen.json"
    keys = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")
    code = f"import json, os; json.dump({{k: os.environ.get(k) for k in {keys!r}}}, open({str(out)!r}, 'w'))"
    theirs = {"OPENAI_BASE_URL": "https://example.invalid/v1", "ANTHROPIC_API_KEY": "their-anthropic-key"}
    proc = subprocess.run(
        [*AGL, "run", "--store", f"sqlite:///{tmp_path}/a.db", "--", sys.executable, "-c", code],
        env=_agl_env(OPENAI_API_KEY="users-own-key") | theirs | {"ANTHROPIC_BASE_URL": "https://example.invalid"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text()) == {
        "OPENAI_API_KEY": "users-own-key",
        "OPENAI_BASE_URL": "https://example.invalid/v1",
        "ANTHROPIC_API_KEY": "their-anthropic-key",
        "ANTHROPIC_BASE_URL": "https://example.invalid",
    }
    assert "no gateway (--gateway or $AGL_GATEWAY_URL): OPENAI_* and ANTHROPIC_* left as they are" in proc.stderr
    assert "users-own-key" not in proc.stderr


def test_agl_run_hides_secrets_it_prints():
    from agl_trainer.cli.run import hide_password, shorten_secret

    assert hide_password("postgresql://agl:s3cret@db.example:5432/agl") == "postgresql://agl:***@db.example:5432/agl"
    assert hide_password("postgresql://agl:s3cret@[::1]/agl") == "postgresql://agl:***@[::1]/agl"
    assert hide_password("sqlite:////tmp/agl.db") == "sqlite:////tmp/agl.db"
    assert shorten_secret("abcdefghijklmnopqrstuvwxyz") == "abcd... (26 chars)"
    assert shorten_secret("short") == "*** (5 chars)"


def test_agl_runner_process_runs_an_agent_module(tmp_path, sqlite_store):
    _enqueue(sqlite_store, 5)
    agent_file = _write_script(
        tmp_path,
        """
        import agl

        def agent(task_input, ctx):
            agl.emit_reward(task_input["i"] * 2)
            return {"seen": ctx.base_url, "key": ctx.api_key}
    """,
    )
    env = dict(os.environ, PYTHONPATH=str(REPO / "core" / "src"), AGL_ROLLOUT_KEY_SECRET="k" * 32)
    proc = subprocess.run(
        [
            *AGL,
            "runner",
            f"{agent_file}:agent",
            "--store",
            f"sqlite:///{sqlite_store.path}",
            "--gateway",
            "http://127.0.0.1:9",
            "--gateway-token=tok",
            "--concurrency",
            "2",
            "--until-idle",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "5 succeeded" in proc.stdout
    r = sqlite_store.get_rollout("ro2")
    from agl.credentials import RolloutKeys

    assert r.output == {"seen": "http://127.0.0.1:9/rollouts/ro2/v1", "key": RolloutKeys("k" * 32).mint("ro2", 1)}
    assert [w.value for w in sqlite_store.query_rewards(rollout_id="ro2")] == [4.0]


def test_agl_runner_with_a_gateway_and_no_key_secret_refuses_to_start(tmp_path, sqlite_store):
    _enqueue(sqlite_store, 1)
    env = {k: v for k, v in os.environ.items() if k != "AGL_ROLLOUT_KEY_SECRET"} | {
        "PYTHONPATH": str(REPO / "core" / "src")
    }
    command = [
        *AGL,
        "runner",
        "x:agent",
        "--store",
        f"sqlite:///{sqlite_store.path}",
        "--gateway",
        "http://127.0.0.1:9",
    ]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no rollout key for the agents" in proc.stderr, proc.stderr
    assert sqlite_store.get_rollout("ro0").status == RolloutStatus.QUEUED


def test_agl_runner_rejects_a_bad_agent_spec(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "core" / "src"))
    proc = subprocess.run(
        [*AGL, "runner", "no_such_module_xyz:agent", "--store", f"sqlite:///{tmp_path}/a.db"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "agent: cannot import module 'no_such_module_xyz'" in proc.stderr
