"""Settings of the verl backend, validated before anything heavy starts.

:class:`VerlSettings` holds what both modes share (the algorithm: estimator,
policy loss, KL, optimizer) and what each mode adds. Names that live in verl's
registries (advantage estimators, policy losses, KL estimators, loss
aggregation modes) are checked against the installed verl, so a typo fails at
construction with the list of known names instead of deep inside a step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agl.errors import ConfigError

KL_PENALTIES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
"""The KL estimators verl's ``kl_penalty`` accepts (``full`` needs whole distributions, not supported here)."""

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

# Estimators whose inputs a policy-only backend cannot supply: GAE needs a critic's
# values, ReMax a greedy baseline rollout, the optimal-token baselines per-token sums of pi^2.
UNSUPPORTED_ESTIMATORS = {
    "gae": "needs a critic (values), which agl's backends do not train",
    "remax": "needs a greedy baseline rollout (reward_baselines) per prompt",
    "optimal_token_baseline": "needs sum_pi_squared from the actor",
    "tir_optimal_token_baseline": "needs sum_pi_squared from the actor",
}


def _one_of(name: str, known, what: str) -> str:
    """``name`` if it is among ``known``, else an error listing what is known."""
    if name not in known:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(known)}")
    return name


class LoraSettings(BaseModel):
    """A LoRA adapter (peft) instead of full fine-tuning."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(default=8, ge=1)
    alpha: float = Field(default=16.0, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] | str = "all-linear"


class DistributedSettings(BaseModel):
    """What ``mode="distributed"`` adds: the cluster shape and verl's batch sizes."""

    model_config = ConfigDict(extra="forbid")

    n_gpus_per_node: int = Field(default=8, ge=1)
    nnodes: int = Field(default=1, ge=1)
    rollout_n: int = Field(default=8, ge=1, description="rollouts per task (the GRPO group size)")
    train_batch_size: int = Field(default=32, ge=1, description="tasks per step")
    ppo_mini_batch_size: int = Field(default=32, ge=1)
    max_prompt_length: int = Field(default=2048, ge=1)
    max_response_length: int = Field(default=1024, ge=1)
    tensor_model_parallel_size: int = Field(default=1, ge=1)
    gpu_memory_utilization: float = Field(default=0.6, gt=0, le=1)
    total_training_steps: int | None = Field(default=None, ge=1)
    total_epochs: int = Field(default=1, ge=1)
    train_files: str | None = None
    val_files: str | None = None
    store_url: str | None = None
    project_name: str = "agl"
    experiment_name: str = "agl-verl"
    rollout_timeout_s: float = Field(default=600.0, gt=0)
    save_freq: int = Field(default=10, ge=1, description="write a verl checkpoint every N steps (trainer.save_freq)")
    max_checkpoints: int | None = Field(default=2, ge=1, description="checkpoints kept (None: all)")
    resume: Literal["auto", "disable"] = Field(
        default="auto", description="auto: continue from the last checkpoint in the workdir (verl's resume_mode)"
    )
    test_freq: int | None = Field(
        default=None, ge=1, description="validate every N steps (None: before training and never after)"
    )
    val_before_train: bool = Field(default=True, description="validate before the first step (with val tasks)")
    agent_loop_workers: int | None = Field(default=None, ge=1, description="verl's agent-loop workers (None: its own)")
    ray_address: str | None = Field(
        default=None, description="None: a Ray cluster of this machine; 'auto' or host:port: join one `ray start` made"
    )
    host: str = Field(
        default="127.0.0.1",
        description="where agl train's store server and gateway listen; the Ray workers reach them there "
        "(several nodes: this node's address the others can reach)",
    )
    overrides: list[str] = Field(default_factory=list, description="extra hydra overrides, verbatim")


