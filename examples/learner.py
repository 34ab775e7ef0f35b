"""The learner the tool-using examples share: SmolLM2 with a LoRA adapter, updated by agl-verl's
local learner on the CPU with verl's GRPO advantages and PPO clip loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LORA = {"r": 16, "alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
MICRO_BATCH_SIZE = 8
"""Transitions per forward/backward pass. The learner sorts a batch's transitions by length, cuts each
micro-batch to its own rows and computes logits for the responses alone; the update is the same sum.
On a retrieval-agent step's batch (16 transitions) an update took 46.9 s at 8 against 74.2 s for the
learner before (``python -m tests.benchmarks.bench_learner_padding``, one run alone)."""
GRADIENT_CHECKPOINTING = True
"""The learner recomputes each layer's activations in the backward pass: the same update, bit for
bit, in less memory. The calculator agent's seed 0 with it gave its committed figures exactly, in
18 min, with the training process's peak resident memory at 6.9 GB; without it, 10.6 GB over the
same seed's first two steps and 11.2 GB over an earlier whole run (one run each; the update alone:
``python -m tests.benchmarks.bench_learner_memory``)."""


def backend_config(
    *, model_path: str | Path, lr: float, seed: int, workdir: Path, temperature: float
) -> dict[str, Any]:
    """The ``verl`` backend's settings of one run (``workdir`` is the run's; the learner's goes below it)."""
    return {
        "model_path": str(model_path),
        "lr": lr,
        "adv_estimator": "grpo",
        "policy_loss": "vanilla",
        "micro_batch_size": MICRO_BATCH_SIZE,
        "gradient_checkpointing": GRADIENT_CHECKPOINTING,
        "seed": seed,
        "workdir": str(workdir / "verl"),
        "lora": dict(LORA),
        "temperature": temperature,
    }
