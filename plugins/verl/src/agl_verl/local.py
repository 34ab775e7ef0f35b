"""The local learner: a transformers model on the CPU or one GPU, updated with verl's algorithms.

Everything algorithmic is verl's: advantages from ``ray_trainer.compute_advantage``
(which dispatches to the ``core_algos`` estimator registry), the policy loss from
``get_policy_loss_fn`` with an ``ActorConfig``, ``agg_loss``, ``kl_penalty``,
``logprobs_from_logits`` and ``entropy_from_logits``. This module only runs the
model, the optimizer and the bookkeeping around them.
"""

from __future__ import annotations

import copy
import inspect
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from verl import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.config.algorithm import RolloutCorrectionConfig
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits, masked_mean
from verl.workers.config import ActorConfig, PolicyLossConfig

from agl.errors import AglError
from agl_verl import correction as rollout_correction
from agl_verl.config import VerlSettings
from agl_verl.quiet import no_progress_bars
from agl_verl.schedule import advance, build_lr_scheduler
from agl_verl.segments import per_call_advantages

BYPASS_LOSS = "bypass_mode"
"""verl's policy loss for the bypass presets: old log-probs are the behaviour's, and the loss computes the
importance weights and rejection mask from the current policy's log-probs in each micro-batch."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

ZERO_FREE_LOSSES = frozenset({"vanilla", "gspo", "gpg"})
"""Policy losses whose every token term is 0 when its advantage is 0, with no statistic taken
across the batch: with these (and no KL or entropy term), a transition whose advantages are
all 0 adds nothing to the gradient, so :meth:`LocalLearner.update` skips its forward pass."""


def columns_in_use(attention_mask: torch.Tensor, response_width: int) -> tuple[int, int]:
    """The span of a batch's columns that some row uses: (first column, response width in use).

    Prompts are left-padded and responses right-padded to the batch's longest, so a
    micro-batch of shorter rows shares columns of padding on both sides; the model need
    not see them. At least one response column is kept.
    """
    used = attention_mask.bool().any(dim=0)
    prompt_width = attention_mask.shape[1] - response_width
    in_prompt = used[:prompt_width].nonzero()
    in_response = used[prompt_width:].nonzero()
    start = int(in_prompt[0]) if len(in_prompt) else prompt_width
    width = int(in_response[-1]) + 1 if len(in_response) else 1
    return start, width


def by_length(data: DataProto) -> torch.Tensor:
    """Row order from fewest tokens to most (stable), so that consecutive micro-batches pad little."""
    return torch.argsort(data.batch["attention_mask"].sum(dim=-1), stable=True)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Every random generator's state, for a checkpoint."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def actor_config(
    settings: VerlSettings, rollout_n: int, correction: RolloutCorrectionConfig | None = None
) -> ActorConfig:
    """verl's ActorConfig for the policy loss functions (they read clip ratios and aggregation from it).

    A bypass ``correction`` makes the loss verl's ``bypass_mode``, with the preset where that loss
    reads it (``policy_loss.rollout_correction``), as verl's ``apply_bypass_mode`` sets it up.
    """
    low = settings.clip_ratio_low if settings.clip_ratio_low is not None else settings.clip_ratio
    high = settings.clip_ratio_high if settings.clip_ratio_high is not None else settings.clip_ratio
    return ActorConfig(
        strategy="fsdp",
        rollout_n=rollout_n,
        ppo_micro_batch_size_per_gpu=settings.micro_batch_size,
        clip_ratio=settings.clip_ratio,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=settings.clip_ratio_c,
        loss_agg_mode=settings.loss_agg_mode,
        entropy_coeff=settings.entropy_coeff,
        ppo_epochs=settings.ppo_epochs,
        use_torch_compile=False,
        policy_loss=PolicyLossConfig(loss_mode=BYPASS_LOSS, rollout_correction=correction)
        if correction is not None and correction.bypass_mode
        else PolicyLossConfig(loss_mode=settings.policy_loss),
    )


def algo_config(settings: VerlSettings) -> AlgoConfig:
    """verl's AlgoConfig for the advantage estimators."""
    return AlgoConfig(
        adv_estimator=settings.adv_estimator,
        gamma=settings.gamma,
        lam=settings.lam,
        norm_adv_by_std_in_grpo=settings.norm_adv_by_std_in_grpo,
        kl_penalty=settings.kl_penalty,
    )


