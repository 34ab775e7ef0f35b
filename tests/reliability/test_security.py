"""Drills: the security defects of the second hardening round (issue 32), each pinned against
the real servers: malformed keys, reward sources, id ownership, out-of-range numbers."""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import struct

import httpx
import pytest

from tests.conftest import stop_process
from tests.reliability.targets import gateway_target, store_target


def _errors(caplog) -> list[str]:
    return [f"{r.name}: {r.getMessage()[:200]}" for r in caplog.records if r.levelno >= logging.ERROR]


def _malformed_keys() -> list[bytes]:
    """Rollout keys no server may choke on (latin-1 header bytes, as they arrive)."""
    rid = base64.urlsafe_b64encode(b"ro-run").rstrip(b"=")
    mac = b"A" * 43
    return [
        b"agl-rk.\xb2." + rid + b"." + mac,  # a superscript two: str.isdigit() says yes, int() says no
        b"agl-rk." + b"9" * 4300 + b"." + rid + b"." + mac,  # past int()'s 4,300-digit limit
        b"agl-rk." + b"9" * 40 + b"." + rid + b"." + mac,  # an attempt past 2**63
        b"agl-rk.1." + rid + b"." + b"\xe9" * 43,  # a non-ASCII MAC: compare_digest raises on it
        b"agl-rk.1.\xe9\xe9." + mac,  # a non-ASCII rollout id
        b"agl-rk.1.A." + mac,  # base64 of a length no bytes have
        b"agl-rk.1." + rid,  # too few parts
        b"agl-rk.",
    ]


@pytest.mark.parametrize("server", ["store", "gateway"])
def test_every_malformed_rollout_key_is_a_401_without_a_traceback(tmp_path, caplog, server):
    target_of, path = (store_target, "/v1/spans") if server == "store" else (gateway_target, "/v1/models")
    with target_of(tmp_path) as (target, _):
        for key in _malformed_keys():
            answer = target.client.request(
                "POST" if server == "store" else "GET",
                path,
                headers={"Authorization": b"Bearer " + key},
                **({"json": {"spans": []}} if server == "store" else {}),
            )
            assert answer.status_code == 401, (key[:40], answer.status_code, answer.text[:200])
    assert not _errors(caplog)


def _post(target, path: str, body: dict, credential: str = "key") -> httpx.Response:
    return target.client.post(path, json=body, headers={"Authorization": f"Bearer {target.credentials[credential]}"})


def test_a_rollout_key_cannot_forge_the_returned_reward_and_a_grader_outranks_what_the_agent_wrote(tmp_path):
    # was: a rollout key wrote {"source": "return", "value": 1.0}, which outranks the plugins:
    # with a grader answering 0.0, the forging rollout trained on 1.0
    from agl.hookspecs import hookimpl
    from agl.plugins import register, unregister
    from agl.schema import LLMCall, RolloutStatus
    from agl_trainer.transitions import TransitionConfig, build_transitions

    with store_target(tmp_path) as (target, store):
        forged = {"reward_id": "forged", "rollout_id": "ro-run", "value": 1.0, "source": "return"}
        answer = _post(target, "/v1/rewards", {"rewards": [forged]})
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]["reason"].startswith("rewards[0].source:"), answer.text
        batch = _post(target, "/v1/batch", {"rewards": [forged]})
        assert batch.status_code == 403 and "rewards[0].source" in batch.text, batch.text
        assert [w.reward_id for w in store.query_rewards(rollout_id="ro-run")] == []

        own = {"reward_id": "own", "rollout_id": "ro-run", "value": 1.0}  # source "agent", what emit_reward writes
        assert _post(target, "/v1/rewards", {"rewards": [own]}).status_code == 200
        store.add_llm_calls([LLMCall(call_id="c1", rollout_id="ro-run", prompt_ids=[1, 2], response_ids=[3])])
        rollout = store.finish("ro-run", RolloutStatus.SUCCEEDED)

        class Grader:
            @staticmethod
            @hookimpl
            def agl_reward(rollout):
                return 0.0

        register(Grader, name="grader")
        try:
            ts, report = build_transitions(store, [rollout], TransitionConfig(credit="emitted"))
            assert [t.reward for t in ts] == [0.0] and report.agent_rewards_ignored == 1  # the grader's alone
            config = TransitionConfig(credit="emitted", agent_rewards="always")
            ts, report = build_transitions(store, [rollout], config)
            assert [t.reward for t in ts] == [1.0] and report.agent_rewards_ignored == 0  # the agent's counts too
        finally:
            unregister(name="grader")


