"""Distributed mode up to the GPU boundary (issue 47): what verl's Ray workers and trainer do with
agl's agent loop, run on CPU with verl's own functions and agl's real store, gateway and plugins.

verl's FSDP actor and vLLM servers need CUDA; :class:`tests.fake_engine.FakeEngine` stands in
for a vLLM server (an OpenAI-compatible server returning token ids and log-probs).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from agl.errors import AglError, ConfigError
from agl.schema import RolloutStatus, Task, Transition
from agl_verl.config import parse_settings
from agl_verl.distributed import (
    MissingLogprobsError,
    check_servable,
    compose_trainer_config,
    transitions_to_outputs,
    write_tasks_parquet,
)
from agl_verl.rollout_bridge import RolloutBridge, take_back_rollouts


def settings(**distributed):
    return parse_settings(
        {
            "mode": "distributed",
            "model_path": "/models/qwen",
            "adv_estimator": "grpo",
            "distributed": {"train_files": "/data/train.parquet", "n_gpus_per_node": 8, **distributed},
        }
    )


def transition(rollout, step, response, logprobs, reward):
    return Transition(
        rollout_id=rollout,
        task_id="t",
        step=step,
        prompt_ids=[1, 2, 3][: step + 2],
        response_ids=response,
        response_logprobs=logprobs,
        reward=reward,
        token_source="engine",
    )


# -- item 7: partial log-probs, verl's tensordict and advantage code on the outputs -----------------


def test_partial_logprobs_are_refused_naming_the_call():
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    partial = [transition("ro-a", 0, [5, 6], [-0.1, -0.2], 1.0), transition("ro-a", 1, [7], None, 1.0)]
    with pytest.raises(MissingLogprobsError, match="rollout ro-a call 1: the engine recorded no log-probs"):
        transitions_to_outputs(partial)
    complete = [transition("ro-a", 0, [5, 6], [-0.1, -0.2], 1.0), transition("ro-a", 1, [7], [-0.3], 1.0)]
    fields = [o.as_dict() for o in transitions_to_outputs(complete)]
    batch = list_of_dict_to_tensordict(fields)  # what verl's TransferQueue worker stores
    assert batch["rollout_log_probs"][1].tolist() == pytest.approx([-0.3])


def _verl_batch(rollouts: dict[str, tuple[str, list[int], float]]):
    """The outputs of ``rollouts`` ({rollout: (uid, response lengths per call, reward)}) as verl's
    trainer holds them before its advantage step: TransferQueue keys, ``list_of_dict_to_tensordict``
    of each output's ``as_dict()``, padded into a ``DataProto`` with rewards on the last token."""
    from verl.protocol import DataProto
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    keys, fields = [], []
    sessions: dict[str, int] = {}
    for rollout, (uid, lengths, reward) in rollouts.items():
        session = sessions[uid] = sessions.get(uid, -1) + 1
        calls = [transition(rollout, i, [9] * n, [-0.5] * n, reward) for i, n in enumerate(lengths)]
        outputs = transitions_to_outputs(calls)
        for output in outputs[:-1]:  # what verl's worker does with the final output's reward
            output.reward_score = outputs[-1].reward_score
        for i, output in enumerate(outputs):
            keys.append(f"{uid}_{session}_{i}")
            fields.append({**output.as_dict(), "uid": uid})
    td = list_of_dict_to_tensordict(fields)
    mask = td["response_mask"].to_padded_tensor(0)
    scores = td["rm_scores"].to_padded_tensor(0.0)
    data = DataProto.from_dict({"response_mask": mask, "token_level_rewards": scores})
    data.non_tensor_batch["uid"] = np.array(list(td["uid"]), dtype=object)
    return data, keys


