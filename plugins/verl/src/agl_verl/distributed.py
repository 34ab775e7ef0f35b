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
is agl's ``broadcast`` credit, and :mod:`agl_verl.advantages` gives every sample its
rollout's advantage).

Around it: :mod:`agl_verl.worker_context` (what a worker process holds once: plugins, one
store client, the gateway link of :mod:`agl_verl.gateway_link` that registers verl's
servers as the gateway's upstreams), :mod:`agl_verl.manager` (verl's agent-loop manager,
checking that setup in every worker at startup), :mod:`agl_verl.task_runner` (verl's task
runner with agl's advantage step) and :mod:`agl_verl.launch` (what ``agl train`` runs).

This module is pinned to verl 0.9.x (:func:`check_verl_version`): trainer internals change
every minor release. The full trainer needs CUDA GPUs (verl's device is always ``cuda``
and its rollout backends are vLLM, SGLang and TensorRT-LLM); on a CPU machine everything
here except :func:`run_verl_trainer` runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import verl
from omegaconf import DictConfig, OmegaConf

from agl.errors import AglError
from agl.schema import Transition
from agl_verl.config import VerlSettings
from agl_verl.dataproto import generated_mask
from agl_verl.rollout_bridge import RolloutBridge

SUPPORTED_VERL = "0.9"
AGENT_LOOP_NAME = "agl"
MANAGER_CLASS = "agl_verl.manager.AglAgentLoopManager"


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
    path: Path,
    *,
    store_url: str | None,
    rollout_timeout_s: float,
    transition_config: dict[str, Any] | None = None,
    plugins: Sequence[str] = (),
    gateway_url: str | None = None,
    run_id: str = "run",
) -> Path:
    """Write the agent-loop list verl reads from ``rollout.agent.agent_loop_config_path``.

    Its one entry holds what every worker needs (:class:`agl_verl.worker_context.WorkerSetup`):
    the store, the transition config, the plugins to load (reward plugins: module paths or
    ``module:attribute``), the gateway whose upstreams the workers keep pointed at verl's
    servers, and the run id that names the rollouts. No credential: those travel in Ray's
    runtime environment (``AGL_STORE_TOKEN``, ``AGL_GATEWAY_ADMIN_TOKEN``).
    """
    entry: dict[str, Any] = {
        "name": AGENT_LOOP_NAME,
        "_target_": f"{AglAgentLoop.__module__}.{AglAgentLoop.__qualname__}",
        "store_url": store_url,
        "rollout_timeout_s": rollout_timeout_s,
        "transition_config": transition_config or {},
        "plugins": list(plugins),
        "gateway_url": gateway_url,
        "run_id": run_id,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create([entry]), path)
    return path