class NonFiniteUpdate(AglError):
    """An update would have stepped on non-finite advantages or loss; the weights were left as they were."""


def describe_rows(data: DataProto, rows: list[int]) -> str:
    """The rollouts of ``rows`` of ``data`` and their rewards, for a message."""
    rewards = data.batch["token_level_scores"].sum(-1)
    ids = data.non_tensor_batch["rollout_id"]
    named = ", ".join(f"rollout {ids[i]!r} (reward {rewards[i].item():g})" for i in rows[:5])
    return named + (f" and {len(rows) - 5} more" if len(rows) > 5 else "")


class LocalLearner:
    """A policy (plus optional frozen reference), its optimizer and learning-rate schedule, in one process.

    ``total_steps``: the run's training steps, which a cosine schedule or a warmup given as a ratio
    needs (None: not known; such a schedule is refused).
    """

    def __init__(self, settings: VerlSettings, total_steps: int | None = None):
        from transformers import AutoModelForCausalLM

        self.settings = settings
        self.device = torch.device(settings.device)
        seed_everything(settings.seed)
        dtype = _DTYPES[settings.dtype]
        model = AutoModelForCausalLM.from_pretrained(settings.model_path, dtype=dtype)
        if settings.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.reference: torch.nn.Module | None = None
        if settings.lora is not None:
            from peft import LoraConfig, get_peft_model

            lora = settings.lora
            model = get_peft_model(
                model,
                LoraConfig(
                    r=lora.r,
                    lora_alpha=lora.alpha,
                    lora_dropout=lora.dropout,
                    target_modules=lora.target_modules,
                    task_type="CAUSAL_LM",
                ),
            )
        elif settings.kl_coef > 0:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False).to(self.device)
        self.model = model.to(self.device)
        self.model.train()
        self.pad_token_id = self._pad_token_id()
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.keeps_logits = "logits_to_keep" in inspect.signature(base.forward).parameters
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.trainable, lr=settings.lr, betas=settings.betas, weight_decay=settings.weight_decay
        )
        self.lr_scheduler = build_lr_scheduler(self.optimizer, settings, total_steps)
        self.policy_loss_fn = core_algos.get_policy_loss_fn(settings.policy_loss)
        self.algo = algo_config(settings)

    def _pad_token_id(self) -> int:
        config = self.model.config
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(config, name, None)
            if isinstance(value, list):
                value = value[0] if value else None
            if value is not None:
                return int(value)
        return 0

    # -- log-probs ---------------------------------------------------------------------------

    def _forward(self, data: DataProto, *, with_entropy: bool, reference: bool = False):
        """Per-token log-probs (and entropies) of the responses under the policy or the reference.

        The model sees only the columns some row of ``data`` uses (see :func:`columns_in_use`)
        and, where it takes ``logits_to_keep``, computes logits for the response positions alone;
        the results are padded back to the batch's response width with zeros, which every
        caller masks out, as it masked the padding's values before.
        """
        batch = data.batch
        r_len = batch["responses"].shape[1]
        start, width = columns_in_use(batch["attention_mask"], r_len)
        end = batch["input_ids"].shape[1] - r_len + width
        responses = batch["responses"][:, :width].to(self.device)
        kwargs = dict(
            input_ids=batch["input_ids"][:, start:end].to(self.device),
            attention_mask=batch["attention_mask"][:, start:end].to(self.device),
            position_ids=batch["position_ids"][..., start:end].to(self.device),
            use_cache=False,
        )
        if self.keeps_logits:
            kwargs["logits_to_keep"] = width + 1  # the LM head over the prompt would be thrown away
        if reference and self.reference is None:
            # LoRA: the reference is the base model, the adapter switched off.
            with self.model.disable_adapter():
                logits = self.model(**kwargs).logits
        else:
            model = self.reference if reference else self.model
            logits = model(**kwargs).logits
        logits = logits[:, -width - 1 : -1, :].float() / self.settings.temperature
        log_probs = logprobs_from_logits(logits, responses)
        entropy = None
        if with_entropy:
            # Entropy is a metric unless it is part of the loss: no graph for it then.
            with torch.set_grad_enabled(torch.is_grad_enabled() and self.settings.entropy_coeff > 0):
                entropy = entropy_from_logits(logits)
        pad = (0, r_len - width)
        return F.pad(log_probs, pad), (F.pad(entropy, pad) if entropy is not None else None)

    @torch.no_grad()
    def log_probs(self, data: DataProto, *, reference: bool = False) -> torch.Tensor:
        """Log-probs of each response token, micro-batched, without gradients."""
        order = by_length(data)
        chunks = []
        for micro in data.select_idxs(order).split(self.settings.micro_batch_size):
            lp, _ = self._forward(micro, with_entropy=False, reference=reference)
            chunks.append(lp.cpu())
        return torch.cat(chunks, dim=0)[torch.argsort(order)]

    # -- one update --------------------------------------------------------------------------

    def update(self, data: DataProto, correction: RolloutCorrectionConfig | None = None) -> dict[str, float]:
        """Advantages, then ``ppo_epochs`` passes of clipped policy-gradient updates over ``data``.

        ``correction``: verl's off-policy correction for a batch sampled by other weights
        (see :mod:`agl_verl.correction`); ``data`` then holds the behaviour log-probs as
        ``rollout_log_probs``.
        """
        s = self.settings
        started = time.perf_counter()
        metrics: dict[str, float] = {}
        n_groups = max(1, len(set(data.non_tensor_batch["uid"].tolist())))
        data = self._advantages(data, n_groups)
        data.batch["has_signal"] = self._has_signal(data)
        mini_size = s.mini_batch_size or len(data)
        generator = torch.Generator().manual_seed(s.seed)
        orders = [
            torch.randperm(len(data), generator=generator) if mini_size < len(data) else None
            for _ in range(s.ppo_epochs)
        ]
        first_mini = (orders[0] if orders[0] is not None else torch.arange(len(data)))[:mini_size]
        if correction is None:
            fold = self._set_old_log_probs(data, first_mini)
        else:
            fold = False
            metrics.update(self._correct(data, correction))
            if not correction.bypass_mode:
                # verl's order: the estimator sees the rejection mask (batch-whitening ones depend on it)
                data = self._advantages(data, n_groups)
                data.batch["has_signal"] &= self._has_signal(data)
        self._check_finite(data)
        mask = data.batch["response_mask"].float()
        adv = data.batch["advantages"]
        valid_adv = adv[mask.bool()]
        metrics["advantages/mean"] = valid_adv.mean().item() if valid_adv.numel() else 0.0
        metrics["advantages/std"] = valid_adv.std().item() if valid_adv.numel() > 1 else 0.0
        # Rollout-level normalization: each transition's loss scaled by its weight.
        # Every registered policy loss is linear in the advantage, so this is that weighting.
        data.batch["advantages"] = adv * data.batch["weights"].unsqueeze(1)
        metrics["transitions_with_signal"] = float(data.batch["has_signal"].sum().item())
        if s.kl_coef > 0:
            data.batch["ref_log_prob"] = self.log_probs(data, reference=True)
        if "rollout_log_probs" in data.batch and s.recompute_old_log_probs and s.temperature == 1.0:
            # recomputed where there is signal, all in the separate pass (old_log_probs="recompute" is the
            # only way here: the engine's are present at temperature 1); at another temperature the two
            # are not comparable
            diff = (data.batch["old_log_probs"] - data.batch["rollout_log_probs"]).abs()
            metrics["engine_logprob_diff"] = masked_mean(diff, mask * data.batch["has_signal"].unsqueeze(1)).item()

        totals: dict[str, list[float]] = {}
        config = actor_config(s, rollout_n=max(1, len(data) // n_groups), correction=correction)
        bypass = correction is not None and correction.bypass_mode
        loss_fn = core_algos.get_policy_loss_fn(BYPASS_LOSS) if bypass else self.policy_loss_fn
        for epoch, order in enumerate(orders):
            shuffled = data.select_idxs(order) if order is not None else data
            for index, mini in enumerate(shuffled.split(mini_size)):
                on_policy = fold and epoch == 0 and index == 0
                for key, value in self._mini_step(mini, config, loss_fn, old_from_forward=on_policy).items():
                    totals.setdefault(key, []).append(value)
        metrics.update({key: float(np.mean(values)) for key, values in totals.items()})
        metrics["lr"] = self.optimizer.param_groups[0]["lr"]
        advance(self.lr_scheduler)  # verl: once per training step, after its last mini-batch, stepped or not

        elapsed = time.perf_counter() - started
        attention = data.batch["attention_mask"]
        metrics["response_length/mean"] = float(data.batch["response_mask"].sum(-1).float().mean().item())
        metrics["tokens"] = float(attention.sum().item())
        # The rate of the forward passes: only transitions with signal get one (0 when none has).
        trained = float(attention[data.batch["has_signal"]].sum().item())
        metrics["tokens_per_s"] = trained * s.ppo_epochs / elapsed if elapsed > 0 else 0.0
        metrics["update_s"] = elapsed
        return metrics

    def _advantages(self, data: DataProto, n_groups: int) -> DataProto:
        """verl's advantages for ``data`` under its response mask (merged rows: call by call, then spread
        over their segments)."""
        s = self.settings
        return per_call_advantages(
            data,
            lambda calls: compute_advantage(
                calls,
                adv_estimator=s.adv_estimator,
                gamma=s.gamma,
                lam=s.lam,
                num_repeat=max(1, len(calls) // n_groups),
                norm_adv_by_std_in_grpo=s.norm_adv_by_std_in_grpo,
                config=self.algo,
            ),
        )

    @staticmethod
    def _check_finite(data: DataProto) -> None:
        """Refuse an update on non-finite advantages (a reward the estimator overflowed, say), before any step."""
        adv = data.batch["advantages"]
        bad = (~torch.isfinite(adv) & data.batch["response_mask"].bool()).any(dim=-1)
        if bad.any():
            raise NonFiniteUpdate(
                f"non-finite advantages from {describe_rows(data, bad.nonzero().flatten().tolist())}; no step "
                "was taken and the weights are as they were (a reward must be finite in float32)"
            )

    def _refuse_non_finite(self, loss: torch.Tensor, micro: DataProto) -> None:
        """Stop before a non-finite loss reaches the gradients: this mini-batch takes no step."""
        if not torch.isfinite(loss):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteUpdate(
                f"non-finite loss ({loss.item()}) on a micro-batch of "
                f"{describe_rows(micro, list(range(len(micro))))}; this mini-batch took no step"
            )

    def _has_signal(self, data: DataProto) -> torch.Tensor:
        """Per transition: whether it can move the gradient (all True unless skipping is exact)."""
        s = self.settings
        rows = torch.ones(len(data), dtype=torch.bool)
        if s.kl_coef > 0 or s.entropy_coeff > 0 or s.policy_loss not in ZERO_FREE_LOSSES:
            return rows
        nonzero = (data.batch["advantages"] != 0) & data.batch["response_mask"].bool()
        return nonzero.any(dim=-1)

    def _correct(self, data: DataProto, correction: RolloutCorrectionConfig) -> dict[str, float]:
        """Old log-probs for an off-policy batch, and verl's importance weights and rejection mask.

        Decoupled presets: the old policy is the learner's weights now (a pass of its own over
        the transitions with signal, as verl's decoupled mode recomputes them), and verl's weights
        and rejection mask are applied here, before the advantages. Bypass presets: the behaviour
        policy is the old one (verl's ``apply_bypass_mode``), and verl's ``bypass_mode`` loss
        weights and rejects in each micro-batch, against the policy as it moves.
        """
        if "rollout_log_probs" not in data.batch:
            raise ValueError("rollout correction needs the engine's behaviour log-probs (rollout_log_probs)")
        if correction.bypass_mode:
            data.batch["old_log_probs"] = data.batch["rollout_log_probs"].clone()
            return {}
        rows = data.batch["has_signal"].nonzero().flatten()
        data.batch["old_log_probs"] = self._log_probs_where_needed(data, rows[:0])
        return rollout_correction.apply(data, correction, rows)

    def _set_old_log_probs(self, data: DataProto, first_mini: torch.Tensor) -> bool:
        """Fill ``data``'s old log-probs where a forward pass must give them; whether the first
        mini-batch (rows ``first_mini``) takes its own from its loss forward pass instead.

        A forward pass gives them when the engine's are missing or ``old_log_probs`` asks for
        one at this temperature. Before the first optimizer step the weights are the rollout's,
        so the first mini-batch's loss forward pass, detached, gives the old policy's: it folds
        unless ``old_log_probs="recompute"`` forces a pass of their own or ``ppo_epochs`` > 1
        (its rows are seen again after a step). verl's actor has no such shortcut (its trainer
        always recomputes old log-probs, or takes the rollout's in bypass mode); the fold gives the
        same values without the extra pass. The other mini-batches' rows get a separate pass here,
        before any step, as their old policy is the rollout's too.
        """
        s = self.settings
        if "old_log_probs" in data.batch and not s.recompute_old_log_probs:
            return False
        fold = s.old_log_probs != "recompute" and s.ppo_epochs == 1
        data.batch["old_log_probs"] = self._log_probs_where_needed(data, first_mini if fold else first_mini[:0])
        return fold

    def _log_probs_where_needed(self, data: DataProto, folded: torch.Tensor) -> torch.Tensor:
        """Log-probs from a pass of their own, in eval mode, of the transitions with signal but for
        the rows ``folded`` (whose loss forward pass gives their own); 0 for the rest, which the
        loss never reads."""
        self.model.eval()
        try:
            old = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
            needed = data.batch["has_signal"].clone()
            needed[folded] = False
            rows = needed.nonzero().flatten()
            if len(rows):
                old[rows] = self.log_probs(data.select_idxs(rows))
            return old
        finally:
            self.model.train()

    def _mini_step(
        self, mini: DataProto, config: ActorConfig, loss_fn: Any, *, old_from_forward: bool = False
    ) -> dict[str, float]:
        """One optimizer step over a mini-batch, accumulating gradients over micro-batches.

        ``old_from_forward``: the weights are still the rollout's, and the PPO ratio's old
        log-probs are the loss forward pass's own, detached (see :meth:`_set_old_log_probs`):
        the ratio is exactly 1 and no pass of their own is needed. That forward pass is in
        train mode: with LoRA dropout above 0 its dropout mask is in both, where the separate
        pass (eval mode, no dropout) would put dropout's noise into the first ratio.

        Transitions without signal (see :meth:`_has_signal`) count in the loss's
        normalization but get no forward pass: the gradient is the same as with them. A
        mini-batch with none left still takes its optimizer step, on zero gradients, so
        AdamW's moments and weight decay move as they would have; with
        ``steps_without_signal="skip"`` it takes none, and nothing moves.
        """
        s = self.settings
        mask_all = mini.batch["response_mask"]
        # agg_loss normalizes each micro-batch by these mini-batch totals, so the summed
        # micro-batch losses equal the mini-batch loss.
        config.global_batch_info.update(
            dp_size=1,
            batch_num_tokens=int(mask_all.sum().item()),
            global_batch_size=int((mask_all.sum(-1) > 0).sum().item()),
        )
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {"loss": 0.0, "pg_loss": 0.0, "optimizer_step": 1.0}
        active = mini.select_idxs(mini.batch["has_signal"].nonzero().flatten())
        active = active.select_idxs(by_length(active))  # micro-batches of like lengths carry little padding
        if len(active) == 0 and s.steps_without_signal == "skip":
            return {**sums, "optimizer_step": 0.0, "grad_norm": 0.0, "kl": 0.0}
        if len(active) == 0:
            for p in self.trainable:
                p.grad = torch.zeros_like(p)
        for micro in active.split(s.micro_batch_size) if len(active) else []:
            share = len(micro) / len(active)
            mask = micro.batch["response_mask"].to(self.device)
            log_prob, entropy = self._forward(micro, with_entropy=True)
            old = log_prob.detach() if old_from_forward else micro.batch["old_log_probs"].to(self.device)
            is_weights = micro.batch.get("rollout_is_weights")
            pg_loss, pg_metrics = loss_fn(
                old_log_prob=old,
                log_prob=log_prob,
                advantages=micro.batch["advantages"].to(self.device),
                response_mask=mask,
                loss_agg_mode=s.loss_agg_mode,
                config=config,
                rollout_is_weights=is_weights.to(self.device) if is_weights is not None else None,
            )
            loss = pg_loss
            entropy_loss = core_algos.agg_loss(entropy, mask, s.loss_agg_mode, **config.global_batch_info)
            if s.entropy_coeff > 0:
                loss = loss - s.entropy_coeff * entropy_loss
            if s.kl_coef > 0:
                kl = core_algos.kl_penalty(log_prob, micro.batch["ref_log_prob"].to(self.device), s.kl_penalty)
                kl_loss = core_algos.agg_loss(kl, mask, s.loss_agg_mode, **config.global_batch_info)
                loss = loss + s.kl_coef * kl_loss
                sums["kl"] = sums.get("kl", 0.0) + kl_loss.item()
            self._refuse_non_finite(loss, micro)
            loss.backward()
            sums["loss"] = sums.get("loss", 0.0) + loss.item()
            sums["pg_loss"] = sums.get("pg_loss", 0.0) + pg_loss.item()
            sums["entropy"] = sums.get("entropy", 0.0) + entropy_loss.item()
            for key, value in pg_metrics.items():
                name = key.removeprefix("actor/")
                sums[name] = sums.get(name, 0.0) + share * float(value)
        if s.grad_clip is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, s.grad_clip)
        else:
            grad_norm = torch.linalg.vector_norm(
                torch.stack([p.grad.norm() for p in self.trainable if p.grad is not None])
            )
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        sums["grad_norm"] = float(grad_norm)
        sums.setdefault("kl", 0.0)
        return sums

    # -- weights and state ---------------------------------------------------------------------

    def schedule_to(self, step: int) -> None:
        """Bring the schedule to training step ``step`` (1-based) where earlier steps never reached
        :meth:`update` (nothing to train on): verl's schedule counts every training step. It only moves
        forward, so callers that number steps otherwise get one schedule step per update."""
        while self.lr_scheduler.last_epoch < step - 1:
            advance(self.lr_scheduler)

    def save_weights(self, directory: Path) -> None:
        """Write the full weights, or only the LoRA adapter, with ``save_pretrained``."""
        directory.mkdir(parents=True, exist_ok=True)
        with no_progress_bars():
            self.model.save_pretrained(directory)

    def state_dict(self) -> dict[str, Any]:
        """Trainable weights, optimizer, learning-rate schedule and RNG: what a resumed run needs."""
        trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
        weights = {k: v.detach().cpu() for k, v in self.model.state_dict().items() if k in trainable}
        if self.settings.lora is None:
            weights = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        return {
            "model": weights,
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": self.lr_scheduler.state_dict(),
            "rng": rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        missing, unexpected = self.model.load_state_dict(state["model"], strict=False)
        if unexpected or (self.settings.lora is None and missing):
            raise ValueError(f"checkpoint does not match the model: missing={missing[:5]} unexpected={unexpected[:5]}")
        self.optimizer.load_state_dict(state["optimizer"])
        if "lr_scheduler" in state:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        elif self.lr_scheduler.lr_lambdas[0](0) != 1.0 or self.settings.lr_scheduler_type != "constant":
            raise ValueError(
                "checkpoint has no learning-rate schedule (it was saved before the learner had one, at a constant "
                "lr); resume it with lr_scheduler_type 'constant' and no warmup"
            )
        set_rng_state(state["rng"])
