"""The calculator agent's production arm end to end, with a tiny random model in place of SmolLM2.

Traffic through the real gateway and engine (recorded as production rollouts, with behaviour
log-probs), the feedback as its own process grading half of them, and ``from_store`` training
with verl's decoupled token-IS on what was graded: the whole path in seconds, not learning.
"""

from __future__ import annotations

import json

import pytest

from agl.store.sqlite import SqliteStore
from tests.examples.test_calc_agent import example, tiny_model

__all__ = ["example"]  # the fixture, shared with test_calc_agent.py


@pytest.mark.slow
def test_traffic_feedback_and_training_on_what_was_graded(example, tmp_path):
    from examples.calc_agent import production

    model = tiny_model(example, tmp_path / "tiny")
    argv = ["--seed", "0", "--steps", "2", "--batch-size", "2", "--n-rollouts", "2", "--eval-limit", "2"]
    argv += ["--model", str(model), "--max-response-tokens", "8", "--workdir", str(tmp_path / "prod")]
    assert production.main([*argv, "--graded", "0.5", "--results", str(tmp_path / "results")]) == 0

    with SqliteStore(tmp_path / "prod" / "traffic.db") as traffic:
        recorded = [r for r in traffic.query_rollouts() if r.mode == "production"]
        calls = list(traffic.query_llm_calls(rollout_ids=[r.rollout_id for r in recorded]))
        assert len(recorded) == 8 and not list(traffic.query_rewards())  # ungraded until the feedback
    assert calls and all(c.behaviour_logprobs is not None for c in calls)
    with SqliteStore(tmp_path / "prod" / "calc_agent-production-graded0.5" / "agl.db") as store:
        graded = {w.rollout_id for w in store.query_rewards() if w.source == "user"}
    assert len(graded) == 4  # half, chosen with the seed

    record = json.loads((tmp_path / "results" / "calc_agent-production-graded0.5-seed0.json").read_text())
    assert record["graded"] == 0.5 and record["rollout_correction"] == "decoupled_token_is"
    assert record["after"]["n"] == 2 and record["train_rollouts"] == 8 and record["max_staleness"] == 0
    workdir = tmp_path / "prod" / "calc_agent-production-graded0.5"
    steps = [json.loads(line) for line in (workdir / "metrics.jsonl").open() if '"train"' in line]
    # 4 graded rollouts, 4 a step: one step trained, then none left (ungraded ones are never trained on)
    assert [s["recorded_rollouts"] for s in steps] == [4] and record["steps"] == 1
    state = json.loads((workdir / "trainer_state.json").read_text())
    assert set(state["trained_rollouts"]) == graded
    # the correction ran (the key is there only then), and every recorded call had its behaviour log-probs
    assert steps[0]["offpolicy_without_behaviour"] == 0