ROLLOUTS = {
    "ro-1": ("u0", [2, 3], 1.0),  # a 2-call rollout
    "ro-2": ("u0", [2], 0.0),  # a 1-call rollout of the same task
    "ro-3": ("u1", [1], 1.0),
    "ro-4": ("u1", [3, 1, 2], 0.5),
    "ro-5": ("u1", [2], 0.0),
}


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus", "opo", "gpg", "grpo_passk"])
def test_every_estimator_broadcasts_the_rollouts_advantage(estimator):
    """agl's advantage step equals verl's compute_advantage over one sample per rollout, broadcast."""
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from agl_verl.advantages import final_rows, rollout_advantages

    algorithm = compose_trainer_config(settings()).algorithm  # what verl's trainer passes as config
    data, keys = _verl_batch(ROLLOUTS)
    finals, _ = final_rows(keys)
    expected = compute_advantage(data.select_idxs(finals), adv_estimator=estimator, num_repeat=1, config=algorithm)
    per_rollout = expected.batch["advantages"][torch.arange(len(finals)), 0]
    out = rollout_advantages(data, keys, estimator, config=algorithm)
    adv, mask = out.batch["advantages"], out.batch["response_mask"]
    rows_of = {"ro-1": [0, 1], "ro-2": [2], "ro-3": [3], "ro-4": [4, 5, 6], "ro-5": [7]}
    for r, rows in enumerate(rows_of.values()):
        for row in rows:
            assert torch.allclose(adv[row][mask[row].bool()], per_rollout[r].expand(int(mask[row].sum())))
            assert (adv[row][~mask[row].bool()] == 0).all()


def test_rloo_counts_each_rollout_once():
    """The issue's case: a 2-call rollout (reward 1) and a 1-call rollout (reward 0) of one task."""
    from agl_verl.advantages import rollout_advantages

    data, keys = _verl_batch({"ro-1": ("u0", [2, 3], 1.0), "ro-2": ("u0", [2], 0.0)})
    out = rollout_advantages(data, keys, "rloo")
    first = out.batch["advantages"][:, 0].tolist()
    assert first == pytest.approx([1.0, 1.0, -1.0])  # verl's own V1 step gives 0.5, 0.5, -1.0


def test_install_replaces_verls_v1_advantage_step(monkeypatch):
    import importlib
    import sys
    import types

    from agl_verl import advantages

    fake = types.ModuleType(advantages.TRAINER_MODULE)
    fake.compute_advantage_for_multi_trajectories = object()
    monkeypatch.setitem(sys.modules, advantages.TRAINER_MODULE, fake)
    advantages.install()
    assert importlib.import_module(advantages.TRAINER_MODULE).compute_advantage_for_multi_trajectories is (
        advantages.rollout_advantages
    )


# -- item 5: one store client per worker process ---------------------------------------------------


@pytest.fixture
def http_store(tmp_path, monkeypatch):
    from agl.store.sqlite import SqliteStore
    from agl_trainer.store_server.server import ServerThread

    store = SqliteStore(tmp_path / "agl.db")
    server = ServerThread(store, token="store-token").start()
    monkeypatch.setenv("AGL_STORE_TOKEN", "store-token")
    yield store, server.url
    server.stop()
    store.close()


def _agent_loop(cfg, tokenizer, **entry):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from agl_verl.distributed import AglAgentLoop

    return AglAgentLoop(
        trainer_config=DictConfigWrap(cfg),
        server_manager=None,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=None,
        data_config=DictConfigWrap(cfg.data),
        **entry,
    )


def test_thread_count_stays_flat_over_100_agent_loops(http_store, tiny_model_dir):
    from transformers import AutoTokenizer

    from agl_verl.worker_context import close_worker_contexts

    _, url = http_store
    s = parse_settings({"mode": "distributed", "model_path": str(tiny_model_dir)})
    cfg = compose_trainer_config(s, train_files="/x")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    try:
        first = _agent_loop(cfg, tokenizer, store_url=url)
        after_first = threading.active_count()
        loops = [_agent_loop(cfg, tokenizer, store_url=url) for _ in range(100)]
        assert threading.active_count() == after_first
        assert all(loop.context is first.context for loop in loops)  # one store client for the process
    finally:
        close_worker_contexts()


# -- item 3: plugins in the workers, failing loudly --------------------------------------------------


def test_a_plugin_that_cannot_load_fails_the_worker_setup(http_store):
    from agl_verl.worker_context import WorkerSetupError, check_worker, close_worker_contexts

    _, url = http_store
    try:
        with pytest.raises(WorkerSetupError, match=r"plugins\[0\] 'no_such_reward_module' cannot be loaded"):
            check_worker({"store_url": url, "plugins": ["no_such_reward_module"]})
        checked = check_worker({"store_url": url, "plugins": ["tests.verl.reward_plugin_for_workers"]})
        assert "tests.verl.reward_plugin_for_workers" in checked["reward_plugins"]
    finally:
        close_worker_contexts()
        from agl.plugins import unregister

        unregister(name="tests.verl.reward_plugin_for_workers")


