"""Off-policy correction: verl's importance weights and rejection masks, applied by the local learner.

The weights and masks are verl's own (``rollout_corr_helper``); what is tested here is that
agl hands verl the right tensors (rows with signal only), passes the weights to the policy
loss, and chooses a correction only for off-policy batches under ``auto``.
"""

from __future__ import annotations

import pytest
import torch
from verl.trainer.config.algorithm import RolloutCorrectionConfig
from verl.trainer.ppo.core_algos import compute_policy_loss_bypass_mode
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

from agl.errors import ConfigError
from agl.schema import Transition
from agl_trainer.backend import BackendContext
from agl_verl import correction
from agl_verl.dataproto import transitions_to_dataproto
from agl_verl.local import NonFiniteUpdate, actor_config, algo_config
from tests.verl.test_local_backend import digit_ids, make_backend, static_batch, tiny_model

__all__ = ["digit_ids", "tiny_model"]  # fixtures, shared with test_local_backend.py


def hand_built_batch(digit_ids, behaviour_shift: float = 0.0):
    """static_batch's 8 transitions with behaviour log-probs of their own, rows 0-1 without signal."""
    batch = static_batch(digit_ids)
    gen = torch.Generator().manual_seed(0)
    return [
        remade(t, behaviour_logprobs=(-2.3 + behaviour_shift + 0.5 * torch.randn(2, generator=gen)).tolist())
        for t in batch
    ]


class Held:
    """The version the backend's weights are, as a trainer keeps it (what ``BackendContext.version_now`` reads)."""

    version: str | None = None


def holding(tiny_model, tmp_path, **overrides):
    """``make_backend``'s backend and the :class:`Held` version it is told its weights are."""
    held = Held()
    backend = make_backend(tiny_model, tmp_path, context=BackendContext(version_now=lambda: held.version), **overrides)
    return backend, held


def remade(t: Transition, **fields) -> Transition:
    """``t`` with ``fields`` changed, validated (``model_copy`` would not pack the arrays)."""
    return Transition.model_validate({**dict(t), **fields})


def test_weights_and_rejections_are_verls_on_the_rows_with_signal(digit_ids):
    data = transitions_to_dataproto(hand_built_batch(digit_ids), pad_token_id=0)
    assert data.meta_info["rollout_log_probs"] == "behaviour"
    gen = torch.Generator().manual_seed(1)
    data.batch["old_log_probs"] = -2.3 + 0.5 * torch.randn(data.batch["responses"].shape, generator=gen)
    rows = torch.arange(2, 8)  # rows 0 and 1 have no signal: their old log-probs are never computed
    config = RolloutCorrectionConfig.decoupled_token_icepop()  # weights outside [lower, upper] are zeroed
    mask_before = data.batch["response_mask"].clone()
    metrics = correction.apply(data, config, rows)
    proto, kept, expected = compute_rollout_correction_and_rejection_mask(
        old_log_prob=data.batch["old_log_probs"][rows],
        rollout_log_prob=data.batch["rollout_log_probs"][rows],
        response_mask=mask_before[rows],
        rollout_is=config.rollout_is,
        rollout_is_threshold=config.rollout_is_threshold,
        rollout_rs=config.rollout_rs,
        rollout_rs_threshold=config.rollout_rs_threshold,
    )
    assert torch.equal(data.batch["rollout_is_weights"][rows], proto.batch["rollout_is_weights"])
    assert torch.equal(data.batch["rollout_is_weights"][:2], torch.ones(2, 2))
    assert torch.equal(data.batch["response_mask"][rows], kept.to(mask_before.dtype))
    assert torch.equal(data.batch["response_mask"][:2], mask_before[:2])
    for key in ("rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_max", "rollout_corr/kl"):
        assert metrics[key] == pytest.approx(expected[key])
    assert "rollout_corr/rollout_is_eff_sample_size" in metrics


def test_rejection_sampling_drops_tokens_and_says_how_many(digit_ids):
    data = transitions_to_dataproto(hand_built_batch(digit_ids, behaviour_shift=3.0), pad_token_id=0)
    data.batch["old_log_probs"] = torch.full(data.batch["responses"].shape, -2.3)
    config = RolloutCorrectionConfig.decoupled_geo_rs()  # every sequence is far outside ±0.1%: rejected
    metrics = correction.apply(data, config, torch.arange(8))
    assert data.batch["response_mask"].sum() == 0
    assert metrics["rollout_corr/rejected_fraction"] == 1.0


