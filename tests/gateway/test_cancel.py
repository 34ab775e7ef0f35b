"""A client that goes away stops its generation: the gateway closes its engine request
(the engine frees the slot), records the call as aborted, and transitions leave it out."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from agl.schema import RolloutStatus
from agl_trainer.transitions import TransitionConfig, build_transitions
from tests.conftest import wait_until
from tests.gateway.conftest import calls_of

LONG = [{"role": "user", "content": "x" * 400}]  # a 100-chunk answer from the fake engine


def _wait_for_abort(engine, since: float) -> float:
    """Seconds from ``since`` until the engine saw its request cancelled."""
    wait_until(lambda: engine.aborted_at, "the engine sees its request cancelled")
    assert engine.aborted == 1, "the engine request was not cancelled"
    return engine.aborted_at[0] - since


def _idle(gateway, engine) -> None:
    replica = gateway.router.replicas[0]
    wait_until(
        lambda: engine.in_flight == 0 and replica.in_flight == 0,
        "neither the engine nor the gateway has a request in flight",
    )


@pytest.mark.parametrize("endpoint", ["chat/completions", "responses"])
def test_client_gone_mid_stream_cancels_the_engine_request(gateway, engine, store, rollout, key, endpoint):
    headers = {"Authorization": f"Bearer {key}"}
    engine.chunk_delay_s = 0.05  # about 5 s for the whole answer
    url = f"{gateway.rollout_base_url(rollout)}/{endpoint}"
    body = {"model": "m", "stream": True, **({"messages": LONG} if endpoint == "chat/completions" else {"input": LONG})}
    with httpx.Client(timeout=10) as http, http.stream("POST", url, json=body, headers=headers) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    gone = time.monotonic()  # the client's connection is closed here
    assert _wait_for_abort(engine, gone) < 1.0
    _idle(gateway, engine)
    [call] = calls_of(gateway, store, rollout)
    assert call.aborted and call.response["aborted"] is True and len(call.response_ids) == 0
    assert call.endpoint == endpoint.replace("/", ".") and call.model_version == "v1"


@pytest.mark.parametrize("endpoint", ["chat/completions", "responses"])
def test_client_gone_during_a_plain_request_cancels_the_engine_request(gateway, engine, store, rollout, key, endpoint):
    headers = {"Authorization": f"Bearer {key}"}
    engine.delay_s = 5.0
    url = f"{gateway.rollout_base_url(rollout)}/{endpoint}"
    body = {"model": "m", "messages": LONG} if endpoint == "chat/completions" else {"model": "m", "input": "hi"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, json=body, headers=headers, timeout=httpx.Timeout(10, read=0.5))
    gone = time.monotonic()
    assert _wait_for_abort(engine, gone) < 1.0
    _idle(gateway, engine)
    [call] = calls_of(gateway, store, rollout)
    assert call.aborted and call.endpoint == endpoint.replace("/", ".") and len(call.response_ids) == 0


def test_transitions_leave_the_aborted_call_out_and_count_it(gateway, engine, store, rollout, key):
    headers = {"Authorization": f"Bearer {key}"}
    url = gateway.rollout_base_url(rollout) + "/chat/completions"
    assert httpx.post(url, json={"model": "m", "messages": LONG}, headers=headers, timeout=10).status_code == 200
    engine.delay_s = 5.0
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, json={"model": "m", "messages": LONG}, headers=headers, timeout=httpx.Timeout(10, read=0.5))
    _wait_for_abort(engine, 0.0)
    _idle(gateway, engine)
    assert [c.aborted for c in calls_of(gateway, store, rollout)] == [False, True]
    finished = store.finish(rollout, RolloutStatus.SUCCEEDED)
    transitions, report = build_transitions(store, [finished], TransitionConfig(missing_reward=1.0))
    assert len(transitions) == 1 and report.aborted_calls == 1 and report.transitions == 1


def test_agl_run_killing_a_timed_out_agent_cancels_its_call(gateway, engine, store, tmp_path):
    """``agl run --timeout`` kills the program; its connection closes with it, and the gateway
    cancels the engine request it was waiting on instead of letting it run to the end."""
    engine.delay_s = 60.0
    script = tmp_path / "slow_agent.py"
    script.write_text(
        "from openai import OpenAI\n"
        "OpenAI(max_retries=0, timeout=120).chat.completions.create(\n"
        "    model='m', messages=[{'role': 'user', 'content': 'take your time'}])\n"
    )
    cli = "import sys; from agl_trainer.cli import main; sys.exit(main(sys.argv[1:]))"
    store_url = f"sqlite:///{store.path}"
    # 15 s: time for the child to import openai and send its request on a busy 2-core host (at a
    # load average of 10, 6 s was not)
    args = ["run", "--store", store_url, "--gateway", gateway.url, "--timeout", "15"]
    env = dict(os.environ, AGL_ROLLOUT_KEY_SECRET=gateway.keys.secret)  # agl run makes the rollout's key with it
    proc = subprocess.run(
        [sys.executable, "-c", cli, *args, "--", sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    killed = time.monotonic()
    assert proc.returncode != 0, proc.stderr
    assert len(engine.requests) == 1, f"the child's request never reached the engine: {proc.stderr}"
    assert _wait_for_abort(engine, killed) < 1.0, proc.stderr  # not the 60 s the engine would have taken
    _idle(gateway, engine)
    [rollout] = [r for r in store.query_rollouts() if r.mode == "production"]
    assert rollout.status == RolloutStatus.TIMED_OUT
    [call] = calls_of(gateway, store, rollout.rollout_id)
    assert call.aborted
