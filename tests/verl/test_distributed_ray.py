"""Distributed mode on a Ray local cluster, through verl's own agent-loop manager (issue 47).

verl 0.9's ``AgentLoopManagerTQ`` starts its ``AgentLoopWorkerTQ`` Ray actors from the config
agl composes; they build :class:`AglAgentLoop` per sample (hydra), which registers verl's
rollout servers with agl's gateway through its admin route and runs agl rollouts that an
in-process runner's agent serves through that gateway. verl's worker scores, packs
(``list_of_dict_to_tensordict``) and stores the outputs in TransferQueue, where this test reads
them as verl's trainer does before its advantage step.

What is not real: the rollout server. verl's vLLM server needs CUDA, so the address in verl's
load balancer (its own ``GlobalRequestLoadBalancer`` actor, as verl creates it) is a
:class:`tests.fake_engine.FakeEngine`, an OpenAI-compatible server returning token ids and
log-probs as vLLM does.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from agl.schema import Task
from agl_verl.config import parse_settings
from agl_verl.distributed import compose_trainer_config, write_agent_loop_config, write_tasks_parquet

pytestmark = pytest.mark.slow

_turns = itertools.count()
_turns_lock = threading.Lock()


def two_call_agent(task, ctx=None):
    """Two chat calls through the gateway; every other run answers right (so groups differ)."""
    from openai import OpenAI

    client = OpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0)
    for text in ("first", "second"):
        client.chat.completions.create(model="agl-policy", messages=[{"role": "user", "content": text}])
    with _turns_lock:
        right = next(_turns) % 2 == 0
    return {"answer": task["q"] if right else -1}


def _wait_for_groups(tq, uids, timeout_s=240.0):
    """The TransferQueue keys of every finished prompt group's outputs (as verl's replay buffer waits)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listed = tq.kv_list("train").get("train", {})
        statuses = {uid: (listed.get(uid) or {}).get("status") for uid in uids}
        if all(s in ("finished", "failure") for s in statuses.values()):
            assert set(statuses.values()) == {"finished"}, statuses
            return sorted(k for k in listed if k.rsplit("_", 2)[0] in uids and k not in uids)
        time.sleep(0.5)
    raise AssertionError(f"prompt groups not finished: {statuses}")


SETTINGS = {
    "mode": "distributed",
    "adv_estimator": "rloo",
    "distributed": {
        "n_gpus_per_node": 1,
        "rollout_n": 2,
        "train_batch_size": 2,
        "ppo_mini_batch_size": 2,
        "max_prompt_length": 64,
        "max_response_length": 64,
        "agent_loop_workers": 1,
        "overrides": ["transfer_queue.backend.SimpleStorage.num_data_storage_units=1"],
    },
}


@pytest.fixture
def services(tmp_path, tiny_model_dir):
    """agl's side, as ``agl train`` runs it: a served SQLite store, the gateway with no upstream,
    an in-process runner of :func:`two_call_agent`; and the stand-in for verl's vLLM server."""
    from agl.capture.writer import BufferedWriter
    from agl.runner import Runner
    from agl.store.sqlite import SqliteStore
    from agl_trainer.gateway import Gateway
    from agl_trainer.store_server.server import ServerThread
    from tests.fake_engine import FakeEngine

    store = SqliteStore(tmp_path / "agl.db")
    tasks = [Task(task_id=f"t{i}", input={"q": i}) for i in range(2)]
    store.add_tasks(tasks)
    server = ServerThread(store, token="store-token").start()
    engine = FakeEngine(model=str(tiny_model_dir)).start()
    writer = BufferedWriter(store)
    gateway = Gateway(store, [], admin_token="gateway-admin", writer=writer).start()
    runner = Runner(
        two_call_agent, store, gateway_url=gateway.url, api_key=gateway.token, rollout_keys=gateway.keys, writer=writer
    )
    runner_thread = threading.Thread(target=runner.run_sync, daemon=True)
    runner_thread.start()
    yield SimpleNamespace(store=store, tasks=tasks, server=server, engine=engine, gateway=gateway)
    runner.stop()
    runner_thread.join(30)
    runner.close()
    gateway.stop()
    writer.close()
    engine.stop()
    server.stop()
    store.close()


def _submit(cfg, train, tokenizer_dir, manager):
    """What verl's trainer does with a dataloader batch (``trainer_base._validate`` / ``fit``)."""
    import transfer_queue as tq
    from transformers import AutoTokenizer
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    dataset = RLHFDataset(str(train), AutoTokenizer.from_pretrained(tokenizer_dir), cfg.data)
    batch_dict = collate_fn([dataset[i] for i in range(len(dataset))])
    batch_dict["uid"] = np.array([f"uid{i}" for i in range(len(dataset))], dtype=object)
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    tags = [{"is_prompt": True, "status": "pending", "global_steps": 1} for _ in range(len(batch))]
    tq.kv_batch_put(keys=list(batch["uid"]), partition_id="train", tags=tags)
    manager.generate_sequences(batch)
    return set(batch_dict["uid"])