def test_zeroed_importance_weights_leave_the_weights_as_they_were(tiny_model, digit_ids, tmp_path):
    backend, held = holding(tiny_model, tmp_path, rollout_correction="decoupled_token_icepop")
    held.version = "v2"
    before = [p.detach().clone() for p in backend.learner.model.parameters()]
    far = [t.model_copy(update={"model_version": "v1"}) for t in hand_built_batch(digit_ids, behaviour_shift=5.0)]
    metrics = backend.train_step(far, step=1)  # pi_old / pi_behaviour is tiny: icepop zeroes every weight
    assert metrics["rollout_corr/rollout_is_max"] == 0.0 and metrics["grad_norm"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, backend.learner.model.parameters(), strict=True))
    plain = make_backend(tiny_model, tmp_path, rollout_correction="none")
    assert plain.train_step(far, step=1)["grad_norm"] > 0  # the same batch, uncorrected, moves them


def test_behaviour_log_probs_of_the_learner_itself_give_weights_of_one(tiny_model, digit_ids, tmp_path):
    backend, held = holding(tiny_model, tmp_path)  # rollout_correction: auto
    own = backend.learner.log_probs(transitions_to_dataproto(static_batch(digit_ids), pad_token_id=0))
    batch = [
        remade(t, behaviour_logprobs=own[i, :2].tolist(), model_version="base")
        for i, t in enumerate(static_batch(digit_ids))
    ]
    held.version = "step-3"  # the batch ran on other weights: decoupled token-IS
    metrics = backend.train_step(batch, step=4)
    assert metrics["offpolicy_transitions"] == 8
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["rollout_corr/kl"] == pytest.approx(0.0, abs=1e-4)


def test_auto_corrects_only_off_policy_batches_and_counts_what_it_cannot(tiny_model, digit_ids, tmp_path):
    backend, held = holding(tiny_model, tmp_path)
    held.version = "base"
    on_policy = [t.model_copy(update={"model_version": "base"}) for t in hand_built_batch(digit_ids)]
    metrics = backend.train_step(on_policy, step=1)
    assert metrics["offpolicy_transitions"] == 0 and not any(k.startswith("rollout_corr/") for k in metrics)
    held.version = "step-1"
    mixed = on_policy[:4] + [remade(t, behaviour_logprobs=None) for t in on_policy[4:]]
    metrics = backend.train_step(mixed, step=2)
    assert metrics["offpolicy_transitions"] == 8 and metrics["offpolicy_without_behaviour"] == 4
    assert metrics["transitions"] == 8 and "rollout_corr/rollout_is_mean" in metrics


def test_unknown_presets_and_bypass_with_another_loss_are_config_errors(tiny_model, tmp_path):
    with pytest.raises(ConfigError, match="rollout_correction: unknown rollout correction preset 'tis'"):
        make_backend(tiny_model, tmp_path, rollout_correction="tis")
    with pytest.raises(ConfigError, match="replaces policy_loss 'gspo'"):  # verl's bypass loss would ignore it
        make_backend(tiny_model, tmp_path, rollout_correction="bypass_ppo_clip", policy_loss="gspo")


@pytest.mark.parametrize("preset", ["bypass_ppo_clip_geo_rs", "bypass_ppo_clip_k3_rs", "bypass_pg_is"])
def test_bypass_presets_weigh_and_reject_as_verls_bypass_loss_on_the_same_tensors(
    tiny_model, digit_ids, tmp_path, preset
):
    backend, held = holding(tiny_model, tmp_path, rollout_correction=preset)
    held.version = "v2"
    far = [t.model_copy(update={"model_version": "v1"}) for t in hand_built_batch(digit_ids, behaviour_shift=3.0)]
    data = transitions_to_dataproto(far, pad_token_id=0)
    learner = backend.learner
    log_prob = learner.log_probs(data)  # the weights before the step: the loss's first forward pass
    data = learner._advantages(data, n_groups=2)
    mask = data.batch["response_mask"]
    config = actor_config(backend.settings, rollout_n=4, correction=getattr(RolloutCorrectionConfig, preset)())
    config.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=len(data))
    advantages = data.batch["advantages"] * data.batch["weights"].unsqueeze(1)
    loss, expected = compute_policy_loss_bypass_mode(
        old_log_prob=data.batch["rollout_log_probs"],
        log_prob=log_prob,
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode=backend.settings.loss_agg_mode,
        config=config,
    )
    metrics = backend.train_step(far, step=1)
    corr = {k: v for k, v in expected.items() if k.startswith("rollout_corr/")}
    assert corr and all(metrics[k] == pytest.approx(float(v), rel=1e-4, abs=1e-6) for k, v in corr.items())
    assert metrics["pg_loss"] == pytest.approx(loss.item(), rel=1e-4, abs=1e-7)
    if preset != "bypass_pg_is":  # every sequence is far outside the band: verl rejects them all
        assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 1.0 and metrics["grad_norm"] == 0.0


