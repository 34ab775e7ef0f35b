"""An Anthropic-SDK agent program written by someone else, unmodified, through ``agl run``.

The program is the quickstart of the SDK's own README, read at test time from the installed
``anthropic`` distribution's metadata (nothing of it is carried in this repository): it
builds ``Anthropic(api_key=os.environ.get("ANTHROPIC_API_KEY"))``, asks a Claude model
"Hello, Claude" and prints the answer's content. ``agl run`` hands it
``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` (this rollout's route and key); the
policy under training (here the fake engine) serves whatever model it names.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
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
AGL = [sys.executable, "-c", "import sys; from agl_trainer.cli import main; sys.exit(main(sys.argv[1:]))"]
TOKEN = "example-token-0123456789abcdef"


def sdk_readme_quickstart() -> str:
    """The first Python example of the installed SDK's README (its package description)."""
    readme = importlib.metadata.metadata("anthropic").get_payload()
    [first, *_] = re.findall(r"```python\n(.*?)```", readme, re.S)
    return first


@pytest.mark.slow  # a few seconds: two Python processes start
def test_the_sdks_readme_quickstart_runs_unmodified_through_agl_run(tmp_path):
    program = tmp_path / "quickstart.py"
    program.write_text(sdk_readme_quickstart())
    assert "client.messages.create(" in program.read_text()
    db = tmp_path / "agl.db"
    store = SqliteStore(db)
    try:
        with (
            FakeEngine() as engine,
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
                [*AGL, "run", "--store", f"sqlite:///{db}", "--gateway", gw.url, "--", sys.executable, str(program)],
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
            assert "TextBlock(" in proc.stdout  # it printed the answer's content blocks
            sent = list(engine.requests)

        assert rollout.status == RolloutStatus.SUCCEEDED
        calls = sorted(store.query_llm_calls(rollout_id=rid), key=lambda c: c.seq)
        [asked] = re.findall(r'model="([^"]+)"', program.read_text())
        assert [c.endpoint for c in calls] == ["messages"]
        assert [c.requested_model for c in calls] == [asked] and [c.model_version for c in calls] == ["v3"]
        assert calls[0].response["stop_reason"] == "end_turn" and calls[0].response["id"].startswith("msg_")
        for call, req in zip(calls, sent, strict=True):
            assert list(call.prompt_ids) == list(render_chat(req["messages"], req.get("tools")).encode())
        assert [c.status for c in check_continuity(calls)] == ["new"]
        ts, report = build_transitions(store, [rollout], TransitionConfig(missing_reward=0.0))
        assert report.gateway_only == 1 and [t.call_id for t in ts] == [c.call_id for c in calls]
        assert all(t.token_source == "engine" and len(t.response_logprobs) == len(t.response_ids) for t in ts)
    finally:
        store.close()