def _advantage_inputs(keys):
    """verl's ``trainer_base._compute_advantage`` up to its advantage call: the outputs read back."""
    import transfer_queue as tq
    from verl.protocol import DataProto

    fields = ["uid", "response_mask", "rm_scores", "rollout_log_probs"]
    data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=fields)
    data = DataProto(batch=data.to_padded_tensor())
    data.batch["token_level_rewards"] = data.batch["rm_scores"]
    data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
    return data


def test_agent_loops_run_through_verls_manager_on_ray(tmp_path, tiny_model_dir, services):
    import ray
    import transfer_queue as tq
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.utils.import_utils import load_class_from_fqn
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    from agl.store.sqlite import SqliteStore
    from agl_verl.advantages import final_rows, rollout_advantages

    train = write_tasks_parquet(services.tasks, tmp_path / "train.parquet")
    plugin = "tests.verl.reward_plugin_for_workers"
    loops = write_agent_loop_config(
        tmp_path / "loops.yaml",
        store_url=services.server.url,
        rollout_timeout_s=120,
        transition_config={"credit": "broadcast", "normalize": "none"},
        plugins=[plugin],
        gateway_url=services.gateway.url,
        run_id="raytest",
    )
    settings = parse_settings({**SETTINGS, "model_path": str(tiny_model_dir)})
    cfg = compose_trainer_config(settings, train_files=str(train), agent_loop_config=str(loops))
    env = {"AGL_STORE_TOKEN": "store-token", "AGL_GATEWAY_ADMIN_TOKEN": "gateway-admin", "TRANSFER_QUEUE_ENABLE": "1"}
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    try:
        tq.init(cfg.transfer_queue)
        address = services.engine.url.removeprefix("http://").removesuffix("/v1")
        balancer = get_router_handle(servers={address: None})  # verl's own load balancer actor
        # the manager class verl's TaskRunnerV1 loads from the config: agl's AgentLoopManagerTQ
        manager_cls = load_class_from_fqn(cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class, "manager")
        llm_client = LLMServerClient(cfg, load_balancer_handle=balancer)
        roles = {"teacher_client": None, "reward_loop_worker_handles": None}
        manager = manager_cls.create(config=cfg, llm_client=llm_client, **roles)
        setups = manager.worker_setups  # agl's context, set up in the worker at startup
        write_agent_loop_config(loops, store_url=services.server.url, rollout_timeout_s=5, plugins=["no_such_module"])
        with pytest.raises(Exception, match=r"plugins\[0\] 'no_such_module' cannot be loaded"):
            manager_cls.create(config=cfg, llm_client=llm_client, **roles)
        keys = _wait_for_groups(tq, _submit(cfg, train, tiny_model_dir, manager))
        data = _advantage_inputs(keys)
        finals, session_of_row = final_rows(keys)
        expected = compute_advantage(data.select_idxs(finals), adv_estimator="rloo", config=cfg.algorithm)
        advantages = rollout_advantages(data, keys, "rloo", config=cfg.algorithm).batch["advantages"]
    finally:
        tq.close()
        ray.shutdown()

    assert setups == [{"plugins": [plugin], "reward_plugins": [plugin], "gateway": True}]
    # registered by the agent-loop workers from verl's load balancer
    assert [r.url for r in services.gateway.router.replicas] == [services.engine.url]
    assert len(keys) == 8  # 2 prompts x rollout.n 2 x 2 calls, each call its own sample
    chats = [r for r in services.engine.requests if "messages" in r]
    assert len(chats) == 8  # every call went through the gateway to the registered server
    scores = data.batch["rm_scores"].sum(dim=1)
    assert sorted(set(scores.tolist())) == [0.0, 1.0]  # the reward plugin, loaded in the workers, scored them
    per_rollout = expected.batch["advantages"][torch.arange(len(finals)), 0]
    mask = data.batch["response_mask"].bool()
    for row, session in enumerate(session_of_row):
        assert torch.allclose(advantages[row][mask[row]], per_rollout[session].expand(int(mask[row].sum())))
    assert data.batch["rollout_log_probs"][mask].lt(0).all()  # the engine's log-probs, through the gateway
    ended = list(SqliteStore(tmp_path / "agl.db").query_rollouts())
    assert len(ended) == 4 and all(r.rollout_id.startswith("verl-raytest-") for r in ended)