# -- items 2 and 4: the gateway finds verl's servers and serves the trained weights -------------------


def test_gateway_link_registers_verls_servers_once(sqlite_store):
    from openai import OpenAI

    from agl_trainer.gateway import Gateway
    from agl_verl.gateway_link import GatewayLink, server_urls
    from tests.fake_engine import FakeEngine

    with FakeEngine(model="/models/qwen") as engine, Gateway(sqlite_store, [], admin_token="admin") as gateway:
        client = OpenAI(base_url=gateway.url + "/v1", api_key=gateway.token, max_retries=0)
        with pytest.raises(Exception, match="502"):  # nothing registered yet: no engine answers
            client.chat.completions.create(model="agl-policy", messages=[{"role": "user", "content": "hi"}])
        link = GatewayLink(gateway.url, admin_token="admin")
        address = engine.url.removeprefix("http://").removesuffix("/v1")  # verl's host:port
        assert link.register([address]) is True
        assert link.register([address]) is False  # unchanged: no admin call
        answer = client.chat.completions.create(model="agl-policy", messages=[{"role": "user", "content": "hi"}])
        assert answer.choices[0].message.content.startswith("echo: hi")
        assert engine.requests[-1]["model"] == "/models/qwen"  # the name vLLM serves verl's synced weights under
        assert server_urls(["10.0.0.1:8000", "::1:9"]) == ["http://10.0.0.1:8000/v1", "http://[::1]:9/v1"]


def test_lora_is_merged_into_the_served_weights_and_unmerged_is_refused():
    from verl.utils.config import validate_config

    lora = {"r": 16, "alpha": 32, "target_modules": ["q_proj", "v_proj"]}
    cfg = compose_trainer_config(
        parse_settings({"mode": "distributed", "model_path": "/m", "lora": lora, "distributed": {"train_files": "/x"}})
    )
    assert cfg.actor_rollout_ref.model.lora_rank == 16
    assert cfg.actor_rollout_ref.model.lora.merge is True  # vLLM serves the merged weights under the base name
    validate_config(cfg, use_reference_policy=False, use_critic=False)  # merged: no vLLM LoRA check (no CUDA)
    unmerged = parse_settings(
        {
            "mode": "distributed",
            "model_path": "/m",
            "lora": lora,
            "distributed": {"overrides": ["actor_rollout_ref.model.lora.merge=False"]},
        }
    )
    with pytest.raises(AglError, match="would sample from the base model"):
        check_servable(unmerged)


# -- item 6: validation as configured, with the fields verl asks for --------------------------------