def test_the_runner_token_still_writes_the_returned_reward(tmp_path):
    with store_target(tmp_path) as (target, store):
        returned = {"reward_id": "rw-ro-run-a1-return", "rollout_id": "ro-run", "value": 0.5, "source": "return"}
        assert _post(target, "/v1/rewards", {"rewards": [returned]}, "runner").status_code == 200
        assert [(w.source, w.value) for w in store.query_rewards(rollout_id="ro-run")] == [("return", 0.5)]


def test_ids_are_owned_by_their_rollout_a_squat_is_a_409_naming_the_id_and_the_owner_s_write_is_stored(tmp_path):
    # was: rollout A's key wrote a reward under rw-<B>-a1-return, the id the runner uses for B's
    # returned reward; B's real reward then got 200 and was not stored (span ids the same)
    with store_target(tmp_path) as (target, store):
        [other] = store.claim("runner-0", limit=1)  # ro-queued, now running: rollout B; the key is A's (ro-run)
        squat = {"reward_id": f"rw-{other.rollout_id}-a{other.attempt}-return", "rollout_id": "ro-run", "value": 1}
        for path in ("/v1/rewards", "/v1/batch"):
            answer = _post(target, path, {"rewards": [squat]})
            assert answer.status_code == 409, answer.text
            error = answer.json()["error"]
            assert error["type"] == "IdConflict" and error["ident"] == squat["reward_id"], error
            assert squat["reward_id"] in error["reason"] and other.rollout_id not in error["field"]
        # not even its own rollout's: those ids are the runner's and the reward plugins'
        own = squat | {"reward_id": "rw-ro-run-a1-grader-reward"}
        assert _post(target, "/v1/rewards", {"rewards": [own]}).status_code == 409
        returned = {"reward_id": squat["reward_id"], "rollout_id": other.rollout_id, "value": 0.25, "source": "return"}
        assert _post(target, "/v1/rewards", {"rewards": [returned]}, "runner").status_code == 200
        assert [(w.reward_id, w.value) for w in store.query_rewards(rollout_id=other.rollout_id)] == [
            (squat["reward_id"], 0.25)
        ]

        # any id, once stored, is its rollout's: a write of it for another rollout is refused, not dropped
        span = {"span_id": "sp-taken", "rollout_id": "ro-run", "name": "step"}
        assert _post(target, "/v1/spans", {"spans": [span]}).status_code == 200
        assert _post(target, "/v1/spans", {"spans": [span]}).status_code == 200  # a retry: idempotent
        theirs = span | {"rollout_id": other.rollout_id}
        for path in ("/v1/spans", "/v1/batch"):
            answer = _post(target, path, {"spans": [theirs]}, "runner")
            assert answer.status_code == 409 and answer.json()["error"]["ident"] == "sp-taken", answer.text
        call = {"call_id": "c-taken", "rollout_id": "ro-run", "prompt_ids": [1], "response_ids": [2]}
        assert _post(target, "/v1/llm_calls", {"llm_calls": [call]}).status_code == 200
        answer = _post(target, "/v1/llm_calls", {"llm_calls": [call | {"rollout_id": None}]}, "admin")
        assert answer.status_code == 409 and answer.json()["error"]["ident"] == "c-taken", answer.text
        assert [s.rollout_id for s in store.query_spans() if s.span_id == "sp-taken"] == ["ro-run"]


def _packed(fmt: str, *values) -> str:
    """Values packed the way the clients send them: little-endian, base64, as a JSON string."""
    return json.dumps(base64.b64encode(struct.pack(fmt, *values)).decode())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("response_logprobs", "[-0.5, NaN]"),
        ("response_logprobs", "[-0.5, Infinity]"),
        ("response_logprobs", "[-0.5, -Infinity]"),
        ("response_logprobs", "[-0.5, 1e309]"),  # parses as infinity
        ("response_logprobs", "[-0.5, 1e39]"),  # finite, but infinite as a float32
        ("response_logprobs", _packed("<2f", -0.5, math.nan)),
        ("prompt_ids", "[1, -1]"),
        ("response_ids", _packed("<2i", 3, -7)),
    ],
)
def test_llm_calls_with_a_nan_an_infinite_logprob_or_a_negative_token_id_are_422s_naming_the_field(
    tmp_path, field, value
):
    # was: stored as sent (the docs say non-finite numbers are refused everywhere)
    fields = {"prompt_ids": "[1, 2]", "response_ids": "[3, 4]", "response_logprobs": "[-0.5, -0.25]"} | {field: value}
    call = ", ".join(f'"{k}": {v}' for k, v in fields.items())
    body = '{"llm_calls": [{"call_id": "c-bad", "rollout_id": "ro-run", ' + call + "}]}"
    with store_target(tmp_path) as (target, store):
        admin = {"Authorization": f"Bearer {target.credentials['admin']}", "Content-Type": "application/json"}
        for path in ("/v1/llm_calls", "/v1/batch"):
            answer = target.client.post(path, content=body, headers=admin)
            assert answer.status_code == 422, (path, answer.text)
            assert answer.json()["error"]["field"] == f"llm_calls.0.{field}", answer.text
        good = body.replace(value, "[5, 6]" if field.endswith("ids") else "[-0.5, -0.25]")
        assert target.client.post("/v1/llm_calls", content=good, headers=admin).status_code == 200
        assert [c.call_id for c in store.query_llm_calls()] == ["c-bad"]