def trainer_overrides(
    settings: VerlSettings,
    *,
    train_files: str | None = None,
    agent_loop_config: str | None = None,
    val_files: str | None = None,
) -> list[str]:
    """agl's settings as hydra overrides of verl's ``ppo_trainer`` config.

    Validation runs on ``val_files`` (or ``distributed.val_files``) before training and every
    ``distributed.test_freq`` steps; with neither, verl does not validate (its default would
    run the training file). Checkpoints go to ``<workdir>/checkpoints`` every
    ``distributed.save_freq`` steps, and a new run in the same workdir resumes from the last.
    """
    check_servable(settings)
    d = settings.distributed
    s = settings
    train = train_files or d.train_files
    if train is None:
        raise AglError("distributed.train_files: required (a parquet of tasks, see write_tasks_parquet)")
    val = val_files or d.val_files
    low = s.clip_ratio_low if s.clip_ratio_low is not None else s.clip_ratio
    high = s.clip_ratio_high if s.clip_ratio_high is not None else s.clip_ratio
    overrides = [
        f"algorithm.adv_estimator={s.adv_estimator}",
        f"algorithm.norm_adv_by_std_in_grpo={s.norm_adv_by_std_in_grpo}",
        f"algorithm.gamma={s.gamma}",
        f"algorithm.lam={s.lam}",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={train}",
        f"data.val_files={val or train}",
        f"data.train_batch_size={d.train_batch_size}",
        f"data.max_prompt_length={d.max_prompt_length}",
        f"data.max_response_length={d.max_response_length}",
        f"actor_rollout_ref.model.path={s.model_path}",
        f"actor_rollout_ref.actor.optim.lr={s.lr}",
        f"actor_rollout_ref.actor.optim.weight_decay={s.weight_decay}",
        f"actor_rollout_ref.actor.optim.lr_scheduler_type={s.lr_scheduler_type}",
        f"actor_rollout_ref.actor.optim.lr_warmup_steps={s.lr_warmup_steps}",
        f"actor_rollout_ref.actor.optim.lr_warmup_steps_ratio={s.lr_warmup_steps_ratio}",
        f"actor_rollout_ref.actor.optim.min_lr_ratio={s.min_lr_ratio}",
        f"actor_rollout_ref.actor.optim.num_cycles={s.num_cycles}",
        f"actor_rollout_ref.actor.optim.zero_indexed_step={s.zero_indexed_step}",
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
    ]
    overrides += trainer_section(settings, validating=val is not None)
    if d.agent_loop_workers is not None:
        overrides.append(f"actor_rollout_ref.rollout.agent.num_workers={d.agent_loop_workers}")
    if agent_loop_config is not None:
        overrides.append(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loop_config}")
        # verl's TransferQueue manager, checking agl's worker setup in every worker at startup
        overrides.append(f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER_CLASS}")
    if d.total_training_steps is not None:
        overrides.append(f"trainer.total_training_steps={d.total_training_steps}")
    return overrides + lora_overrides(s) + correction_overrides(s.rollout_correction) + list(d.overrides)


def lora_overrides(settings: VerlSettings) -> list[str]:
    """The LoRA adapter, merged into the weights verl syncs to vLLM, which serves them under the base
    model's name: what agl's gateway sends the agents to (see :func:`check_servable`)."""
    lora = settings.lora
    if lora is None:
        return []
    targets = lora.target_modules if isinstance(lora.target_modules, str) else "[" + ",".join(lora.target_modules) + "]"
    return [
        f"actor_rollout_ref.model.lora_rank={lora.r}",
        f"actor_rollout_ref.model.lora_alpha={lora.alpha}",
        f"actor_rollout_ref.model.target_modules={targets}",
        "actor_rollout_ref.model.lora.merge=True",
    ]


def trainer_section(settings: VerlSettings, *, validating: bool) -> list[str]:
    """verl's ``trainer`` overrides: the cluster, checkpoints (every ``save_freq`` steps, resumed
    from ``<workdir>/checkpoints``) and validation (only with a val file)."""
    d = settings.distributed
    return [
        f"trainer.n_gpus_per_node={d.n_gpus_per_node}",
        f"trainer.nnodes={d.nnodes}",
        f"trainer.total_epochs={d.total_epochs}",
        f"trainer.project_name={d.project_name}",
        f"trainer.experiment_name={d.experiment_name}",
        f"trainer.default_local_dir={Path(settings.workdir).resolve() / 'checkpoints'}",
        "trainer.use_v1=True",
        "trainer.logger=[console]",
        f"trainer.save_freq={d.save_freq}",
        f"trainer.max_actor_ckpt_to_keep={'null' if d.max_checkpoints is None else d.max_checkpoints}",
        f"trainer.resume_mode={d.resume}",
        f"trainer.val_before_train={validating and d.val_before_train}",
        f"trainer.test_freq={d.test_freq if (validating and d.test_freq) else -1}",
    ]


LORA_UNSERVABLE = (
    "actor_rollout_ref.model.lora.merge=False",
    "actor_rollout_ref.model.lora.merge=false",
)


