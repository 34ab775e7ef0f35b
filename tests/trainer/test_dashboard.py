"""The dashboard over plain HTTP (no browser): auth, the rollout list's pagination, filters and
sorting, escaping, attaching a reward (form, store API, CLI), the runs page's numbers, and
``agl dashboard`` as a process. The store server serves the pages under ``/ui``."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest

from agl.schema import LLMCall, Reward, Rollout, RolloutStatus, Span, Task
from agl.store.http import HttpStore
from agl.store.sqlite import SqliteStore
from agl_trainer.cli import main
from agl_trainer.store_server import ServerThread
from tests.conftest import wait_until_serving

TOKEN = "dash-token-1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EVIL = "<script>alert('x')</script>"


def fill(store: SqliteStore, n: int = 60) -> None:
    """``n`` ended rollouts over three tasks: rollout i has reward i/10 (every third one failed,
    with an error), two agents, and one with a span, an LLM call and text holding ``<script>``."""
    store.add_tasks([Task(task_id=f"task-{k}", input={"q": f"{k} {EVIL}"}) for k in range(3)])
    rollouts = [Rollout(rollout_id=f"ro-{i:03d}", task_id=f"task-{i % 3}", step=i // 10) for i in range(n)]
    store.enqueue(rollouts)
    store.claim("runner", limit=n)
    t0 = time.time()
    spans, rewards = [], []
    for i in range(n):
        agent = "solver" if i % 2 == 0 else "critic"
        spans.append(
            Span(
                span_id=f"sp-{i}",
                rollout_id=f"ro-{i:03d}",
                name=f"agent {EVIL}" if i == 0 else "agent",
                kind="agent",
                start_time=t0,
                end_time=t0 + 1 + i,
                attributes={"gen_ai.agent.name": agent},
            )
        )
        rewards.append(Reward(rollout_id=f"ro-{i:03d}", value=i / 10))
    spans.append(
        Span(
            span_id="sp-llm",
            parent_id="sp-0",
            rollout_id="ro-000",
            seq=1,
            name="chat",
            kind="llm",
            start_time=t0 + 0.2,
            end_time=t0 + 0.7,
            attributes={
                "gen_ai.response.id": "call-0",
                "gen_ai.agent.name": "solver",
                "gen_ai.input.messages": json.dumps([{"role": "user", "content": f"span says {EVIL}"}]),
            },
        )
    )
    store.add_spans(spans)
    store.add_rewards(rewards)
    store.add_llm_calls(
        [
            LLMCall(
                call_id="call-0",
                rollout_id="ro-000",
                request={"messages": [{"role": "user", "content": f"say {EVIL}"}]},
                response={"choices": [{"message": {"content": f"ok {EVIL}"}}]},
                prompt_ids=[11, 12, 13],
                response_ids=[21, 22],
                response_logprobs=[-0.05, -2.5],
            )
        ]
    )
    for i in range(n):
        failed = i % 3 == 2
        store.finish(
            f"ro-{i:03d}",
            RolloutStatus.FAILED if failed else RolloutStatus.SUCCEEDED,
            error=f"boom {EVIL}" if failed else None,
        )


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("dash") / "agl.db"
    store = SqliteStore(path)
    fill(store)
    store.add_step_record("run-a", {"kind": "train", "step": 1, "reward_mean": 0.25, "reward_std": 0.1})
    store.add_step_record("run-a", {"kind": "train", "step": 2, "reward_mean": 0.625, "reward_std": 0.2})
    server = ServerThread(store, token=TOKEN, runner_token="runner-tok")
    with server, httpx.Client(base_url=server.url, timeout=10) as client:
        yield store, server, client
    store.close()


def rows(html: str) -> list[str]:
    return re.findall(r'data-rollout-id="([^"]+)"', html)


def test_pages_need_the_admin_token_or_the_login_cookie(served):
    _, server, client = served
    assert client.get("/ui/rollouts").status_code == 303  # to the login form
    assert client.get("/ui/rollouts").headers["location"].startswith("/ui/login")
    assert client.get("/ui/rollouts", headers={"Accept": "application/json"}).status_code == 401
    assert client.get("/ui/rollouts", headers={"Authorization": "Bearer nope"}).status_code == 303
    assert client.get("/ui/rollouts", headers={"Authorization": "Bearer runner-tok"}).status_code == 303
    assert client.post("/ui/rollouts/ro-001/reward", data={"value": "1"}).status_code == 401
    assert client.get("/ui/rollouts", headers=AUTH).status_code == 200
    assert client.get("/v1/stats").status_code == 401  # the API keeps its own check
    assert client.get("/v1/stats", headers=AUTH).status_code == 200

    wrong = client.post("/ui/login", data={"token": "nope", "next": "/ui/rollouts"})
    assert wrong.status_code == 401 and "wrong token" in wrong.text and "set-cookie" not in wrong.headers
    ok = client.post("/ui/login", data={"token": TOKEN, "next": "/ui/traces"})
    assert ok.status_code == 303 and ok.headers["location"] == "/ui/traces"
    cookie = ok.headers["set-cookie"]
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and TOKEN not in cookie
    with httpx.Client(base_url=server.url, timeout=10) as browser:
        browser.cookies.set("agl_dashboard", ok.cookies["agl_dashboard"])
        assert browser.get("/ui/rollouts").status_code == 200
        assert browser.get("/v1/stats").status_code == 401  # the cookie opens the pages only
        browser.post("/ui/logout")
    outside = client.post("/ui/login", data={"token": TOKEN, "next": "https://evil.example/"})
    assert outside.headers["location"] == "/ui/runs"


def test_rollouts_are_paginated_filtered_and_sorted_in_the_database(served):
    _, _, client = served
    first = client.get("/ui/rollouts", params={"size": 25}, headers=AUTH).text
    assert "60 rollouts" in first and "page 1 of 3" in first
    assert rows(first)[:2] == ["ro-059", "ro-058"]  # newest first
    last = client.get("/ui/rollouts", params={"size": 25, "page": 3}, headers=AUTH).text
    assert len(rows(last)) == 10 and rows(last)[-1] == "ro-000"

    by_reward = client.get("/ui/rollouts", params={"sort": "reward", "dir": "asc", "size": 25}, headers=AUTH).text
    assert rows(by_reward)[:3] == ["ro-000", "ro-001", "ro-002"]
    ranged = client.get("/ui/rollouts", params={"reward_min": 1.0, "reward_max": 1.45}, headers=AUTH).text
    assert sorted(rows(ranged)) == [f"ro-{i:03d}" for i in range(10, 15)]
    failed = client.get("/ui/rollouts", params={"status": "failed", "task": "task-2"}, headers=AUTH).text
    assert "20 rollouts" in failed and all(int(r[3:]) % 3 == 2 for r in rows(failed))
    errors = client.get("/ui/rollouts", params={"error": "boom", "step": 0}, headers=AUTH).text
    assert sorted(rows(errors)) == ["ro-002", "ro-005", "ro-008"]
    critic = client.get("/ui/rollouts", params={"agent": "critic", "step": 1}, headers=AUTH).text
    assert sorted(rows(critic)) == [f"ro-{i:03d}" for i in range(11, 20, 2)]
    slow = client.get("/ui/rollouts", params={"duration_min": 0, "sort": "duration", "size": 25}, headers=AUTH)
    assert slow.status_code == 200 and "60 rollouts" in slow.text
    assert "0 rollouts" in client.get("/ui/rollouts", params={"model": "nope"}, headers=AUTH).text

    bad = client.get("/ui/rollouts", params={"reward_min": "high"}, headers=AUTH)
    assert bad.status_code == 422 and "reward_min: expected a number" in bad.text
    bad = client.get("/ui/rollouts", params={"sort": "pk; DROP TABLE rollouts"}, headers=AUTH)
    assert bad.status_code == 422 and "sort: cannot sort by" in bad.text
    assert client.get("/ui/rollouts", params={"size": 7}, headers=AUTH).status_code == 422


def test_everything_shown_is_escaped(served):
    _, _, client = served
    for path in ("/ui/rollouts/ro-000", "/ui/rollouts?status=failed"):
        html = client.get(path, headers=AUTH).text
        assert "<script>alert" not in html
        assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    answer = client.get("/ui/rollouts/ro-000", headers=AUTH)
    assert "script-src 'nonce-" in answer.headers["content-security-policy"]  # no script runs but its own
    assert answer.headers["x-frame-options"] == "DENY" and answer.headers["cache-control"] == "no-store"
    runs = client.get("/ui/runs", headers=AUTH)
    nonce = re.search(r"'nonce-([^']+)'", runs.headers["content-security-policy"]).group(1)
    assert f'<script nonce="{nonce}">' in runs.text
    assert "script-src 'none'" in client.get("/ui/login").headers["content-security-policy"]
    assert client.get("/ui/rollouts/no-such", headers=AUTH).status_code == 404
    assert "&lt;img" in client.get("/ui/rollouts/%3Cimg%20src%3Dx%3E", headers=AUTH).text


def test_a_rollout_page_shows_spans_calls_tokens_and_credit(served):
    _, _, client = served
    html = client.get("/ui/rollouts/ro-000", headers=AUTH).text
    assert html.count('class="span"') == 2 and 'data-kind="llm"' in html
    assert 'trained</span>: reward <b class="credit">0</b>' in html  # rollout 0's reward, broadcast
    assert 'data-logprob="-2.5000"' in html and ">22</span>" in html
    assert "prompt tokens <b>3</b>" in html and "response tokens <b>2</b>" in html
    messages = html.split("class='span-messages'")[1]
    assert messages.index("user") < messages.index("span says &lt;script&gt;")


def test_attach_a_reward_by_form_api_and_cli(served):
    store, server, client = served
    answer = client.post("/ui/rollouts/ro-001/reward", data={"value": "0.9", "source": "reviewer"}, headers=AUTH)
    assert answer.status_code == 303
    bad = client.post("/ui/rollouts/ro-001/reward", data={"value": "nan"}, headers=AUTH)
    assert bad.status_code == 422 and "value: must be finite" in bad.text
    assert client.post("/ui/rollouts/nope/reward", data={"value": "1"}, headers=AUTH).status_code == 404
    with HttpStore(server.url, token=TOKEN) as api:  # the store API's own route
        api.add_rewards([Reward(rollout_id="ro-001", value=0.8, source="api")])
    assert main(["rollouts", "reward", "ro-001", "0.7", "--store", server.url, "--store-token", TOKEN]) == 0
    assert main(["rollouts", "reward", "ro-001", "lots", "--store", server.url, "--store-token", TOKEN]) == 2
    got = [(r.value, r.source) for r in store.query_rewards(rollout_id="ro-001")]
    assert got[1:] == [(0.9, "reviewer"), (0.8, "api"), (0.7, "human")]
    html = client.get("/ui/rollouts", params={"task": "task-1", "step": 0}, headers=AUTH).text
    assert re.search(r'data-rollout-id="ro-001">.*?class=\'num reward\'>0\.7<', html, re.S)


def test_runs_page_charts_the_step_records(served):
    _, _, client = served
    html = client.get("/ui/runs", headers=AUTH).text
    assert "Run run-a" in html
    values = re.findall(r'data-series="train" data-step="(\d+)" data-value="([^"]+)"', html.split("chart-success")[0])
    assert values == [("1", "0.25"), ("2", "0.625")]
    fragment = client.get("/ui/runs/charts", params={"run": "run-a"}, headers=AUTH)
    assert fragment.status_code == 200 and "<html" not in fragment.text and "chart-reward" in fragment.text


def test_off_policy_steps_get_their_own_charts(served):
    store, _, client = served
    corrected = {"rollout_corr/rollout_is_mean": 0.97, "rollout_corr/rollout_is_max": 2.0, "rollout_corr/kl": 0.012}
    store.add_step_record("run-async", {"kind": "train", "step": 1, "reward_mean": 0.5, **corrected})
    html = client.get("/ui/runs/charts", params={"run": "run-async"}, headers=AUTH).text
    chart = html.split('id="chart-offpolicy"')[1].split("</svg>")[0]
    assert 'data-series="IS max" data-step="1" data-value="2.0"' in chart
    assert 'data-series="kl" data-step="1" data-value="0.012"' in html.split('id="chart-offpolicy-kl"')[1]
    on_policy = client.get("/ui/runs/charts", params={"run": "run-a"}, headers=AUTH).text
    assert "chart-offpolicy" not in on_policy  # an on-policy run has nothing to chart there


def series(html: str, chart: str) -> list[tuple[str, str, str]]:
    """``(series, step, value)`` of each point of the chart with id ``chart``."""
    svg = html.split(f'id="{chart}"')[1].split("</svg>")[0]
    return re.findall(r'data-series="([^"]+)" data-step="(\d+)" data-value="([^"]+)"', svg)


def test_each_policy_gets_its_own_line_on_the_per_policy_charts(served):
    """A run of two policies: the trained writer's loss, KL, reward and transitions, and the frozen
    checker's calls, each under its own name with its own values; a run of one policy has no such chart."""
    store, _, client = served
    for step, (loss, kl, calls) in enumerate(((0.5, 0.01, 12), (0.25, 0.03, 9)), start=1):
        writer = {"loss": loss, "kl": kl, "grad_norm": 2.0 * step, "reward_mean": 0.1 * step, "transitions": 8 + step}
        record = {f"policy/writer/{k}": v for k, v in writer.items()} | {"policy/checker/calls": calls}
        store.add_step_record("run-policies", {"kind": "train", "step": step, "reward_mean": 0.3, **record})
    html = client.get("/ui/runs/charts", params={"run": "run-policies"}, headers=AUTH).text
    assert series(html, "chart-policy-loss") == [("writer", "1", "0.5"), ("writer", "2", "0.25")]
    assert series(html, "chart-policy-kl") == [("writer", "1", "0.01"), ("writer", "2", "0.03")]
    assert series(html, "chart-policy-grad_norm") == [("writer", "1", "2.0"), ("writer", "2", "4.0")]
    assert series(html, "chart-policy-reward_mean") == [("writer", "1", "0.1"), ("writer", "2", "0.2")]
    assert series(html, "chart-policy-counts") == [
        ("checker calls", "1", "12.0"),
        ("checker calls", "2", "9.0"),
        ("writer transitions", "1", "9.0"),
        ("writer transitions", "2", "10.0"),
    ]
    assert "chart-policy-entropy" not in html  # no policy has it
    assert series(html, "chart-reward") == [("train", "1", "0.3"), ("train", "2", "0.3")]  # the run's own charts stay
    one_policy = client.get("/ui/runs/charts", params={"run": "run-a"}, headers=AUTH).text
    assert "chart-policy" not in one_policy and series(one_policy, "chart-reward") == [
        ("train", "1", "0.25"),
        ("train", "2", "0.625"),
    ]