def test_finishing_with_an_attempt_past_int64_is_a_422_naming_it(tmp_path):
    # was: a 500 (SQLite's OverflowError)
    with store_target(tmp_path) as (target, store):
        for attempt in (2**63, 10**30):
            answer = _post(target, "/v1/rollouts/ro-run/finish", {"status": "succeeded", "attempt": attempt}, "admin")
            assert answer.status_code == 422 and answer.json()["error"]["field"] == "attempt", answer.text
            batch = {"finishes": [{"rollout_id": "ro-run", "status": "succeeded", "attempt": attempt}]}
            answer = _post(target, "/v1/batch", batch, "admin")
            assert answer.status_code == 422 and "attempt" in answer.json()["error"]["field"], answer.text
        with pytest.raises(ValueError, match="attempt"):
            store.finish("ro-run", "succeeded", attempt=2**63)
        assert store.get_rollout("ro-run").status == "running"


def test_a_gateway_in_front_of_agl_store_serve_records_every_call_with_the_store_s_token(tmp_path):
    # was: the gateway handed its own token (AGL_GATEWAY_TOKEN, exported as the docs do) to the store:
    # calls answered 200 but nothing was recorded, /admin/flush 503, and --store-token-file refused to start.
    # (Fixed on main by the one-name-per-credential change; pinned here against the real processes.)
    import subprocess

    from agl.store.http import HttpStore
    from tests.conftest import free_port, wait_until_serving
    from tests.fake_engine import FakeEngine
    from tests.reliability.conftest import AGL, ROOT, StoreProcess, agl_env

    (tmp_path / "store-token").write_text("store-admin-token\n")
    store = StoreProcess(tmp_path / "agl.db", free_port(), tmp_path / "store-token").start()
    port, log = free_port(), tmp_path / "gateway.log"
    env = agl_env(AGL_GATEWAY_TOKEN="gateway-token", AGL_GATEWAY_ADMIN_TOKEN="gateway-admin")
    try:
        with FakeEngine() as engine, open(log, "ab") as out:
            args = ["gateway", "serve", "--store", store.url, "--store-token-file", str(tmp_path / "store-token")]
            args += ["--upstream", engine.url, "--port", str(port)]
            gateway = subprocess.Popen([*AGL, *args], cwd=ROOT, env=env, stdout=out, stderr=out)
            try:
                url = f"http://127.0.0.1:{port}"
                wait_until_serving(f"{url}/health", gateway, 30, output=lambda: log.read_text()[-2000:])
                chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
                answer = httpx.post(
                    f"{url}/v1/chat/completions", json=chat, headers={"Authorization": "Bearer gateway-token"}
                )
                assert answer.status_code == 200, answer.text
                flushed = httpx.post(f"{url}/admin/flush", headers={"Authorization": "Bearer gateway-admin"})
                assert flushed.status_code == 200, flushed.text
            finally:
                stop_process(gateway, timeout_s=20)
        with HttpStore(store.url, token="store-admin-token") as client:
            assert [c.call_id for c in client.query_llm_calls(production=True)] == [answer.json()["id"]]
    finally:
        store.stop()


_TRACING_CHILD = """
import json, sys
from agents import custom_span, trace
from agents.tracing.processors import default_exporter, default_processor

default_exporter().endpoint = sys.argv[1]  # where api.openai.com would be: a server of the test's
with trace("under agl run"):
    with custom_span("tool"):
        pass
queued = default_processor()._queue.qsize()
default_processor().force_flush()
with trace("with the user's own tracing key", tracing={"api_key": "sk-users-own"}):
    with custom_span("tool"):
        pass
default_processor().force_flush()
print(json.dumps({"queued": queued}))
"""


