"""Drills: two ways a single reward write spoiled training (issue 41), pinned against the real store
server and the real trainer: a reward too large for the learner's float32, and an agent grading its
own rollout as a human."""

from __future__ import annotations

import pytest

from agl.schema import LLMCall, Reward, RolloutStatus
from agl_trainer.config import FromStoreConfig
from agl_trainer.recorded import RecordedRollouts
from tests.reliability.targets import store_target


def _post(target, path: str, body: dict, credential: str) -> object:
    return target.client.post(path, json=body, headers={"Authorization": f"Bearer {target.credentials[credential]}"})


@pytest.mark.parametrize("credential", ["key", "runner", "admin"])
@pytest.mark.parametrize("value", ["1e308", "-3.5e38"])
def test_a_reward_past_float32_is_a_422_naming_the_field_whoever_sends_it(tmp_path, credential, value):
    # was: 1e308 was stored; the learner took it as float32 inf, and its whole group's advantages were NaN
    body = '{"rewards": [{"reward_id": "huge", "rollout_id": "ro-run", "value": ' + value + "}]}"
    with store_target(tmp_path) as (target, store):
        headers = {"Authorization": f"Bearer {target.credentials[credential]}", "Content-Type": "application/json"}
        for path in ("/v1/rewards", "/v1/batch"):
            answer = target.client.post(path, content=body, headers=headers)
            assert answer.status_code == 422, (path, answer.text)
            assert answer.json()["error"]["field"] == "rewards.0.value", answer.text
            assert "float32" in answer.text
        fits = body.replace(value, "3e38")  # the largest float32 is 3.4e38: accepted, and it trains
        assert target.client.post("/v1/rewards", content=fits, headers=headers).status_code == 200
        assert [w.value for w in store.query_rewards(rollout_id="ro-run")] == [3e38]
    with pytest.raises(ValueError, match=r"value\n.*float32"):
        Reward(rollout_id="ro-run", value=float(value))  # `agl rollouts reward` and the dashboard build one


@pytest.mark.parametrize("credential", ["key", "runner"])
@pytest.mark.parametrize("source", ["human", "user"])
def test_an_agent_s_credential_cannot_grade_its_own_rollout_and_from_store_trains_no_self_graded_rollout(
    tmp_path, credential, source
):
    # was: with its rollout key an agent posted {"source": "human", "value": 1.0} and from_store trained on it
    with store_target(tmp_path) as (target, store):
        grade = {"reward_id": "self", "rollout_id": "ro-run", "value": 1.0, "source": source}
        for path in ("/v1/rewards", "/v1/batch"):
            answer = _post(target, path, {"rewards": [grade]}, credential)
            assert answer.status_code == 403, (path, answer.text)
            assert "rewards[0].source" in answer.text and "credential" in answer.text
        own = {"reward_id": "own", "rollout_id": "ro-run", "value": 1.0}  # source "agent": still its to write
        assert _post(target, "/v1/rewards", {"rewards": [own]}, credential).status_code == 200
        store.add_llm_calls([LLMCall(call_id="c1", rollout_id="ro-run", prompt_ids=[1], response_ids=[2])])
        store.finish("ro-run", RolloutStatus.SUCCEEDED)
        recorded = RecordedRollouts(store, FromStoreConfig(modes=["train"], wait_s=0))
        assert recorded.candidates(set()) == []  # graded by nobody but the agent: not graded
        assert _post(target, "/v1/rewards", {"rewards": [dict(grade, reward_id="g")]}, "admin").status_code == 200
        assert [r.rollout_id for r in recorded.candidates(set())] == ["ro-run"]  # a human graded it
        anyone = RecordedRollouts(store, FromStoreConfig(modes=["train"], wait_s=0, graded_by=None))
        assert [r.rollout_id for r in anyone.candidates(set())] == ["ro-run"]


def test_a_production_app_still_writes_its_user_s_feedback_on_a_span_with_the_runner_token(tmp_path):
    with store_target(tmp_path) as (target, store):
        feedback = {"reward_id": "fb", "span_id": "span-1", "name": "feedback", "value": 1.0, "source": "user"}
        assert _post(target, "/v1/rewards", {"rewards": [feedback]}, "runner").status_code == 200
        assert [w.source for w in store.query_rewards(production=True)] == ["user"]