def test_validation_runs_only_on_the_val_file(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    none = compose_trainer_config(settings(test_freq=5), train_files="/train.parquet")
    assert none.trainer.val_before_train is False and none.trainer.test_freq == -1
    val_file = write_tasks_parquet([Task(task_id="v1", input={"q": 1})], tmp_path / "val.parquet", mode="val")
    cfg = compose_trainer_config(
        parse_settings({"mode": "distributed", "model_path": str(tiny_model_dir), "distributed": {"test_freq": 5}}),
        train_files="/train.parquet",
        val_files=str(val_file),
    )
    assert cfg.data.val_files == str(val_file) and cfg.trainer.val_before_train is True and cfg.trainer.test_freq == 5
    row = RLHFDataset(str(val_file), AutoTokenizer.from_pretrained(tiny_model_dir), cfg.data)[0]
    assert row["reward_model"]["ground_truth"] == '{"q": 1}'  # verl's validation reads reward_model
    assert row["extra_info"]["mode"] == "val"


# -- item 8: checkpoints, resume, rollouts taken back -----------------------------------------------


def test_checkpoints_by_default_and_resume_from_the_workdir(tmp_path):
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path, get_checkpoint_tracker_filename

    s = parse_settings(
        {"mode": "distributed", "model_path": "/m", "workdir": str(tmp_path), "distributed": {"train_files": "/x"}}
    )
    cfg = compose_trainer_config(s)
    assert cfg.trainer.save_freq == 10 and cfg.trainer.resume_mode == "auto"
    root = cfg.trainer.default_local_dir
    assert root == str(tmp_path.resolve() / "checkpoints")
    # what verl's _save_checkpoint leaves at step 10: the step's folder and the tracker file
    (Path(root) / "global_step_10" / "actor").mkdir(parents=True)
    Path(get_checkpoint_tracker_filename(root)).write_text("10")
    again = compose_trainer_config(s)  # a rerun of the same config
    assert find_latest_ckpt_path(again.trainer.default_local_dir) == str(Path(root) / "global_step_10")


def test_rollouts_left_by_a_crashed_attempt_are_taken_back(sqlite_store):
    sqlite_store.add_tasks([Task(task_id="t", input={})])
    crashed = RolloutBridge(sqlite_store, timeout_s=30, rollout_prefix="verl-run1-")
    waiting = threading.Thread(target=crashed.run, args=("t",), daemon=True)
    waiting.start()  # enqueued, never finished: its agent loop's process is gone
    other = RolloutBridge(sqlite_store, timeout_s=30, rollout_prefix="verl-run2-")
    other_waiting = threading.Thread(target=other.run, args=("t",), daemon=True)
    other_waiting.start()
    for _ in range(100):
        if len(list(sqlite_store.query_rollouts())) == 2:
            break
        threading.Event().wait(0.05)
    (claimed,) = sqlite_store.claim("runner", limit=1)
    taken = take_back_rollouts(sqlite_store, "verl-run1-")
    statuses = {r.rollout_id: r.status for r in sqlite_store.query_rollouts()}
    assert len(taken) == 1 and taken[0].startswith("verl-run1-")
    assert statuses[taken[0]] == RolloutStatus.CANCELLED
    assert [s for rid, s in statuses.items() if rid.startswith("verl-run2-")] != [RolloutStatus.CANCELLED]
    waiting.join(5)
    assert not waiting.is_alive()  # the waiting bridge saw its rollout end
    take_back_rollouts(sqlite_store, "verl-run2-")  # end the other run too, before its store closes
    other_waiting.join(5)
    assert not other_waiting.is_alive()


def test_run_id_survives_a_restart_of_the_run(tmp_path):
    from agl_trainer.config import parse_config
    from agl_verl.launch import DistributedRun, distributed_settings

    config = parse_config(
        {
            "workdir": str(tmp_path),
            "transitions": {"credit": "broadcast", "normalize": "none"},
            "backend": {"name": "verl", "config": {"mode": "distributed", "model_path": "/m"}},
        }
    )
    first = DistributedRun(config, distributed_settings(config))
    second = DistributedRun(config, distributed_settings(config))
    assert first.run_id == second.run_id and first.workdir == second.workdir == (tmp_path / "verl").resolve()
    assert first.settings.distributed.total_training_steps == config.steps


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("engine", {"name": "transformers"}, "engine: not in distributed mode"),
        ("policies", [{"name": "checker"}], "policies: not in distributed mode"),
        ("transitions", {"credit": "last", "normalize": "none"}, "transitions.credit: not in distributed mode"),
        ("transitions", {"credit": "broadcast"}, "transitions.normalize: not in distributed mode"),
    ],
)
def test_what_distributed_mode_cannot_honour_is_refused(tmp_path, field, value, message):
    from agl_trainer.config import parse_config
    from agl_verl.launch import DistributedRun, distributed_settings

    data = {
        "workdir": str(tmp_path),
        "transitions": {"credit": "broadcast", "normalize": "none"},
        "backend": {"name": "verl", "config": {"mode": "distributed", "model_path": "/m"}},
        field: value,
    }
    config = parse_config(data)
    with pytest.raises(ConfigError, match=message):
        DistributedRun(config, distributed_settings(config))


# -- item 9: one command ---------------------------------------------------------------------------


def echo_agent(task, ctx=None):
    """An agent for the CLI test (it never runs: no GPU, no rollout)."""
    return {"answer": task["q"]}


