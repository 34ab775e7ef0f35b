"""Off-policy correction with verl's own rollout correction (``rollout_corr_helper``).

A transition is off-policy when the weights that sampled it are not the weights being
trained: its rollout ran ahead of an update (asynchronous training), or it was recorded
outside this run (``agl train --from-store``). The importance weight of each token is
``pi_old / pi_behaviour``: ``pi_old`` from the learner's forward pass at its current weights
(verl's *decoupled* mode) or ``pi_behaviour`` itself (*bypass* mode, where PPO's clipped
ratio does the correcting; verl's ``bypass_mode`` loss weights and rejects in each micro-batch,
see :meth:`agl_verl.local.LocalLearner._correct`), ``pi_behaviour`` from the engine's behaviour log-probs (what
the tokens were sampled with, after temperature and top-p). verl computes the truncated
weights, the rejection mask and the off-policy metrics
(:func:`verl.trainer.ppo.rollout_corr_helper.compute_rollout_correction_and_rejection_mask`);
its policy losses take the weights as ``rollout_is_weights``. This module only chooses the
preset and keeps the rows without signal out of the statistics.

The setting ``rollout_correction`` names one of verl's presets
(:class:`verl.trainer.config.algorithm.RolloutCorrectionConfig`'s class methods, such as
``decoupled_token_is``, ``decoupled_seq_is``, ``decoupled_token_icepop``,
``bypass_ppo_clip``), ``none``, or ``auto``: ``decoupled_token_is`` for a batch with any
off-policy transition, none for a batch that is all on-policy (today's loop, unchanged).
"""

from __future__ import annotations

import torch
from verl import DataProto
from verl.trainer.config.algorithm import RolloutCorrectionConfig
from verl.trainer.ppo.rollout_corr_helper import (
    compute_offpolicy_metrics,
    compute_rollout_correction_and_rejection_mask,
)

AUTO_PRESET = "decoupled_token_is"
"""What ``rollout_correction: auto`` applies to a batch with off-policy transitions (agent-lightning's
choice too: token-level truncated importance sampling, threshold 2)."""


def preset_names() -> list[str]:
    """verl's named presets (``RolloutCorrectionConfig``'s class methods)."""
    return sorted(
        name
        for name, value in vars(RolloutCorrectionConfig).items()
        if isinstance(value, classmethod) and not name.startswith("_")
    )


def preset(name: str) -> RolloutCorrectionConfig | None:
    """The config a ``rollout_correction`` setting names (None for ``none`` and ``disabled``)."""
    if name in ("none", "disabled"):
        return None
    return getattr(RolloutCorrectionConfig, name)()


def choose(setting: str, off_policy: bool) -> RolloutCorrectionConfig | None:
    """The correction for one batch: ``setting``'s preset, or for ``auto`` the default one only
    when ``off_policy``."""
    if setting == "auto":
        return preset(AUTO_PRESET) if off_policy else None
    return preset(setting)


def apply(data: DataProto, config: RolloutCorrectionConfig, rows: torch.Tensor) -> dict[str, float]:
    """Add verl's ``rollout_is_weights`` to ``data`` and apply its rejection mask, for ``rows``.

    ``data`` holds ``old_log_probs`` (the learner's, for ``rows``), ``rollout_log_probs``
    (behaviour) and ``response_mask``; the other rows (no signal: they get no forward pass)
    keep weight 1 and their mask. Returns verl's metrics (``rollout_corr/…``) over ``rows``, and
    ``rollout_corr/rejected_fraction``: the share of their response tokens the mask dropped.
    """
    batch = data.batch
    mask = batch["response_mask"]
    weights = torch.ones_like(batch["old_log_probs"])
    if len(rows) == 0 or not mask[rows].any():
        batch["rollout_is_weights"] = weights
        return {}
    old, behaviour = batch["old_log_probs"][rows], batch["rollout_log_probs"][rows]
    try:
        proto, kept, metrics = compute_rollout_correction_and_rejection_mask(
            old_log_prob=old,
            rollout_log_prob=behaviour,
            response_mask=mask[rows],
            rollout_is=config.rollout_is,
            rollout_is_threshold=config.rollout_is_threshold,
            rollout_is_batch_normalize=config.rollout_is_batch_normalize,
            rollout_rs=config.rollout_rs,
            rollout_rs_threshold=config.rollout_rs_threshold,
        )
    except ZeroDivisionError:
        # verl 0.9.1's effective sample size divides by the weights' mean square: IcePop zeroed
        # every weight. Then every weight is 0, and the update learns nothing from these rows.
        proto, kept = None, mask[rows]
        weights[rows] = 0.0
        metrics = {f"rollout_corr/{k}": v for k, v in compute_offpolicy_metrics(old, behaviour, mask[rows]).items()}
        metrics.update({f"rollout_corr/rollout_is_{k}": 0.0 for k in ("mean", "max", "eff_sample_size")})
    if proto is not None:
        weights[rows] = proto.batch["rollout_is_weights"].to(weights.dtype)
    before = mask[rows].sum().item()
    new_mask = mask.clone()
    new_mask[rows] = kept.to(mask.dtype)
    batch["response_mask"] = new_mask
    batch["rollout_is_weights"] = weights
    metrics["rollout_corr/rejected_fraction"] = 1.0 - new_mask[rows].sum().item() / before
    return {key: float(value) for key, value in metrics.items()}