def check_servable(settings: VerlSettings) -> None:
    """Refuse settings whose trained weights agl's gateway could not send the agents to.

    verl 0.9 loads an unmerged LoRA adapter into its vLLM servers' engines under its own name
    (``"123"``) and applies it only in its own token-in/token-out ``generate``; vLLM's OpenAI
    server, which the gateway talks to, does not list that adapter, so the agents would sample
    from the base weights for the whole run. agl therefore has verl merge the adapter into the
    synced weights (``lora.merge=True``) and refuses an override that turns that off.
    """
    d = settings.distributed
    for override in d.overrides:
        if override.replace(" ", "") in LORA_UNSERVABLE:
            raise AglError(
                f"distributed.overrides: {override!r}: verl would keep the LoRA adapter out of the weights "
                "vLLM's OpenAI server serves, and the agents (through agl's gateway) would sample from the base "
                "model all run; agl needs lora.merge=True"
            )
        key = override.split("=", 1)[0].lstrip("+~")
        if key in ("actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.agent.default_agent_loop"):
            raise AglError(f"distributed.overrides: {key} is agl's to set (vllm, and the agl agent loop)")
        if key == "actor_rollout_ref.rollout.calculate_log_probs":
            raise AglError(f"distributed.overrides: {key}: agl's agent loop always hands verl the log-probs")


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
    settings: VerlSettings,
    *,
    train_files: str | None = None,
    agent_loop_config: str | None = None,
    val_files: str | None = None,
) -> DictConfig:
    """verl's full trainer config (``ppo_trainer.yaml``) with agl's settings applied."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = trainer_overrides(
        settings, train_files=train_files, agent_loop_config=agent_loop_config, val_files=val_files
    )
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def write_tasks_parquet(tasks: Sequence[Any], path: Path, *, mode: str = "train") -> Path:
    """Write agl tasks as verl's RL dataset: one row per task, routed to the ``agl`` agent loop.

    ``prompt`` holds the task input as a user message only so verl's dataset can measure
    and filter prompt lengths; the agent builds its own prompts. ``extra_info.task_id``
    is how :class:`AglAgentLoop` finds the task in the store. ``reward_model`` is there because
    verl's validation reads it from every sample (agl's rewards come from the rollout, so its
    ``ground_truth`` is a copy of the task input, which verl's logs of validation show).
    ``extra_info.mode`` is the agl rollout mode (``val`` for the validation file: its rollouts
    get the runner's val resources, a ``temperature`` among them).
    """
    import pandas as pd

    rows = [
        {
            "data_source": "agl",
            "prompt": [{"role": "user", "content": json.dumps(task.input)}],
            "agent_name": AGENT_LOOP_NAME,
            "reward_model": {"style": "agl", "ground_truth": json.dumps(task.input)},
            "extra_info": {"task_id": task.task_id, "index": i, "mode": mode},
        }
        for i, task in enumerate(tasks)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


# -- transitions → agent-loop outputs -----------------------------------------------------------------


class MissingLogprobsError(AglError, ValueError):
    """A rollout's engine calls lack the log-probs verl's trainer reads (``rollout_log_probs``)."""


def _sampled_logprobs(t: Transition, length: int) -> list[float]:
    """The behaviour log-probs of ``t``'s first ``length`` response tokens; raise when any is missing."""
    # verl's rollout log-probs are the behaviour policy's: what the tokens were sampled with
    sampled = t.behaviour_logprobs if t.behaviour_logprobs is not None else t.response_logprobs
    if sampled is None or len(sampled) < length:
        have = "none" if sampled is None else f"{len(sampled)} for {length} tokens"
        raise MissingLogprobsError(
            f"rollout {t.rollout_id} call {t.step}: the engine recorded no log-probs ({have}); verl's trainer "
            "stores rollout_log_probs for every sample (calculate_log_probs=True) and cannot mix samples with "
            "and without them, so this rollout is refused. The gateway asks every engine for log-probs: check "
            "that verl's vLLM servers return them"
        )
    return list(sampled)[:length]


def transitions_to_outputs(
    transitions: Sequence[Transition], *, response_length: int | None = None, rollout_reward: float | None = None
) -> list[AgentLoopOutput]:
    """One ``AgentLoopOutput`` per engine transition, in call order.

    A merged transition's output masks the context between its calls out of the loss
    (``response_mask``). The last output carries the rollout's reward (``rollout_reward``,
    or the last transition's); verl copies it to the others, and agl's advantage step
    (:mod:`agl_verl.advantages`) gives every output its rollout's advantage (agl's
    ``broadcast`` credit). Text-only transitions are left out: they have no token ids verl
    could train on. Every engine transition must carry its log-probs
    (:class:`MissingLogprobsError` otherwise: verl cannot store a rollout that has them for
    some calls and not others).
    """
    usable = sorted(
        (t for t in transitions if t.token_source == "engine" and len(t.response_ids)), key=lambda t: t.step
    )
    outputs = []
    for t in usable:
        response = list(t.response_ids)[:response_length]
        outputs.append(
            AgentLoopOutput(
                prompt_ids=list(t.prompt_ids),
                response_ids=response,
                response_mask=generated_mask(t)[: len(response)],
                response_logprobs=_sampled_logprobs(t, len(response)),
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


# -- the bridge from an agent-loop call to an agl rollout: agl_verl.rollout_bridge ---------------------


class AglAgentLoop(AgentLoopBase):
    """verl agent loop that runs an agl rollout per sample and returns its gateway-recorded calls.

    Constructed by verl's ``AgentLoopWorker`` through hydra, once per sample, from the entry
    :func:`write_agent_loop_config` writes. Everything that outlives a sample (plugins, the
    store client, the gateway link) is the process's :class:`~agl_verl.worker_context.WorkerContext`,
    made by the first instance: a plugin that cannot load fails there, loudly.
    """

    def __init__(
        self,
        *args,
        store_url: str | None = None,
        rollout_timeout_s: float = 600.0,
        transition_config: dict[str, Any] | None = None,
        plugins: Sequence[str] | None = None,
        gateway_url: str | None = None,
        run_id: str = "run",
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        from agl_verl.worker_context import WorkerSetup, worker_context

        setup = WorkerSetup.of(
            store_url=store_url,
            rollout_timeout_s=rollout_timeout_s,
            transition_config=transition_config,
            plugins=plugins,
            gateway_url=gateway_url,
            run_id=run_id,
        )
        self.context = worker_context(setup)

    @property
    def bridge(self) -> RolloutBridge:
        return self.context.bridge

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> list[AgentLoopOutput]:
        """One sample: point the gateway at verl's servers (if they changed), run one agl rollout of the row's task."""
        extra = kwargs.get("extra_info") or {}
        task_id = extra.get("task_id")
        if not task_id:
            raise AglError("AglAgentLoop: the dataset row has no extra_info.task_id (see write_tasks_parquet)")
        if self.context.gateway is not None:
            await self.context.gateway.sync(self.server_manager)
        step = kwargs.get("global_steps")
        mode = str(extra.get("mode") or "train")
        transitions = await self.bridge.arun(str(task_id), step=int(step) if step is not None else None, mode=mode)
        return transitions_to_outputs(transitions, response_length=self.rollout_config.response_length)


# -- launching -------------------------------------------------------------------------------------------


class NeedsGPUs(AglError, RuntimeError):
    """verl's trainer (FSDP actor, vLLM rollout servers) needs CUDA GPUs, and this machine has none."""


def require_gpus() -> None:
    """Raise :class:`NeedsGPUs` unless torch sees a CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        raise NeedsGPUs(
            "mode='distributed' needs GPUs: verl's FSDP actor and its vLLM rollout servers run on CUDA, and torch "
            "sees no GPU on this machine. Everything before them ran (config, data, Ray workers); use mode='local' "
            "to train here"
        )


def run_verl_trainer(settings: VerlSettings, *, train_files: str | None = None) -> None:
    """Compose the config and run verl's V1 trainer on Ray, with agl's advantage step. Needs CUDA GPUs.

    The agent loop's store comes from ``distributed.store_url`` (or ``$AGL_STORE_URL``) and no
    gateway is linked: ``agl train`` (:mod:`agl_verl.launch`) is the way that wires the gateway,
    the runners and the plugins too.
    """
    require_gpus()
    from verl.trainer.main_ppo import run_ppo

    from agl_verl.task_runner import AglTaskRunner

    workdir = Path(settings.workdir).resolve()
    loops = write_agent_loop_config(
        workdir / "agent_loops.yaml",
        store_url=settings.distributed.store_url,
        rollout_timeout_s=settings.distributed.rollout_timeout_s,
    )
    config = compose_trainer_config(settings, train_files=train_files, agent_loop_config=str(loops))
    run_ppo(config, task_runner_class=AglTaskRunner)
