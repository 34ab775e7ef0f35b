"""The trainer config (``train.yaml`` holds the same for ``agl train``).

One agent (``solver``) makes one call an episode: the calculator call whose result the
agent reports as its answer (or a text answer). Credit ``broadcast`` gives it the
episode's reward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

STEPS = 10
BATCH_SIZE = 8
N_ROLLOUTS = 4
MAX_RESPONSE_TOKENS = 64
"""A call to the calculator is about 45 tokens."""
LR = 3e-4
CONCURRENCY = 16
LORA = {"r": 16, "alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
TRANSITIONS = {"credit": "broadcast", "agents": None}


def trainer_config(
    *,
    seed: int,
    workdir: Path,
    model_path: str | Path,
    steps: int = STEPS,
    batch_size: int = BATCH_SIZE,
    n_rollouts: int = N_ROLLOUTS,
    max_response_tokens: int = MAX_RESPONSE_TOKENS,
) -> dict[str, Any]:
    """The :class:`agl_trainer.TrainerConfig` dict of one run."""
    return {
        "workdir": str(workdir),
        "store": f"sqlite:///{Path(workdir).resolve() / 'agl.db'}",
        "seed": seed,
        "steps": steps,
        "batch_size": batch_size,
        "n_rollouts": n_rollouts,
        "val_every": 0,
        "val_temperature": 0.0,
        "transitions": dict(TRANSITIONS),
        "backend": {
            "name": "verl",
            "config": {
                "model_path": str(model_path),
                "lr": LR,
                "adv_estimator": "grpo",
                "policy_loss": "vanilla",
                "micro_batch_size": 16,
                "seed": seed,
                "workdir": str(workdir / "verl"),
                "lora": dict(LORA),
            },
        },
        "engine": {"name": "transformers", "config": {"model_path": str(model_path), "seed": seed}},
        "rollout": {
            "concurrency": min(batch_size * n_rollouts, CONCURRENCY),
            "timeout_s": 1800,
            "max_attempts": 1,
            "max_response_tokens": max_response_tokens,
        },
    }
