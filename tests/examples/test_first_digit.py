"""The whole training loop end to end on the tiny model: LangChain agent, gateway,
transformers engine, reward plugin, transitions, verl's GRPO in the local backend.

The main job (``make train``) needs ~150 steps to learn to read the first digit; this
test asks for something a few steps can show: with a reward plugin that pays for
answering with a digit at all, the held-out reward of the same agent rises. Seeds are
fixed; the rise asked for is far beyond what sampling noise gives on 64 tasks.
"""

from __future__ import annotations

import pytest

import agl
from agl_trainer import Trainer

pytestmark = pytest.mark.slow


class DigitFormatReward:
    """1 when the answer is a single digit, else 0 (the user's reward plugin, in code)."""

    @agl.hookimpl
    def agl_reward(self, rollout, spans, llm_calls, rewards):
        answer = (rollout.output or "").strip()
        return 1.0 if len(answer) == 1 and answer.isdigit() else 0.0


@pytest.fixture
def example():
    from examples.first_digit import agent, tasks, warmup

    return agent, tasks, warmup


def test_held_out_reward_rises_in_a_few_steps(example, tmp_path):
    agent, tasks, warmup = example
    from agl_verl.models import build_tiny_model

    random_model = build_tiny_model(tmp_path / "random", tasks.corpus(), seed=0)
    prompts = [
        [{"role": m.type.replace("human", "user"), "content": m.content} for m in agent.prompt.format_messages(**t)]
        for t in tasks.make_tasks(256, seed=3)
    ]
    model = warmup.warm_up(random_model, tmp_path / "base", prompts, steps=4)
    plugin = DigitFormatReward()
    agl.register_plugin(plugin, name="digit-format")
    try:
        result = Trainer(
            {
                "workdir": str(tmp_path / "run"),
                "store": f"sqlite:///{tmp_path / 'agl.db'}",
                "steps": 8,
                "batch_size": 8,
                "n_rollouts": 8,
                "seed": 0,
                "progress": False,
                "plot": False,
                "backend": {
                    "name": "verl",
                    "config": {
                        "model_path": str(model),
                        "lr": 5e-3,
                        "seed": 0,
                        "micro_batch_size": 64,
                        "workdir": str(tmp_path / "verl"),
                    },
                },
                "engine": {"name": "transformers", "config": {"model_path": str(model), "seed": 0}},
                "rollout": {"concurrency": 16, "timeout_s": 60, "resources": {"max_tokens": 1}},
            }
        ).fit(agent.first_digit_agent, tasks.make_tasks(64, seed=1), tasks.make_tasks(64, seed=2))
    finally:
        agl.plugins.unregister(plugin)
    before, after = result.before["val_reward_mean"], result.after["val_reward_mean"]
    print(f"held-out format reward {before:.3f} -> {after:.3f}")
    assert result.steps_completed == 8
    assert after >= before + 0.3, (before, after)
    assert [r["model_version"] for r in result.history if r.get("kind") == "train"][-1] == "step-7"


def test_training_tasks_are_distinct_and_never_held_out_ones(example):
    _, tasks, _ = example
    held_out = tasks.make_tasks(200, seed=2)
    train = tasks.make_tasks(2400, seed=1, exclude=held_out)
    digits = [t["digits"] for t in train]
    assert len(set(digits)) == 2400
    assert not set(digits) & {t["digits"] for t in held_out}
    assert all(t["answer"] == t["digits"][0] for t in train)
    assert train == tasks.make_tasks(2400, seed=1, exclude=held_out)  # reproducible
    with pytest.raises(ValueError, match="n: only 9800 distinct tasks"):
        tasks.make_tasks(9801, seed=1, exclude=held_out)