def test_a_call_card_names_the_policy_that_served_it(served):
    store, _, client = served
    store.add_tasks([Task(task_id="task-policy", input={"q": "?"})])
    store.enqueue([Rollout(rollout_id="ro-policy", task_id="task-policy")])
    store.add_llm_calls(
        LLMCall(
            call_id=f"call-{name}",
            rollout_id="ro-policy",
            request={"model": f"{name}-model", "messages": [{"role": "user", "content": "hi"}]},
            response={"choices": [{"message": {"content": "ok"}}]},
            prompt_ids=[1],
            response_ids=[2],
            model_version=version,
            policy=name,
        )
        for name, version in (("writer", "writer-step-3"), ("checker", "base"))
    )
    html = client.get("/ui/rollouts/ro-policy", headers=AUTH).text
    writer, checker = html.split('id="call-call-writer"')[1].split('id="call-call-checker"')
    assert 'policy <b class="policy">writer</b> · version writer-step-3' in writer
    assert 'policy <b class="policy">checker</b> · version base' in checker
    assert 'class="policy"' not in client.get("/ui/rollouts/ro-000", headers=AUTH).text  # a call of no policy


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_agl_dashboard_serves_a_sqlite_file(served, tmp_path):
    store, _, _ = served
    token_file = tmp_path / "token"
    token_file.write_text("file-token\n")
    port = _free_port()
    db = store.dialect.path
    cmd = [sys.executable, "-c", "import sys; from agl_trainer.cli import main; sys.exit(main())"]
    cmd += ["dashboard", "--store", f"sqlite:///{db}", "--port", str(port), "--admin-token-file", str(token_file)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_serving(f"{base}/healthz", proc, 20)
        page = httpx.get(f"{base}/ui/rollouts", headers={"Authorization": "Bearer file-token"}, timeout=5)
        assert page.status_code == 200 and "ro-059" in page.text
        assert httpx.get(f"{base}/ui/rollouts", headers=AUTH, timeout=5).status_code == 303
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    missing = main(["dashboard", "--store", f"sqlite:///{tmp_path}/none.db", "--admin-token", "t"])
    assert missing == 2


def test_step_records_through_the_store_api(served):
    _, server, client = served
    with HttpStore(server.url, token=TOKEN) as api:
        api.add_step_record("run-h", {"kind": "train", "step": 1, "loss": float("nan"), "reward_mean": 0.5})
        api.add_step_record("run-h", {"kind": "train", "step": 1, "reward_mean": 0.9})  # the same step: kept once
        assert api.step_records("run-h") == [
            {"kind": "train", "step": 1, "loss": None, "reward_mean": 0.5, "run_id": "run-h"}
        ]
        with pytest.raises(Exception, match="step: must be an integer"):
            api.add_step_record("run-h", {"kind": "train", "step": "one"})
    refused = client.post(
        "/v1/run_steps", json={"run_id": "x", "record": {"step": 1}}, headers={"Authorization": "Bearer runner-tok"}
    )
    assert refused.status_code == 403


def test_a_training_run_puts_its_steps_where_the_runs_page_reads_them(tmp_path):
    from agl_trainer.trainer import Trainer
    from tests.fake_engine import FakeEngine
    from tests.trainer.test_trainer import TinyBackend, _tasks, agent, small_config

    with FakeEngine() as engine:
        # The run trains no agent's calls: its rollout pages must say so (they follow the run's config).
        config = small_config(tmp_path, engine, steps=2, plot=False, transitions={"agents": ["nobody"]})
        result = Trainer(config, backend=TinyBackend(tmp_path / "calls.jsonl")).fit(agent, _tasks(2))
    store = SqliteStore(tmp_path / "agl.db")
    try:
        kept = store.step_records()
        assert [(r["kind"], r["step"]) for r in kept] == [("config", 0), ("train", 1), ("train", 2)]
        assert kept[0]["transitions"]["agents"] == ["nobody"]
        assert [r["reward_mean"] for r in kept[1:]] == [r["reward_mean"] for r in result.history]
        run_id = kept[0]["run_id"]
        trained = next(r for r in store.query_rollouts(step=1) if r.status == RolloutStatus.SUCCEEDED)
        server = ServerThread(store, token=TOKEN)
        with server, httpx.Client(base_url=server.url, timeout=10) as client:
            html = client.get("/ui/runs", headers=AUTH).text
            page = client.get(f"/ui/rollouts/{trained.rollout_id}", headers=AUTH).text
    finally:
        store.close()
    reward_chart = html.split('id="chart-success"')[0]
    shown = re.findall(r'data-series="train" data-step="(\d+)" data-value="([^"]+)"', reward_chart)
    assert [(int(s), float(v)) for s, v in shown] == [(r["step"], r["reward_mean"]) for r in result.history]
    assert 'id="chart-time"' in html and 'data-series="rollout"' in html
    assert f'agents nobody</span> <span class="muted">(run {run_id}&#x27;s config)' in page
    assert "not trained" in page and "trained</span>: reward" not in page


def test_the_store_keeps_each_rollouts_final_reward_for_sorting(tmp_path):
    import sqlite3

    path = tmp_path / "agl.db"
    store = SqliteStore(path)
    store.add_tasks([Task(task_id="t", input={})])
    store.enqueue([Rollout(rollout_id="a", task_id="t"), Rollout(rollout_id="b", task_id="t")])
    first = Reward(rollout_id="a", value=0.3)
    store.add_rewards([first, Reward(rollout_id="a", value=0.9, source="return")])
    store.add_rewards([Reward(rollout_id="a", value=0.5), Reward(rollout_id="a", name="format", value=7.0)])
    store.add_rewards([first])  # a retried write changes nothing
    store.add_rewards([Reward(rollout_id="b", value=0.1), Reward(rollout_id="b", value=0.2)])

    def finals(s):
        return dict(s.select("SELECT rollout_id, reward FROM rollouts ORDER BY rollout_id"))

    assert finals(store) == {"a": 0.9, "b": 0.2}  # returned beats emitted; else the last
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE rollouts DROP COLUMN reward")  # as an older agl created it
    conn.commit()
    conn.close()
    store = SqliteStore(path)
    try:
        assert finals(store) == {"a": 0.9, "b": 0.2}  # filled in when the column is added
    finally:
        store.close()


@pytest.mark.postgres
def test_the_pages_read_a_postgresql_store(tmp_path):
    from agl.store.postgres import PostgresStore
    from tests.pg import create_database, drop_database, shared_server_url

    url = create_database(shared_server_url())
    store = PostgresStore(url)
    try:
        fill(store, n=30)
        store.add_step_record("run-pg", {"kind": "train", "step": 1, "reward_mean": 0.5, "loss": float("nan")})
        server = ServerThread(store, token=TOKEN)
        with server, httpx.Client(base_url=server.url, timeout=10) as client:
            by_reward = client.get("/ui/rollouts", params={"sort": "reward", "size": 25}, headers=AUTH).text
            assert "30 rollouts" in by_reward and rows(by_reward)[:2] == ["ro-029", "ro-028"]
            ranged = client.get("/ui/rollouts", params={"reward_min": 1, "reward_max": 1.25}, headers=AUTH).text
            assert sorted(rows(ranged)) == ["ro-010", "ro-011", "ro-012"]
            for params in ({"agent": "critic", "sort": "agent"}, {"error": "boom", "sort": "duration"}):
                assert client.get("/ui/rollouts", params=params, headers=AUTH).status_code == 200
            page = client.get("/ui/rollouts/ro-000", headers=AUTH).text
            assert 'class="credit">0<' in page and "&lt;script&gt;" in page
            assert 'data-value="0.5"' in client.get("/ui/runs", headers=AUTH).text
    finally:
        store.close()
        drop_database(url)


def test_a_call_card_shows_an_anthropic_calls_system_answer_and_tool_use():
    from agl_trainer.dashboard.rollout import _call_card

    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
    call = LLMCall(
        call_id="msg_1",
        rollout_id="ro-1",
        endpoint="messages",
        request={
            "model": "claude-x",
            "max_tokens": 9,
            "system": "be brief",
            "messages": [{"role": "user", "content": "hi"}],
        },
        response={"id": "msg_1", "type": "message", "content": [{"type": "text", "text": "checking"}, use]},
        prompt_ids=[1, 2],
        response_ids=[3],
    )
    card = _call_card(call, 1, {}, Rollout(rollout_id="ro-1", task_id="t"))  # not ended: no verdict yet
    assert card.index("be brief") < card.index("hi") and "checking" in card
    assert "tool calls" in card and "get_weather" in card and "Oslo" in card


def test_a_step_record_with_a_bad_value_is_shown_as_such_never_a_500(served):
    """A string ``reward_std`` (the store takes any JSON object from the admin) leaves that value
    out of the charts and lists it under them; /ui/runs and the charts fragment still answer 200."""
    store, _, client = served
    store.add_step_record("run-bad", {"kind": "train", "step": 1, "reward_mean": 0.5, "reward_std": "abc"})
    store.add_step_record(
        "run-bad", {"kind": "train", "step": 2, "reward_mean": [1], "time_update_s": "slow", "success_rate": 0.5}
    )
    for answer in (
        client.get("/ui/runs", params={"run": "run-bad"}, headers=AUTH),
        client.get("/ui/runs/charts", params={"run": "run-bad"}, headers=AUTH),
    ):
        assert answer.status_code == 200
        bad = answer.text.split('id="bad-values"')[1].split("</div>")[0]
        assert re.findall(r"<li>(.*?)</li>", bad) == [
            "step 1: reward_std = &quot;abc&quot;",
            "step 2: reward_mean = [1]",
            "step 2: time_update_s = &quot;slow&quot;",
        ]
        reward = answer.text.split('id="chart-reward"')[1].split('id="chart-success"')[0]
        assert re.findall(r'data-series="train" data-step="(\d+)" data-value="([^"]+)"', reward) == [("1", "0.5")]
        assert "reward [1]" in answer.text  # the last step's summary shows the stored value
    assert client.get("/ui/runs", headers=AUTH).status_code == 200  # the newest run is the bad one


def test_chart_axes_have_round_ticks_and_whole_labels(served):
    """Ticks at 1, 2 or 5 × 10^k, steps too, and the plot starts right of the longest y label
    (``-1e-07`` is not cut to ``1e-07``, which would read the KL axis out of order)."""
    store, _, client = served
    for step, kl in [(1, -9.65e-08), (38, 1.2e-07), (76, 2.9e-07), (113, 0.0)]:
        store.add_step_record("run-kl", {"kind": "train", "step": step, "kl": kl, "reward_mean": step / 100})
    html = client.get("/ui/runs/charts", params={"run": "run-kl"}, headers=AUTH).text
    kl = html.split('id="chart-kl"')[1].split('id="chart-entropy"')[0]
    assert re.findall(r'class="y-tick">([^<]+)<', kl) == ["-1e-07", "0", "1e-07", "2e-07", "3e-07"]
    assert re.findall(r'class="x-tick">([^<]+)<', kl) == ["0", "50", "100", "150"]
    plot_left = float(re.search(r'<rect x="([\d.]+)"', kl).group(1))
    label_right = float(re.search(r'<text x="([\d.]+)" y="[\d.]+" text-anchor="end"', kl).group(1))
    assert plot_left > label_right and label_right >= 6.5 * len("-1e-07")  # room for the whole label
    reward = html.split('id="chart-reward"')[1].split('id="chart-success"')[0]
    assert re.findall(r'class="y-tick">([^<]+)<', reward) == ["0.0", "0.5", "1.0", "1.5"]


@pytest.mark.parametrize(
    ("lo", "hi", "ticks"),
    [
        (-0.207, 1.21, [-0.5, 0.0, 0.5, 1.0, 1.5]),
        (0.0, 12.3, [0.0, 5.0, 10.0, 15.0]),
        (3.0, 3.0, [2.0, 2.5, 3.0, 3.5, 4.0]),
        (1000.001, 1000.002, [1000.001, 1000.0015, 1000.002]),
    ],
)
def test_nice_ticks_are_multiples_of_1_2_or_5(lo, hi, ticks):
    from agl_trainer.dashboard.charts import nice_ticks, tick_labels

    assert nice_ticks(lo, hi) == ticks
    labels = tick_labels(ticks)
    assert len(set(labels)) == len(labels)  # distinct, however close the ends


def test_the_login_page_names_the_token_the_server_printed(served):
    _, _, client = served
    html = client.get("/ui/login").text
    assert "printed when it started" in html and "$AGL_STORE_TOKEN" not in html


def test_a_rollout_page_shows_the_resources_it_ran_with(tmp_path):
    """The prompt and few-shot examples an algorithm chose (agl-apo), and their version, escaped."""
    from agl_trainer.dashboard.rollout import rollout_page
    from agl_trainer.transitions import TransitionConfig

    store = SqliteStore(tmp_path / "agl.db")
    try:
        store.add_tasks([Task(task_id="t", input={"q": 1})])
        resources = {"system_prompt": f"Answer in one line {EVIL}", "few_shot": ["Question: a\nAnswer: b", "Q2"]}
        store.enqueue([Rollout(rollout_id="ro-p", task_id="t", resources=resources, resources_version="s2c1-ab")])
        html = rollout_page(store, "ro-p", prefix="/ui", config=TransitionConfig())
    finally:
        store.close()
    assert "<tr><th>resources version</th><td>s2c1-ab</td></tr>" in html
    shown = html.split("<th>resources</th>")[1]
    assert shown.index("system_prompt") < shown.index("Answer in one line &lt;script&gt;")
    assert "<pre>Question: a\nAnswer: b</pre><pre>Q2</pre>" in shown and "<script>" not in shown
