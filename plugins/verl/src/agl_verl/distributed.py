"""``mode="distributed"``: verl's own PPO trainer on Ray, with agl rollouts as its agent loop.

verl 0.9's trainer (``TaskRunnerV1``, the default) owns the loop: it reads a dataset,
asks its agent loops for sequences, computes advantages, updates the actor with FSDP
and syncs the weights into its vLLM rollout servers. agl plugs in at verl's documented
extension point, the agent loop: :class:`AglAgentLoop` (registered as ``"agl"``) takes
one dataset row (one agl task), enqueues an agl rollout in the store, waits for a runner
to finish it (the agent reaches the policy through agl's gateway, in front of verl's
vLLM servers), builds the rollout's transitions from the gateway-recorded token ids and
returns them as a list of ``AgentLoopOutput`` (verl 0.9's TransferQueue agent-loop worker
stores each one as a sample; the final one's reward applies to the whole rollout, which
is agl's ``broadcast`` credit).

This module is pinned to verl 0.9.x (:func:`check_verl_version`): trainer internals change
every minor release. The full trainer needs CUDA GPUs (verl's device is always ``cuda``
and its rollout backends are vLLM, SGLang and TensorRT-LLM); on a CPU machine everything
here except :func:`run_verl_trainer` runs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import verl
from omegaconf import DictConfig, OmegaConf

from agl.env import STORE_URL
from agl.errors import AglError
from agl.schema import Rollout, Transition
from agl_verl.config import VerlSettings
from agl_verl.dataproto import generated_mask

SUPPORTED_VERL = "0.9"
AGENT_LOOP_NAME = "agl"


class VerlVersionError(AglError, RuntimeError):
    """The installed verl is not the minor version this module was written against."""


def check_verl_version(version: str | None = None) -> str:
    """Return verl's version; raise :class:`VerlVersionError` unless it is 0.9.x."""
    version = version or verl.__version__
    if ".".join(version.split(".")[:2]) != SUPPORTED_VERL:
        raise VerlVersionError(
            f"agl-verl's distributed mode is written against verl {SUPPORTED_VERL}.x (agent loop and "
            f"TaskRunnerV1 APIs); found verl {version}. Install verl=={SUPPORTED_VERL}.1"
        )
    return version


check_verl_version()

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput  # noqa: E402

# -- config composition ----------------------------------------------------------------------------


def verl_config_dir() -> Path:
    """The folder of verl's hydra configs (``ppo_trainer.yaml`` and its groups)."""
    return Path(verl.__file__).parent / "trainer" / "config"


def write_agent_loop_config(
    path: Path, *, store_url: str | None, rollout_timeout_s: float, transition_config: dict[str, Any] | None = None
) -> Path:
    """Write the agent-loop list verl reads from ``rollout.agent.agent_loop_config_path``."""
    entry: dict[str, Any] = {
        "name": AGENT_LOOP_NAME,
        "_target_": f"{AglAgentLoop.__module__}.{AglAgentLoop.__qualname__}",
        "store_url": store_url,
        "rollout_timeout_s": rollout_timeout_s,
        "transition_config": transition_config or {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create([entry]), path)
    return path


def trainer_overrides(
    settings: VerlSettings, *, train_files: str | None = None, agent_loop_config: str | None = None
) -> list[str]:
    """agl's settings as hydra overrides of verl's ``ppo_trainer`` config."""
    d = settings.distributed
    s = settings
    train = train_files or d.train_files
    if train is None:
        raise AglError("distributed.train_files: required (a parquet of tasks, see write_tasks_parquet)")
    low = s.clip_ratio_low if s.clip_ratio_low is not None else s.clip_ratio
    high = s.clip_ratio_high if s.clip_ratio_high is not None else s.clip_ratio
    overrides = [
        f"algorithm.adv_estimator={s.adv_estimator}",
        f"algorithm.norm_adv_by_std_in_grpo={s.norm_adv_by_std_in_grpo}",
        f"algorithm.gamma={s.gamma}",
        f"algorithm.lam={s.lam}",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={train}",
        f"data.val_files={d.val_files or train}",
        f"data.train_batch_size={d.train_batch_size}",
        f"data.max_prompt_length={d.max_prompt_length}",
        f"data.max_response_length={d.max_response_length}",
        f"actor_rollout_ref.model.path={s.model_path}",
        f"actor_rollout_ref.actor.optim.lr={s.lr}",
        f"actor_rollout_ref.actor.optim.weight_decay={s.weight_decay}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={d.ppo_mini_batch_size}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={s.micro_batch_size}",
        f"actor_rollout_ref.actor.ppo_epochs={s.ppo_epochs}",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={s.policy_loss}",
        f"actor_rollout_ref.actor.clip_ratio={s.clip_ratio}",
        f"actor_rollout_ref.actor.clip_ratio_low={low}",
        f"actor_rollout_ref.actor.clip_ratio_high={high}",
        f"actor_rollout_ref.actor.clip_ratio_c={s.clip_ratio_c}",
        f"actor_rollout_ref.actor.loss_agg_mode={s.loss_agg_mode}",
        f"actor_rollout_ref.actor.entropy_coeff={s.entropy_coeff}",
        f"actor_rollout_ref.actor.use_kl_loss={s.kl_coef > 0}",
        f"actor_rollout_ref.actor.kl_loss_coef={s.kl_coef}",
        f"actor_rollout_ref.actor.kl_loss_type={s.kl_penalty}",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.n={d.rollout_n}",
        f"actor_rollout_ref.rollout.temperature={s.temperature}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={d.tensor_model_parallel_size}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={d.gpu_memory_utilization}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={s.micro_batch_size}",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_LOOP_NAME}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={s.micro_batch_size}",
        f"trainer.n_gpus_per_node={d.n_gpus_per_node}",
        f"trainer.nnodes={d.nnodes}",
        f"trainer.total_epochs={d.total_epochs}",
        f"trainer.project_name={d.project_name}",
        f"trainer.experiment_name={d.experiment_name}",
        f"trainer.default_local_dir={Path(s.workdir).resolve() / 'checkpoints'}",
        "trainer.use_v1=True",
        "trainer.logger=[console]",
    ]
    if agent_loop_config is not None:
        overrides.append(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loop_config}")
    if d.total_training_steps is not None:
        overrides.append(f"trainer.total_training_steps={d.total_training_steps}")
    if s.lora is not None:
        targets = s.lora.target_modules
        overrides += [
            f"actor_rollout_ref.model.lora_rank={s.lora.r}",
            f"actor_rollout_ref.model.lora_alpha={s.lora.alpha}",
            "actor_rollout_ref.model.target_modules="
            + (targets if isinstance(targets, str) else "[" + ",".join(targets) + "]"),
        ]
    return overrides + correction_overrides(s.rollout_correction) + list(d.overrides)


