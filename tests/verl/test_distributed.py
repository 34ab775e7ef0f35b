"""Distributed mode, the parts that run without GPUs: version pin, verl config composition,
the dataset verl reads, transitions → AgentLoopOutputs, the store bridge, and Ray wiring.

verl's full trainer (FSDP actor + vLLM rollout servers) needs CUDA GPUs and is not run here.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from agl.errors import AglError
from agl.schema import LLMCall, Reward, RolloutStatus, Task, Transition
from agl_verl.config import parse_settings
from agl_verl.distributed import (
    AGENT_LOOP_NAME,
    RolloutBridge,
    VerlVersionError,
    check_verl_version,
    compose_trainer_config,
    transitions_to_outputs,
    write_agent_loop_config,
    write_tasks_parquet,
)
from agl_verl.models import build_tiny_model


def settings(**overrides):
    config = dict(
        mode="distributed",
        model_path="/models/qwen",
        adv_estimator="rloo",
        policy_loss="vanilla",
        clip_ratio=0.25,
        kl_coef=0.01,
        lr=2e-6,
        micro_batch_size=4,
        distributed={
            "n_gpus_per_node": 8,
            "nnodes": 2,
            "rollout_n": 8,
            "train_batch_size": 64,
            "ppo_mini_batch_size": 16,
            "train_files": "/data/train.parquet",
        },
    )
    config.update(overrides)
    return parse_settings(config)


def test_version_pin():
    assert check_verl_version().startswith("0.9.")
    with pytest.raises(VerlVersionError, match=r"written against verl 0\.9\.x .* found verl 0\.10\.0"):
        check_verl_version("0.10.0")


def test_compose_maps_agl_settings_onto_verl_trainer_config(tmp_path):
    loops = write_agent_loop_config(tmp_path / "loops.yaml", store_url="http://store:4317", rollout_timeout_s=30)
    cfg = compose_trainer_config(
        settings(lora={"r": 16, "alpha": 32, "target_modules": ["q_proj", "v_proj"]}), agent_loop_config=str(loops)
    )
    assert cfg.algorithm.adv_estimator == "rloo"
    actor = cfg.actor_rollout_ref.actor
    assert actor.policy_loss.loss_mode == "vanilla"
    assert actor.clip_ratio == actor.clip_ratio_low == actor.clip_ratio_high == 0.25
    assert actor.use_kl_loss is True and actor.kl_loss_coef == 0.01 and actor.kl_loss_type == "low_var_kl"
    assert actor.optim.lr == 2e-6 and actor.ppo_mini_batch_size == 16
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.name == "vllm" and rollout.n == 8 and rollout.calculate_log_probs is True
    assert rollout.agent.default_agent_loop == AGENT_LOOP_NAME
    assert rollout.agent.agent_loop_config_path == str(loops)
    assert cfg.actor_rollout_ref.model.lora_rank == 16
    assert list(cfg.actor_rollout_ref.model.target_modules) == ["q_proj", "v_proj"]
    assert cfg.trainer.use_v1 is True and cfg.trainer.nnodes == 2 and cfg.trainer.n_gpus_per_node == 8
    assert cfg.data.train_files == "/data/train.parquet"

    from omegaconf import OmegaConf
    from verl.utils.config import validate_config

    # verl's own checks pass (without LoRA: its LoRA check imports vLLM, which needs CUDA)
    validate_config(compose_trainer_config(settings()), use_reference_policy=True, use_critic=False)
    entry = OmegaConf.load(loops)[0]
    assert entry.name == AGENT_LOOP_NAME and entry._target_ == "agl_verl.distributed.AglAgentLoop"
    assert entry.store_url == "http://store:4317"


def test_compose_errors():
    bad = settings(distributed={"train_files": None})
    with pytest.raises(AglError, match="distributed.train_files: required"):
        compose_trainer_config(bad)
    with pytest.raises(Exception, match="ppo_mini_batch_size"):
        too_big = settings(
            distributed={
                "train_files": "/x.parquet",
                "train_batch_size": 4,
                "ppo_mini_batch_size": 64,
                "n_gpus_per_node": 1,
            }
        )
        from verl.utils.config import validate_config

        validate_config(compose_trainer_config(too_big), use_reference_policy=False, use_critic=False)


def test_train_step_is_not_for_distributed_mode():
    from agl_verl.backend import VerlBackend

    backend = VerlBackend(mode="distributed", model_path="/m")
    backend.setup(None)
    with pytest.raises(AglError, match="run_distributed"):
        backend.train_step([], 0)
    with pytest.raises(AglError, match="needs GPUs"):
        backend.run_distributed("/x.parquet")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    corpus = [" ".join(random.Random(i).choices("0123456789", k=8)) for i in range(20)]
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), corpus, vocab_size=40, seed=0)


def test_tasks_parquet_is_read_by_verls_dataset(tmp_path, tiny_model):
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    tasks = [Task(task_id=f"task-{i}", input={"question": f"{i} + 1"}) for i in range(3)]
    path = write_tasks_parquet(tasks, tmp_path / "train.parquet")
    cfg = compose_trainer_config(settings(model_path=str(tiny_model)), train_files=str(path))
    dataset = RLHFDataset(str(path), AutoTokenizer.from_pretrained(tiny_model), cfg.data)
    assert len(dataset) == 3
    row = dataset[1]
    assert row["extra_info"]["task_id"] == "task-1"
    assert row["agent_name"] == AGENT_LOOP_NAME


def _transition(step, prompt, response, logprobs, reward, source="engine"):
    return Transition(
        rollout_id="ro-1",
        task_id="t",
        step=step,
        prompt_ids=prompt,
        response_ids=response,
        response_logprobs=logprobs,
        reward=reward,
        token_source=source,
    )


def test_transitions_become_agent_loop_outputs():
    transitions = [
        _transition(1, [1, 2, 3, 4, 5], [6, 7, 8], [-0.1, -0.2, -0.3], 1.0),
        _transition(0, [1, 2], [3, 4], [-0.5, -0.6], 1.0),
        _transition(2, [], [], None, 1.0, source="text"),
    ]
    outputs = transitions_to_outputs(transitions, response_length=2)
    assert [o.prompt_ids for o in outputs] == [[1, 2], [1, 2, 3, 4, 5]]  # call order, text left out
    assert outputs[1].response_ids == [6, 7] and outputs[1].response_mask == [1, 1]
    assert outputs[1].response_logprobs == pytest.approx([-0.1, -0.2])
    assert outputs[0].response_logprobs == pytest.approx([-0.5, -0.6])
    assert outputs[0].reward_score is None and outputs[1].reward_score == 1.0
    as_dict = outputs[1].as_dict()  # what verl's TransferQueue worker stores
    assert as_dict["rm_scores"].tolist() == [0.0, 1.0]
    assert as_dict["rollout_log_probs"].shape == (2,)
    assert transitions_to_outputs([transitions[2]]) == []


def _fake_runner(store, stop: threading.Event, reward: float):
    """A runner stand-in: claims rollouts and records what the gateway would (two LLM calls) plus a reward."""
    while not stop.is_set():
        for rollout in store.claim("runner-1", limit=4):
            for seq in range(2):
                store.add_llm_calls(
                    [
                        LLMCall(
                            call_id=f"{rollout.rollout_id}-{seq}",
                            rollout_id=rollout.rollout_id,
                            seq=seq,
                            prompt_ids=[1, 2, seq],
                            response_ids=[5, 6],
                            response_logprobs=[-0.5, -0.25],
                        )
                    ]
                )
            store.add_rewards([Reward(rollout_id=rollout.rollout_id, value=reward)])
            store.flush()
            store.finish(rollout.rollout_id, RolloutStatus.SUCCEEDED)
        time.sleep(0.02)


def test_bridge_enqueues_waits_and_returns_gateway_tokens(sqlite_store):
    sqlite_store.add_tasks([Task(task_id="t1", input={"q": 1})])
    stop = threading.Event()
    runner = threading.Thread(target=_fake_runner, args=(sqlite_store, stop, 0.75), daemon=True)
    runner.start()
    try:
        transitions = RolloutBridge(sqlite_store, timeout_s=20).run("t1", step=3)
    finally:
        stop.set()
        runner.join()
    assert [list(t.prompt_ids) for t in transitions] == [[1, 2, 0], [1, 2, 1]]
    assert all(t.token_source == "engine" and t.reward == 0.75 and t.task_id == "t1" for t in transitions)
    outputs = transitions_to_outputs(transitions)
    assert len(outputs) == 2 and outputs[-1].reward_score == 0.75
    assert outputs[0].response_logprobs == pytest.approx([-0.5, -0.25])


def test_bridge_cancels_on_timeout(sqlite_store):
    sqlite_store.add_tasks([Task(task_id="t2", input={})])
    assert RolloutBridge(sqlite_store, timeout_s=0.2).run("t2") == []
    (rollout,) = list(sqlite_store.query_rollouts())
    assert rollout.status == RolloutStatus.CANCELLED


@pytest.mark.slow
def test_agent_loop_runs_inside_a_ray_actor(tmp_path, tiny_model):
    """Ray in local mode: verl's agent-loop class, built the way verl's worker builds it, in a Ray actor."""
    import ray

    from agl.store.sqlite import SqliteStore

    db = tmp_path / "agl.db"
    store = SqliteStore(db)
    store.add_tasks([Task(task_id="t-ray", input={"q": 1})])
    cfg = compose_trainer_config(
        settings(model_path=str(tiny_model), distributed={"train_files": "/x.parquet", "max_response_length": 8})
    )

    @ray.remote(num_cpus=1)
    class LoopHost:
        def run(self, cfg, model_path, store_url):
            import asyncio

            from transformers import AutoTokenizer
            from verl.experimental.agent_loop.agent_loop import DictConfigWrap

            from agl_verl.distributed import AglAgentLoop

            loop = AglAgentLoop(
                trainer_config=DictConfigWrap(cfg),
                server_manager=None,
                tokenizer=AutoTokenizer.from_pretrained(model_path),
                processor=None,
                dataset_cls=None,
                data_config=DictConfigWrap(cfg.data),
                store_url=store_url,
                rollout_timeout_s=20,
            )
            outputs = asyncio.run(loop.run({}, extra_info={"task_id": "t-ray"}, global_steps=1))
            return [(o.prompt_ids, o.response_ids, o.reward_score) for o in outputs]

    stop = threading.Event()
    runner = threading.Thread(target=_fake_runner, args=(store, stop, 1.0), daemon=True)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        runner.start()
        result = ray.get(LoopHost.remote().run.remote(cfg, str(tiny_model), str(db)), timeout=120)
    finally:
        stop.set()
        runner.join()
        ray.shutdown()
        store.close()
    assert result == [([1, 2, 0], [5, 6], None), ([1, 2, 1], [5, 6], 1.0)]
