"""What reaches a learner: every task group with a baseline, and each policy's weights per rollout
counted among its own calls (issue 41, items 3 and 5). Real transitions and verl's own GRPO."""

from __future__ import annotations

import pytest
import torch

from agl.schema import Segment, Transition
from agl_trainer.baselines import STEP_GROUP, with_baselines
from agl_trainer.policy_backends import PolicySet
from agl_trainer.policy_config import PolicyConfig
from agl_trainer.transitions.config import BuildReport


def made(rollout: str, task: str, reward: float = 1.0, **fields) -> Transition:
    return Transition(**{"rollout_id": rollout, "task_id": task, "step": 0, "prompt_ids": [1], "response_ids": [2],
                         "reward": reward, **fields})  # fmt: skip


def grpo_advantages(transitions: list[Transition]) -> list[float]:
    """verl's GRPO advantage of each transition, grouped by task as the local learner groups them."""
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from agl_verl.dataproto import transitions_to_dataproto

    data = compute_advantage(transitions_to_dataproto(transitions, pad_token_id=0), adv_estimator="grpo")
    return data.batch["advantages"][:, 0].tolist()


def test_a_lone_singleton_of_recorded_traffic_is_left_out_instead_of_training_on_its_raw_reward():
    # was: the step's one singleton formed a group of one, and GRPO gave it its raw reward (0.99999)
    step = [made("a1", "A", 1.0), made("a2", "A", 0.0), made("b1", "B", 1.0)]
    report = BuildReport()
    kept = with_baselines(step, report, fold=True, leave_out=True)
    assert [t.rollout_id for t in kept] == ["a1", "a2"] and report.singletons_left_out == 1
    assert grpo_advantages(kept) == pytest.approx([0.7071, -0.7071], abs=1e-3)
    assert grpo_advantages([made("b1", STEP_GROUP, 1.0)]) == pytest.approx([1.0], abs=1e-4)  # what it was


def test_two_or_more_singletons_share_one_group_and_are_counted():
    step = [made("a1", "A", 1.0), made("a1", "A", 1.0, step=1), made("b1", "B", 0.0), made("c1", "C"), made("c2", "C")]
    report = BuildReport()
    kept = with_baselines(step, report, fold=True, leave_out=True)
    assert [t.task_id for t in kept] == [STEP_GROUP, STEP_GROUP, STEP_GROUP, "C", "C"]
    assert report.singletons_folded == 2 and report.singletons_left_out == 0
    assert report.as_metrics()["singletons_folded"] == 2.0


def test_a_generated_group_of_one_is_left_out_only_for_a_group_baseline_estimator():
    step = [made("a1", "A"), made("a2", "A"), made("b1", "B")]  # b's other rollouts failed
    report = BuildReport()
    assert [t.rollout_id for t in with_baselines(step, report, fold=False, leave_out=True)] == ["a1", "a2"]
    assert report.singletons_left_out == 1
    kept = with_baselines(step, BuildReport(), fold=False, leave_out=False)  # reinforce++, prompt optimization
    assert [t.rollout_id for t in kept] == ["a1", "a2", "b1"]


def test_verl_backend_says_which_estimators_take_group_baselines():
    from agl_verl.backend import VerlBackend

    assert VerlBackend(model_path="m", adv_estimator="grpo").group_baseline
    assert VerlBackend(model_path="m", adv_estimator="rloo").group_baseline
    assert not VerlBackend(model_path="m", adv_estimator="reinforce_plus_plus").group_baseline


def test_a_policy_s_weight_per_rollout_counts_only_the_calls_it_learns_from():
    # was: 1 / (every call kept in the rollout), the frozen checker's and the filtered-out agents' too
    policies = PolicySet(
        [
            PolicyConfig(name="writer", models=["sql-writer"], agents=["writer"]),
            PolicyConfig(name="checker", models=["sql-checker"], train=False),
        ]
    )
    rollout = [made("r1", "t", policy="writer", agent="writer", weight=1 / 6) for _ in range(2)]
    rollout += [made("r1", "t", policy="writer", agent="rewriter", weight=1 / 6)]
    rollout += [made("r1", "t", policy="checker", agent="checker", weight=1 / 6) for _ in range(3)]
    other = [made("r2", "t", policy="writer", agent="writer", weight=1.0)]
    mine = policies.split(rollout + other, per_rollout=True)
    assert [(t.rollout_id, t.weight) for t in mine["writer"]] == [("r1", 0.5), ("r1", 0.5), ("r2", 1.0)]
    assert set(mine) == {"writer"}
    unweighted = policies.split(rollout, per_rollout=False)  # normalize: none keeps the builder's
    assert [t.weight for t in unweighted["writer"]] == [1 / 6, 1 / 6]


def test_a_merged_row_counts_its_calls_in_its_rollout_s_weight():
    policies = PolicySet([])
    merged = made("r1", "t", weight=1 / 3)
    merged = Transition.model_validate(
        {**dict(merged), "response_ids": [2, 3, 4], "segments": [Segment(start=0, end=1, step=0, reward=1.0),
                                                                 Segment(start=2, end=3, step=1, reward=1.0)]}
    )  # fmt: skip
    (ts,) = policies.split([merged, made("r1", "t", step=2, weight=1 / 3)], per_rollout=True).values()
    assert [t.weight for t in ts] == pytest.approx([1 / 3, 1 / 3])  # three calls in the rollout, one weight each
    assert torch.tensor([t.weight for t in ts]).sum().item() == pytest.approx(2 / 3)