def test_decoupled_rejection_comes_before_the_advantages_as_in_verl(tiny_model, digit_ids, tmp_path):
    backend, held = holding(
        tiny_model, tmp_path, rollout_correction="decoupled_geo_rs", adv_estimator="reinforce_plus_plus"
    )
    learner = backend.learner
    own = learner.log_probs(transitions_to_dataproto(static_batch(digit_ids), pad_token_id=0))
    # rows 0-3 were sampled by the learner itself (kept), rows 4-7 far from it (rejected)
    batch = [
        remade(t, behaviour_logprobs=(own[i, :2] + (3.0 if i >= 4 else 0.0)).tolist(), model_version="v1")
        for i, t in enumerate(static_batch(digit_ids))
    ]
    held.version = "v2"
    metrics = backend.train_step(batch, step=1)
    assert metrics["rollout_corr/rejected_fraction"] == pytest.approx(0.5)
    # verl's order: the rejection mask, then reinforce++'s whitening over what it kept
    data = transitions_to_dataproto(batch, pad_token_id=0)
    data.batch["response_mask"][4:] = 0
    expected = compute_advantage(data, adv_estimator="reinforce_plus_plus", config=algo_config(backend.settings))
    kept = expected.batch["advantages"][data.batch["response_mask"].bool()]
    assert metrics["advantages/mean"] == pytest.approx(kept.mean().item(), abs=1e-5)
    assert metrics["advantages/std"] == pytest.approx(kept.std().item(), rel=1e-4)


def test_a_call_sampled_at_other_settings_is_off_policy_under_auto(tiny_model, digit_ids, tmp_path):
    backend, held = holding(tiny_model, tmp_path)  # temperature 1; rollout_correction: auto
    held.version = "base"
    batch = [remade(t, model_version="base", sampling={"temperature": 1.0}) for t in hand_built_batch(digit_ids)]
    metrics = backend.train_step(batch, step=1)
    assert metrics["offpolicy_transitions"] == 0 and "rollout_corr/rollout_is_mean" not in metrics
    hotter = [remade(t, sampling={"temperature": 0.7}) for t in batch[:3]]
    nucleus = [remade(t, sampling={"top_p": 0.9}) for t in batch[3:5]]
    unread = [remade(t, sampling=None) for t in batch[5:6]]
    without = [remade(t, sampling={"top_k": 20}, behaviour_logprobs=None) for t in batch[6:]]
    metrics = backend.train_step(hotter + nucleus + unread + without, step=2)
    assert metrics["offpolicy_sampling"] == 7 and metrics["offpolicy_transitions"] == 7
    assert metrics["offpolicy_without_behaviour"] == 2  # left out: a correction needs them
    assert "rollout_corr/rollout_is_mean" in metrics  # decoupled token-IS on the behaviour log-probs


def test_a_reward_that_overflows_float32_stops_the_update_and_names_its_rollout(tiny_model, digit_ids, tmp_path):
    backend = make_backend(tiny_model, tmp_path)
    before = [p.detach().clone() for p in backend.learner.model.parameters()]
    batch = static_batch(digit_ids)
    batch[5] = remade(batch[5], reward=1e308)  # float32 inf in the batch: its group's advantages are NaN
    with pytest.raises(NonFiniteUpdate, match=r"rollout 'r5' \(reward inf\).*weights are as they were"):
        backend.train_step(batch, step=1)
    assert all(torch.equal(a, b) for a, b in zip(before, backend.learner.model.parameters(), strict=True))


def test_distributed_mode_gets_the_preset_as_verl_overrides():
    from agl_verl.distributed import correction_overrides

    assert correction_overrides("auto") == [] and correction_overrides("none") == []
    overrides = correction_overrides("decoupled_seq_is")
    assert "algorithm.rollout_correction.rollout_is=sequence" in overrides
    assert "algorithm.rollout_correction.bypass_mode=False" in overrides
