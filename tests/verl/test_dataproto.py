"""Transitions → verl DataProto: padding, masks, where the reward lands, uid grouping."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agl.schema import Transition
from agl_verl.dataproto import TextTransitionError, select_trainable, transitions_to_dataproto

PAD = 0


def _t(task, rollout, step, prompt, response, reward, logprobs=None, weight=1.0, source="engine"):
    return Transition(
        rollout_id=rollout,
        task_id=task,
        step=step,
        prompt_ids=prompt,
        response_ids=response,
        response_logprobs=logprobs,
        reward=reward,
        weight=weight,
        token_source=source,
    )


@pytest.fixture
def batch():
    return [
        _t("task-a", "ro-1", 0, [5, 6, 7], [8, 9], 1.0, [-0.1, -0.2], weight=0.5),
        _t("task-a", "ro-1", 1, [5], [10, 11, 12, 13], 0.25, [-0.3, -0.4, -0.5, -0.6], weight=0.5),
        _t("task-b", "ro-2", 0, [3, 4, 5, 6, 7], [14], -1.0, [-0.7]),
    ]


def test_shapes_and_padding(batch):
    data = transitions_to_dataproto(batch, pad_token_id=PAD)
    b = data.batch
    assert b["prompts"].shape == (3, 5) and b["responses"].shape == (3, 4)
    assert b["input_ids"].shape == b["attention_mask"].shape == b["position_ids"].shape == (3, 9)
    # prompts left-padded, responses right-padded
    assert b["prompts"][0].tolist() == [PAD, PAD, 5, 6, 7]
    assert b["prompts"][1].tolist() == [PAD, PAD, PAD, PAD, 5]
    assert b["responses"][0].tolist() == [8, 9, PAD, PAD]
    assert b["responses"][2].tolist() == [14, PAD, PAD, PAD]
    assert b["input_ids"][0].tolist() == [PAD, PAD, 5, 6, 7, 8, 9, PAD, PAD]
    assert b["attention_mask"][0].tolist() == [0, 0, 1, 1, 1, 1, 1, 0, 0]
    assert b["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    # positions count real tokens only, starting at 0 on the first prompt token
    assert b["position_ids"][0].tolist()[2:7] == [0, 1, 2, 3, 4]
    assert b["position_ids"][1].tolist()[4:9] == [0, 1, 2, 3, 4]
    assert b["input_ids"].dtype == torch.int64


def test_reward_on_last_response_token(batch):
    rewards = transitions_to_dataproto(batch).batch["token_level_rewards"]
    assert rewards.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.25], [-1.0, 0.0, 0.0, 0.0]]
    assert torch.equal(transitions_to_dataproto(batch).batch["token_level_scores"], rewards)


def test_uid_groups_and_non_tensors(batch):
    data = transitions_to_dataproto(batch)
    assert data.non_tensor_batch["uid"].tolist() == ["task-a", "task-a", "task-b"]
    assert data.non_tensor_batch["rollout_id"].tolist() == ["ro-1", "ro-1", "ro-2"]
    assert data.batch["weights"].tolist() == [0.5, 0.5, 1.0]


def test_uid_drives_verl_grpo_groups(batch):
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    data = transitions_to_dataproto(batch)
    adv, _ = compute_grpo_outcome_advantage(
        data.batch["token_level_rewards"], data.batch["response_mask"], data.non_tensor_batch["uid"]
    )
    # task-a: two scores (1.0, 0.25) normalized against each other
    assert adv[0, 0] > 0 and adv[1, 0] < 0
    assert adv[0, 0] == pytest.approx(-adv[1, 0].item(), abs=1e-5)
    # task-b alone: verl keeps a singleton group's raw score (mean 0, std 1)
    assert adv[2, 0].item() == pytest.approx(-1.0)
    assert torch.all(adv[0, 2:] == 0)  # masked padding


def test_engine_logprobs_become_old_log_probs(batch):
    data = transitions_to_dataproto(batch)
    old = data.batch["old_log_probs"]
    assert old.shape == (3, 4)
    np.testing.assert_allclose(old[1].numpy(), [-0.3, -0.4, -0.5, -0.6], rtol=1e-6)
    np.testing.assert_allclose(old[0].numpy(), [-0.1, -0.2, 0.0, 0.0], rtol=1e-6)
    assert torch.equal(data.batch["rollout_log_probs"], old)


def test_missing_logprobs_leave_them_out(batch):
    batch.append(_t("task-b", "ro-3", 0, [1], [2], 0.0, None))
    data = transitions_to_dataproto(batch)
    assert "old_log_probs" not in data.batch
    assert "rollout_log_probs" not in data.batch


def test_truncation_keeps_prompt_tail_and_moves_reward():
    t = _t("t", "r", 0, [1, 2, 3, 4, 5], [6, 7, 8], 2.0, [-1.0, -2.0, -3.0])
    data = transitions_to_dataproto([t], max_prompt_length=2, max_response_length=2)
    assert data.batch["prompts"][0].tolist() == [4, 5]
    assert data.batch["responses"][0].tolist() == [6, 7]
    assert data.batch["token_level_rewards"][0].tolist() == [0.0, 2.0]
    assert data.batch["old_log_probs"][0].tolist() == [-1.0, -2.0]
    assert data.meta_info["truncated"] == 1


def test_text_transitions_rejected_or_counted(batch):
    text = _t("task-a", "ro-9", 0, [], [1], 1.0, source="text")
    with pytest.raises(TextTransitionError, match="token_source='text'"):
        transitions_to_dataproto([*batch, text])
    with pytest.raises(TextTransitionError, match="cannot feed a policy-gradient update"):
        select_trainable([*batch, text], on_text="error")
    empty = _t("task-a", "ro-8", 0, [1], [], 1.0)
    selection = select_trainable([*batch, text, empty], on_text="skip")
    assert selection.usable == batch and selection.text_only == 1 and selection.empty_response == 1


def test_bad_input_errors(batch):
    with pytest.raises(ValueError, match="empty"):
        transitions_to_dataproto([])
    with pytest.raises(ValueError, match="has 1 values for 2 response ids"):
        _t("t", "r", 0, [1], [2, 3], 1.0, [-0.5])  # the schema refuses it...
    # ...and the batch builder still checks what was built without validation (model_construct).
    good = _t("t", "r", 0, [1], [2, 3], 1.0, [-0.5, -0.25])
    bad = Transition.model_construct(**{**good.__dict__, "response_logprobs": good.response_logprobs[:1]})
    with pytest.raises(ValueError, match="1 response_logprobs for 2 response_ids"):
        transitions_to_dataproto([bad])
