"""An Anthropic-SDK agent program written by someone else, unmodified, through ``agl run``.

The program is the SDK's own ``examples/tools.py`` (see anthropic_examples/README.md):
it asks ``claude-sonnet-5`` about the weather with a ``get_weather`` tool, asserts
the answer is a ``tool_use``, sends a ``tool_result`` back and prints the answer.
``agl run`` hands it ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` (this
rollout's route and key); the policy under training (here the fake engine, with
``eager_tools`` so it calls the tool it is offered) serves whatever model it names.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agl.schema import RolloutStatus
from agl.store.sqlite import SqliteStore
from agl_trainer.gateway import Gateway, check_continuity
from agl_trainer.transitions import TransitionConfig, build_transitions
from tests.fake_engine import FakeEngine, render_chat

REPO = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).parent / "anthropic_examples" / "tools.py"
AGL = [sys.executable, "-c", "import sys; from agl_trainer.cli import main; sys.exit(main(sys.argv[1:]))"]
TOKEN = "example-token-0123456789abcdef"


@pytest.mark.slow  # a few seconds: two Python processes start
def test_the_sdks_tool_use_example_runs_unmodified_through_agl_run(tmp_path):
    db = tmp_path / "agl.db"
    store = SqliteStore(db)
    try:
        with (
            FakeEngine(eager_tools=True) as engine,
            Gateway(store, [engine.url], token=TOKEN, model_version="v3") as gw,
        ):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("AGL_", "ANTHROPIC_", "OPENAI_"))}
            env |= {
                "ANTHROPIC_AUTH_TOKEN": "the-callers-own-token",  # would be sent beside the key: left out
                "ANTHROPIC_BASE_URL": "https://api.anthropic.invalid",  # replaced by the rollout's route
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "core" / "src"), os.environ.get("PYTHONPATH")])),
                "AGL_ROLLOUT_KEY_SECRET": gw.keys.secret,
                "AGL_GATEWAY_TOKEN": TOKEN,
            }
            proc = subprocess.run(
                [*AGL, "run", "--store", f"sqlite:///{db}", "--gateway", gw.url, "--", sys.executable, str(PROGRAM)],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            gw.flush()
            [rollout] = store.query_rollouts()
            rid = rollout.rollout_id
            assert f"ANTHROPIC_BASE_URL=ANTHROPIC_API_URL={gw.url}/rollouts/{rid}," in proc.stderr
            assert "the-callers-own-token" not in proc.stderr + proc.stdout
            assert "Initial response" in proc.stdout and '"type": "tool_use"' in proc.stdout
            assert "result: The weather is 73f" in proc.stdout  # the answer to its tool_result
            sent = list(engine.requests)

        assert rollout.status == RolloutStatus.SUCCEEDED
        calls = sorted(store.query_llm_calls(rollout_id=rid), key=lambda c: c.seq)
        assert [c.endpoint for c in calls] == ["messages", "messages"]
        assert {c.requested_model for c in calls} == {"claude-sonnet-5"} and {c.model_version for c in calls} == {"v3"}
        assert calls[0].response["stop_reason"] == "tool_use"
        assert calls[1].request["messages"][2]["content"][0]["type"] == "tool_result"
        for call, req in zip(calls, sent, strict=True):
            assert list(call.prompt_ids) == list(render_chat(req["messages"], req.get("tools")).encode())
        assert [c.status for c in check_continuity(calls)] == ["new", "extends"]
        ts, report = build_transitions(store, [rollout], TransitionConfig(missing_reward=0.0))
        assert report.gateway_only == 2 and [t.call_id for t in ts] == [c.call_id for c in calls]
        assert all(t.token_source == "engine" and len(t.response_logprobs) == len(t.response_ids) for t in ts)
    finally:
        store.close()