def correction_overrides(setting: str) -> list[str]:
    """``rollout_correction`` as overrides of verl's ``algorithm.rollout_correction``. verl's trainer
    generates its rollouts on-policy, so ``auto`` leaves its default (none) alone."""
    from agl_verl.correction import preset

    chosen = preset(setting) if setting != "auto" else None
    if chosen is None:
        return []
    fields = ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs")
    fields += ("rollout_rs_threshold", "bypass_mode", "loss_type")
    values = {name: getattr(chosen, name) for name in fields}
    return [f"algorithm.rollout_correction.{k}={'null' if v is None else v}" for k, v in values.items()]


def compose_trainer_config(
    settings: VerlSettings, *, train_files: str | None = None, agent_loop_config: str | None = None
) -> DictConfig:
    """verl's full trainer config (``ppo_trainer.yaml``) with agl's settings applied."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = trainer_overrides(settings, train_files=train_files, agent_loop_config=agent_loop_config)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def write_tasks_parquet(tasks: Sequence[Any], path: Path) -> Path:
    """Write agl tasks as verl's RL dataset: one row per task, routed to the ``agl`` agent loop.

    ``prompt`` holds the task input as a user message only so verl's dataset can measure
    and filter prompt lengths; the agent builds its own prompts. ``extra_info.task_id``
    is how :class:`AglAgentLoop` finds the task in the store.
    """
    import pandas as pd

    rows = [
        {
            "data_source": "agl",
            "prompt": [{"role": "user", "content": json.dumps(task.input)}],
            "agent_name": AGENT_LOOP_NAME,
            "extra_info": {"task_id": task.task_id, "index": i},
        }
        for i, task in enumerate(tasks)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


# -- transitions → agent-loop outputs -----------------------------------------------------------------


def transitions_to_outputs(
    transitions: Sequence[Transition], *, response_length: int | None = None, rollout_reward: float | None = None
) -> list[AgentLoopOutput]:
    """One ``AgentLoopOutput`` per engine transition, in call order.

    A merged transition's output masks the context between its calls out of the loss
    (``response_mask``); verl computes advantages per output from the rollout's reward,
    so every segment of it gets the same one (agl's ``broadcast`` credit).

    The last output carries the rollout's reward (``rollout_reward``, or the last
    transition's); verl copies it to the others. Text-only transitions are left out:
    they have no token ids verl could train on.
    """
    usable = sorted(
        (t for t in transitions if t.token_source == "engine" and len(t.response_ids)), key=lambda t: t.step
    )
    outputs = []
    for t in usable:
        response = list(t.response_ids)[:response_length]
        # verl's rollout log-probs are the behaviour policy's: what the tokens were sampled with
        sampled = t.behaviour_logprobs if t.behaviour_logprobs is not None else t.response_logprobs
        logprobs = list(sampled)[: len(response)] if sampled is not None else None
        outputs.append(
            AgentLoopOutput(
                prompt_ids=list(t.prompt_ids),
                response_ids=response,
                response_mask=generated_mask(t)[: len(response)],
                response_logprobs=logprobs,
                num_turns=2,
                metrics=AgentLoopMetrics(),
                extra_fields={"agl_rollout_id": t.rollout_id, "agl_step": t.step, "agl_agent": t.agent},
            )
        )
    if outputs:
        reward = rollout_reward if rollout_reward is not None else usable[-1].reward
        outputs[-1].reward_score = float(reward)
        outputs[-1].extra_fields["reward_extra_info"] = {"agl_reward": float(reward)}
    return outputs


# -- the bridge from an agent-loop call to an agl rollout ------------------------------------------------


TransitionBuilder = Callable[[Any, list[Rollout]], list[Transition]]


def _default_builder(transition_config: dict[str, Any]) -> TransitionBuilder:
    from agl_trainer.transitions import TransitionConfig, build_transitions

    config = TransitionConfig(**{**transition_config, "text_only": False})

    def build(store, rollouts):
        transitions, _report = build_transitions(store, rollouts, config)
        return transitions

    return build


class RolloutBridge:
    """Enqueue one agl rollout of a task, wait for a runner to finish it, return its transitions."""

    def __init__(
        self,
        store,
        *,
        timeout_s: float = 600.0,
        builder: TransitionBuilder | None = None,
        transition_config: dict[str, Any] | None = None,
    ):
        self.store = store
        self.timeout_s = timeout_s
        self.builder = builder or _default_builder(transition_config or {})

    def run(self, task_id: str, *, step: int | None = None, model_version: str | None = None) -> list[Transition]:
        """Blocking: enqueue, wait, build. A rollout that did not succeed yields no transitions."""
        (rollout,) = self.store.enqueue(
            [Rollout(task_id=task_id, step=step, model_version=model_version, timeout_s=self.timeout_s)]
        )
        (done,) = self.store.wait([rollout.rollout_id], timeout_s=self.timeout_s)
        if not done.status.terminal:
            self.store.cancel([done.rollout_id])
            return []
        return self.builder(self.store, [done])

    async def arun(self, task_id: str, **kwargs) -> list[Transition]:
        """:meth:`run` in a worker thread, so verl's event loop keeps serving other samples."""
        return await asyncio.to_thread(self.run, task_id, **kwargs)


class AglAgentLoop(AgentLoopBase):
    """verl agent loop that runs an agl rollout per sample and returns its gateway-recorded calls.

    Constructed by verl's ``AgentLoopWorker`` through hydra from the entry
    :func:`write_agent_loop_config` writes (``store_url``, ``rollout_timeout_s``,
    ``transition_config`` come from there, or from ``AGL_STORE_URL``).
    """

    def __init__(
        self,
        *args,
        store_url: str | None = None,
        rollout_timeout_s: float = 600.0,
        transition_config: dict[str, Any] | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        from agl.store import open_store

        url = store_url or STORE_URL.get()
        if not url:
            raise AglError(f"AglAgentLoop: no store_url in the agent-loop config and {STORE_URL} is unset")
        self.bridge = RolloutBridge(
            open_store(url), timeout_s=rollout_timeout_s, transition_config=dict(transition_config or {})
        )

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> list[AgentLoopOutput]:
        """One sample: one agl rollout of the row's task."""
        extra = kwargs.get("extra_info") or {}
        task_id = extra.get("task_id")
        if not task_id:
            raise AglError("AglAgentLoop: the dataset row has no extra_info.task_id (see write_tasks_parquet)")
        step = kwargs.get("global_steps")
        transitions = await self.bridge.arun(str(task_id), step=int(step) if step is not None else None)
        return transitions_to_outputs(transitions, response_length=self.rollout_config.response_length)


# -- launching -------------------------------------------------------------------------------------------


def run_verl_trainer(settings: VerlSettings, *, train_files: str | None = None) -> None:
    """Compose the config and run verl's ``TaskRunnerV1`` on Ray. Needs CUDA GPUs."""
    import torch

    if not torch.cuda.is_available():
        raise AglError(
            "mode='distributed' runs verl's FSDP trainer and vLLM rollout servers, which need CUDA GPUs; "
            "this machine has none. Use mode='local' here."
        )
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo

    workdir = Path(settings.workdir).resolve()
    loops = write_agent_loop_config(
        workdir / "agent_loops.yaml",
        store_url=settings.distributed.store_url,
        rollout_timeout_s=settings.distributed.rollout_timeout_s,
    )
    config = compose_trainer_config(settings, train_files=train_files, agent_loop_config=str(loops))
    run_ppo(config, task_runner_class=TaskRunnerV1)