class VerlSettings(BaseModel):
    """All settings of :class:`agl_verl.backend.VerlBackend`."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["local", "distributed"] = "local"
    model_path: str | None = None
    adv_estimator: str = "grpo"
    norm_adv_by_std_in_grpo: bool = True
    gamma: float = Field(default=1.0, ge=0, le=1)
    lam: float = Field(default=1.0, ge=0, le=1)
    policy_loss: str = "vanilla"
    clip_ratio: float = Field(default=0.2, gt=0)
    clip_ratio_low: float | None = Field(default=None, gt=0)
    clip_ratio_high: float | None = Field(default=None, gt=0)
    clip_ratio_c: float = Field(default=3.0, gt=1)
    loss_agg_mode: str = "token-mean"
    kl_coef: float = Field(default=0.0, ge=0)
    kl_penalty: str = "low_var_kl"
    entropy_coeff: float = Field(default=0.0, ge=0)
    temperature: float = Field(default=1.0, gt=0, description="the sampling temperature the engine used")
    lr: float = Field(default=1e-5, gt=0, description="the peak learning rate (after warmup); the schedule scales it")
    lr_scheduler_type: Literal["constant", "cosine"] = Field(
        default="constant",
        description="verl's actor.optim.lr_scheduler_type: constant: `lr` after the warmup (verl's "
        "get_constant_schedule_with_warmup); cosine: after the warmup, a cosine from `lr` down to "
        "`min_lr_ratio` x `lr` at the run's last step (verl's get_cosine_schedule_with_warmup; needs the run's "
        "total steps, the trainer's `steps`). The schedule advances once per training step, after its last "
        "optimizer step, as verl's actor does; a step whose update never reached the learner (no transitions "
        "for it) still counts",
    )
    lr_warmup_steps: int = Field(
        default=-1,
        description="verl's actor.optim.lr_warmup_steps: training steps over which the learning rate rises "
        "linearly from 0 (the first step's) to `lr`; 0 or less: `lr_warmup_steps_ratio` of the run's steps",
    )
    lr_warmup_steps_ratio: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="verl's actor.optim.lr_warmup_steps_ratio: the warmup as a share of the run's total steps "
        "(rounded down), used when `lr_warmup_steps` is 0 or less",
    )
    min_lr_ratio: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="verl's actor.optim.min_lr_ratio: cosine only: the floor of the learning rate, as a share of `lr`",
    )
    num_cycles: float = Field(
        default=0.5,
        ge=0,
        description="verl's actor.optim.num_cycles: cosine only: cosine waves over the steps after warmup "
        "(0.5: one half-wave, from `lr` down to the floor)",
    )
    zero_indexed_step: bool = Field(
        default=True,
        description="verl's actor.optim.zero_indexed_step: cosine only: the first step is the schedule's step 0 "
        "(false: step 1, as torchtitan counts)",
    )
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float | None = Field(default=1.0, gt=0)
    ppo_epochs: int = Field(default=1, ge=1)
    mini_batch_size: int | None = Field(default=None, ge=1, description="transitions per optimizer step; None: all")
    micro_batch_size: int = Field(default=8, ge=1, description="transitions per forward/backward")
    gradient_checkpointing: bool = Field(
        default=False,
        description="keep only each layer's input in the forward pass and recompute the rest in the backward: "
        "the same gradients in a fraction of the memory, for one more forward pass (local mode only)",
    )
    steps_without_signal: Literal["step", "skip"] = Field(
        default="step",
        description="a mini-batch in which no transition has signal (every advantage 0): step: AdamW still "
        "steps, on zero gradients, as verl does (its momentum keeps moving the weights); skip: no optimizer "
        "step, so weights and optimizer state stay as they were (local mode only)",
    )
    old_log_probs: Literal["auto", "engine", "recompute"] = Field(
        default="auto",
        description="engine: the logprobs the engine recorded; recompute: a forward pass of their own at "
        "`temperature`, in eval mode, over every transition with signal before the first optimizer step; auto: "
        "the engine's at temperature 1, the policy's at `temperature` at any other (the engines record logprobs "
        "before temperature, so at another they are not the probabilities the tokens were sampled with). "
        "Where auto (or engine, for a batch without the engine's logprobs) needs the policy's, the first "
        "mini-batch takes them from its own loss forward pass, detached (its weights are still the rollout's), "
        "and only the transitions of later mini-batches get a pass of their own: with one mini-batch and "
        "ppo_epochs 1 there is none; with ppo_epochs above 1 every transition gets one, as with recompute. "
        "The same update up to float noise, except with lora.dropout above 0: the loss forward pass is in "
        "train mode, so auto's first ratio is exactly 1 where recompute's carries dropout's noise",
    )
    rollout_correction: str = Field(
        default="auto",
        description="off-policy correction, by verl's RolloutCorrectionConfig preset name (decoupled_token_is, "
        "decoupled_seq_is, decoupled_token_icepop, bypass_ppo_clip, ...), none, or auto: decoupled_token_is "
        "for a batch with transitions sampled by other weights than the learner's (asynchronous steps, "
        "recorded traffic), none for an on-policy batch. Needs the engine's behaviour log-probs",
    )
    text_transitions: Literal["skip", "error"] = "skip"
    lora: LoraSettings | None = None
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    seed: int = 0
    workdir: str = "agl-verl-work"
    max_prompt_length: int | None = Field(default=None, ge=1, description="longer prompts keep their last tokens")
    max_response_length: int | None = Field(default=None, ge=1, description="longer responses are cut")
    distributed: DistributedSettings = Field(default_factory=DistributedSettings)

    @field_validator("adv_estimator")
    @classmethod
    def _known_estimator(cls, name: str) -> str:
        from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

        if name in UNSUPPORTED_ESTIMATORS:
            raise ValueError(f"{name!r} {UNSUPPORTED_ESTIMATORS[name]}")
        return _one_of(name, sorted(set(ADV_ESTIMATOR_REGISTRY) - set(UNSUPPORTED_ESTIMATORS)), "advantage estimator")

    @field_validator("policy_loss")
    @classmethod
    def _known_loss(cls, name: str) -> str:
        from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

        return _one_of(name, sorted(POLICY_LOSS_REGISTRY), "policy loss")

    @field_validator("kl_penalty")
    @classmethod
    def _known_kl(cls, name: str) -> str:
        return _one_of(name, KL_PENALTIES, "KL estimator")

    @field_validator("loss_agg_mode")
    @classmethod
    def _known_agg(cls, name: str) -> str:
        return _one_of(name, LOSS_AGG_MODES, "loss aggregation")

    @field_validator("rollout_correction")
    @classmethod
    def _known_correction(cls, name: str) -> str:
        from agl_verl.correction import preset_names

        return _one_of(name, ["auto", "none", *preset_names()], "rollout correction preset")

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        if device != "cpu" and not device.startswith("cuda"):
            raise ValueError(f"must be 'cpu' or 'cuda[:N]', got {device!r}")
        return device

    @model_validator(mode="after")
    def _mode_needs(self) -> VerlSettings:
        if self.model_path is None:
            raise ValueError("model_path is required: the weights (a local directory) to train")
        if self.old_log_probs == "engine" and self.temperature != 1.0:
            raise ValueError(
                f"old_log_probs 'engine' needs temperature 1, not {self.temperature:g}: the engines record "
                "logprobs before temperature, which are not the probabilities the tokens were sampled with "
                "(use 'auto' or 'recompute')"
            )
        if self.mode == "distributed" and self.steps_without_signal == "skip":
            raise ValueError(
                "steps_without_signal 'skip' is the local learner's: verl's trainer in distributed mode always steps"
            )
        if self.mode == "distributed" and self.gradient_checkpointing:
            raise ValueError(
                "gradient_checkpointing is the local learner's: in distributed mode verl's own "
                "actor_rollout_ref.model.enable_gradient_checkpointing applies (on by default; set it in "
                "distributed.overrides)"
            )
        self._schedule_is_consistent()
        if self.rollout_correction.startswith("bypass_") and self.policy_loss != "vanilla":
            raise ValueError(
                f"rollout_correction {self.rollout_correction!r} makes the loss verl's bypass_mode, which replaces "
                f"policy_loss {self.policy_loss!r} (its PPO clip is vanilla's, its REINFORCE its own); set "
                "policy_loss: vanilla, or choose a decoupled_* preset"
            )
        if self.mode == "local" and self.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise ValueError("device is 'cuda' but torch sees no GPU; use device='cpu'")
        return self

    def _schedule_is_consistent(self) -> None:
        """Refuse schedule settings the chosen schedule would ignore (verl ignores them silently)."""
        if self.lr_warmup_steps > 0 and self.lr_warmup_steps_ratio > 0:
            raise ValueError(
                f"lr_warmup_steps_ratio {self.lr_warmup_steps_ratio:g} is ignored when lr_warmup_steps "
                f"({self.lr_warmup_steps}) is above 0, as in verl; set one of them"
            )
        if self.lr_scheduler_type == "constant":
            defaults = type(self).model_fields
            for name in ("min_lr_ratio", "num_cycles", "zero_indexed_step"):
                if getattr(self, name) != defaults[name].default:
                    raise ValueError(
                        f"{name} shapes the cosine schedule only; lr_scheduler_type is 'constant' "
                        "(set lr_scheduler_type: cosine, or leave it out)"
                    )

    @property
    def schedule_needs_total_steps(self) -> bool:
        """Whether the learning-rate schedule depends on the run's total training steps."""
        return self.lr_scheduler_type == "cosine" or (self.lr_warmup_steps <= 0 and self.lr_warmup_steps_ratio > 0)

    @property
    def recompute_old_log_probs(self) -> bool:
        """Whether the PPO ratio's old log-probs come from a forward pass rather than the engine."""
        return self.old_log_probs == "recompute" or (self.old_log_probs == "auto" and self.temperature != 1.0)

    @property
    def versions_dir(self) -> Path:
        """Where :meth:`publish` writes each step's weights."""
        return Path(self.workdir) / "versions"


def parse_settings(config: dict[str, Any]) -> VerlSettings:
    """Validate ``config``; raise :class:`ConfigError` naming each bad field and why."""
    try:
        return VerlSettings.model_validate(config)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "config"
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                message = "unknown setting for the verl backend"
            problems.append(f"{field}: {message}")
        raise ConfigError("invalid verl backend settings: " + "; ".join(problems)) from None