@pytest.mark.slow
def test_agl_train_runs_distributed_mode_up_to_the_gpus(tmp_path, tiny_model_dir):
    """``agl train --backend verl`` with the calculator's distributed config: config, data, gateway,
    runner and Ray workers (the reward plugin loaded in them), then a clear stop for want of GPUs."""
    import json
    import subprocess
    import sys

    import pandas as pd

    root = Path(__file__).resolve().parents[2]
    tasks = tmp_path / "train.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"t{i}", "input": {"q": i}}) + "\n" for i in range(4)))
    val = tmp_path / "val.jsonl"
    val.write_text(json.dumps({"task_id": "v0", "input": {"q": 9}}) + "\n")
    command = [
        sys.executable,
        "-c",
        "from agl_trainer.cli import main; raise SystemExit(main())",
        "train",
        "tests.verl.test_distributed_gpu_path:echo_agent",
        "--config",
        str(root / "examples/calc_agent/distributed.yaml"),
        "--model",
        str(tiny_model_dir),
        "--tasks",
        str(tasks),
        "--val",
        str(val),
        "--workdir",
        str(tmp_path / "run"),
        "--set",
        f"store=sqlite:///{tmp_path}/agl.db",
        "--set",
        "plugins=[tests.verl.reward_plugin_for_workers]",
    ]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "[validate_config] All configuration checks passed" in out, out
    assert "'reward_plugins': ['tests.verl.reward_plugin_for_workers']" in out, out  # loaded in a Ray worker
    assert "agl: error: mode='distributed' needs GPUs" in out, out
    data = tmp_path / "run" / "verl" / "data"
    assert len(pd.read_parquet(data / "train.parquet")) == 4 and len(pd.read_parquet(data / "val.parquet")) == 1
    entry = (tmp_path / "run" / "verl" / "agent_loops.yaml").read_text()
    assert "gateway_url: http://127.0.0.1:" in entry and "tests.verl.reward_plugin_for_workers" in entry
    assert "token" not in entry.lower()  # credentials travel in Ray's runtime environment, not the file


def test_a_worker_waits_for_many_rollouts_at_once(http_store):
    """verl runs every sample of a worker at once; each waits for its rollout in a thread. asyncio's
    default executor would let min(32, cores + 4) of them wait (6 on this machine), the rest queued."""
    import asyncio

    from agl_verl.worker_context import WorkerSetup, close_worker_contexts, worker_context

    store, url = http_store
    store.add_tasks([Task(task_id="t", input={})])
    context = worker_context(WorkerSetup(store_url=url, rollout_timeout_s=3.0, run_id="many"))
    seen = []

    async def samples():
        waiting = [asyncio.ensure_future(context.bridge.arun("t")) for _ in range(40)]
        for _ in range(100):
            await asyncio.sleep(0.05)
            seen.append(sum(r.status == RolloutStatus.QUEUED for r in store.query_rollouts()))
            if seen[-1] == 40:
                break
        return await asyncio.gather(*waiting)

    try:
        results = asyncio.run(samples())
    finally:
        close_worker_contexts()
    assert max(seen) == 40  # all 40 enqueued and waiting together
    assert results == [[]] * 40  # no runner: each timed out and was cancelled


@pytest.mark.parametrize("example", ["calc_agent", "sql_agent"])
def test_example_distributed_configs_pass_agls_and_verls_checks(tmp_path, example):
    """The examples' 8-GPU configs, as ``agl train`` reads them, through agl's refusals and verl's validate_config."""
    from verl.utils.config import validate_config

    from agl_trainer.config import apply_overrides, load_config, parse_config
    from agl_verl.distributed import write_agent_loop_config
    from agl_verl.launch import DistributedRun, distributed_settings

    root = Path(__file__).resolve().parents[2]
    data = load_config(root / "examples" / example / "distributed.yaml", []).model_dump(mode="json")
    data = apply_overrides(data, [f"workdir={tmp_path}", "backend.config.model_path=/models/Qwen2.5-1.5B-Instruct"])
    config = parse_config(data, "test")
    run = DistributedRun(config, distributed_settings(config))
    loops = write_agent_loop_config(tmp_path / "loops.yaml", store_url="http://127.0.0.1:1", rollout_timeout_s=60)
    cfg = compose_trainer_config(run.settings, train_files="/t.parquet", agent_loop_config=str(loops), val_files="/v")
    validate_config(cfg, use_reference_policy=False, use_critic=False)
    assert cfg.trainer.n_gpus_per_node == 8 and cfg.actor_rollout_ref.rollout.n == 8
    assert cfg.actor_rollout_ref.model.lora.merge is True and cfg.trainer.total_training_steps == 100
    assert cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class == "agl_verl.manager.AglAgentLoopManager"
