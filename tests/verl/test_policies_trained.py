"""Policies on the real parts: the transformers engine serving two adapters, the verl backend training one.

A tiny random model stands in for SmolLM2 (what is checked is which weights move, not learning).
Two roles ask for their own model names: ``writer`` trains a LoRA adapter, ``critic`` is frozen
at a LoRA adapter given in the config. After two steps of training, the critic's weights in the
engine are bit-identical to the adapter it was given, and the writer's have moved.
"""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest

import agl
from agl_trainer import Trainer
from tests.verl.conftest import tiny_run_config
from tests.verl.test_multi_adapter import make_adapter

pytestmark = pytest.mark.slow

WRITER, CRITIC = "writer-model", "critic-model"


def two_roles(task_input, ctx):
    """One call per role; reward 1 when the writer's answer is longer than the critic's (varies by sample)."""
    lengths = {}
    with httpx.Client(base_url=ctx.base_url, headers={"Authorization": f"Bearer {ctx.api_key}"}, timeout=60) as http:
        for model in (WRITER, CRITIC):
            body = {"model": model, "messages": [{"role": "user", "content": task_input["q"]}], "max_tokens": 6}
            r = http.post("/chat/completions", json={**body, "temperature": 1.0})
            r.raise_for_status()
            lengths[model] = len(r.json()["choices"][0]["message"]["content"])
    agl.emit_reward(float(lengths[WRITER] > lengths[CRITIC]))


def weights_digest(model, adapter: str | None) -> str:
    """A digest of the base model's parameters and, where given, one peft adapter's."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        lora = ".lora_" in name
        if lora and (adapter is None or f".{adapter}." not in name + "."):
            continue
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def test_a_frozen_policys_weights_are_bit_identical_after_training(tiny_model_dir, tmp_path):
    critic = make_adapter(tiny_model_dir, tmp_path / "critic-adapter", seed=7)
    files_before = {p.name: p.read_bytes() for p in (tmp_path / "critic-adapter").iterdir()}
    config = tiny_run_config(
        tiny_model_dir,
        tmp_path,
        backend={"lr": 1e-2},
        concurrency=8,
        steps=2,
        batch_size=2,
        n_rollouts=4,
        policies=[
            {"name": "writer", "models": [WRITER]},
            {"name": "critic", "models": [CRITIC], "train": False, "weights": critic},
        ],
    )
    trainer = Trainer(config)
    engine = None

    class Watch:
        """Keeps the engine and the frozen adapter's digest as served at the first step's start."""

        digest = None

        @agl.hookimpl
        def agl_rollout_ended(self, rollout):
            nonlocal engine
            engine = trainer._engine
            if Watch.digest is None:
                adapters = engine.adapters
                Watch.digest = weights_digest(adapters.model, adapters.route(engine.policy_model("critic"))[0])

    agl.register_plugin(Watch(), name="watch-frozen")
    tasks = [{"input": {"q": f"question {i}"}} for i in range(2)]
    result = trainer.fit(two_roles, tasks)

    assert result.steps_completed == 2
    adapters = engine.adapters  # the engine is stopped, its weights are still there to read
    critic_name, critic_version = adapters.route(engine.policy_model("critic"))
    writer_name, writer_version = adapters.route(engine.policy_model("writer"))
    assert (critic_version, writer_version) == ("critic-weights", "writer-step-2")
    assert weights_digest(adapters.model, critic_name) == Watch.digest  # the frozen policy, bit for bit
    assert {p.name: p.read_bytes() for p in (tmp_path / "critic-adapter").iterdir()} == files_before
    # the writer's adapter did move (its LoRA B starts at zero; training made it non-zero)
    moved = [t for n, t in adapters.model.state_dict().items() if f".lora_B.{writer_name}." in n + "."]
    assert moved and any(t.abs().sum() > 0 for t in moved)
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert state["policy_versions"] == {"writer": "writer-step-2", "critic": "critic-weights"}
    assert not (tmp_path / "verl" / "versions" / "critic-step-1").exists()