@pytest.mark.parametrize("under", ["rollout key", "gateway token"])
def test_the_agents_sdk_exporter_sends_no_rollout_key_gateway_token_or_trace_to_openai(tmp_path, under):
    # was: agl's processor was added beside the SDK's default exporter, which posted the run's traces
    # to https://api.openai.com/v1/traces/ingest with OPENAI_API_KEY: the rollout key agl run sets
    import http.server
    import subprocess
    import sys
    import threading

    from agl.credentials import RolloutKeys
    from tests.reliability.conftest import ROOT

    posted: list[tuple[str, dict]] = []

    class Ingest(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            posted.append((self.headers["Authorization"], body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ingest)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    key = RolloutKeys.generate().mint("ro-1", 1) if under == "rollout key" else "the-gateways-production-token"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGL_", "OPENAI_"))}
    env |= {
        "AGL_OPENAI_AGENTS_INSTRUMENT": "1",  # what agl run's child gets, with the two below
        "OPENAI_API_KEY": key,
        "OPENAI_BASE_URL": "http://127.0.0.1:8088/rollouts/ro-1/v1",
        "AGL_STORE_URL": f"sqlite:///{tmp_path / 'agl.db'}",
    }
    try:
        child = subprocess.run(
            [sys.executable, "-c", _TRACING_CHILD, f"http://127.0.0.1:{server.server_port}/v1/traces/ingest"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert child.returncode == 0, child.stderr[-2000:]
    assert json.loads(child.stdout.splitlines()[-1]) == {"queued": 0}, child.stderr[-2000:]
    assert [auth for auth, _ in posted] == ["Bearer sk-users-own"]  # a run's own tracing key still works
    assert all(key not in json.dumps(body) for _, body in posted)


@pytest.mark.parametrize("rollout_id", ["ro/1", "ro?x=1", "ro#frag", "ro%2F100%", "ro é/..?#"])
def test_a_rollout_id_with_url_characters_gets_a_quoted_base_url_the_gateway_routes(tmp_path, rollout_id):
    # was: /rollouts/{id}/v1 unquoted, in agl runner and agl run: such ids failed
    import argparse

    from openai import OpenAI

    from agl.runner import Runner
    from agl.schema import Rollout, Task
    from agl.store.sqlite import SqliteStore
    from agl_trainer.cli.run import child_env
    from agl_trainer.gateway import Gateway
    from tests.fake_engine import FakeEngine

    store = SqliteStore(tmp_path / "agl.db")
    store.add_tasks([Task(task_id="t", input={})])
    store.enqueue([Rollout(rollout_id=rollout_id, task_id="t")])
    [rollout] = store.claim("runner-0", limit=1)
    try:
        with FakeEngine() as engine, Gateway(store, [engine.url], model_version="v1") as gateway:
            key = gateway.rollout_key(rollout_id, rollout.attempt)
            handed = child_env(argparse.Namespace(gateway=gateway.url), rollout, "sqlite:///x", key)
            runner = Runner(store, lambda task: None, gateway_url=gateway.url)
            base = runner.context_for(rollout).base_url
            runner.close()
            assert base == handed["OPENAI_BASE_URL"] == gateway.rollout_base_url(rollout_id)
            with OpenAI(base_url=base, api_key=key) as client:
                answer = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
            gateway.flush()
        assert [c.call_id for c in store.query_llm_calls(rollout_id=rollout_id)] == [answer.id]
    finally:
        store.close()


def test_a_header_naming_another_rollout_than_the_path_is_a_403_whoever_sends_it(tmp_path):
    # was: with its own rollout in the path, the X-Agl-Rollout-Id header was ignored (the security page says 403)
    with gateway_target(tmp_path) as (target, gateway):
        key, admin = target.credentials["key"], target.credentials["admin"]
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

        def call(path: str, credential: str, named: str | None, **extra) -> httpx.Response:
            headers = {"Authorization": f"Bearer {credential}"} | ({"X-Agl-Rollout-Id": named} if named else {})
            return target.client.post(path, headers=headers, **extra)

        refused = call("/rollouts/ro-gw/v1/chat/completions", key, "ro-other", json=chat)
        assert refused.status_code == 403, refused.text
        assert "'ro-other'" in refused.json()["error"]["message"] and "'ro-gw'" in refused.json()["error"]["message"]
        by_admin = target.client.get(
            "/rollouts/ro-gw/v1/models", headers={"Authorization": f"Bearer {admin}", "X-Agl-Rollout-Id": "ro-x"}
        )
        assert by_admin.status_code == 403, by_admin.text
        anthropic = target.client.post(
            "/rollouts/ro-gw/v1/messages",
            headers={"x-api-key": key, "X-Agl-Rollout-Id": "ro-other"},
            json={"model": "claude", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert anthropic.status_code == 403 and anthropic.json()["error"]["type"] == "permission_error"

        agreeing = call("/rollouts/ro-gw/v1/chat/completions", key, "ro-gw", json=chat)
        assert agreeing.status_code == 200, agreeing.text
        gateway.flush()
        assert [c.call_id for c in gateway.store.query_llm_calls()] == [agreeing.json()["id"]]  # the 403s: nothing
