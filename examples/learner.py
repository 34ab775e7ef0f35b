"""The learner the tool-using examples share: SmolLM2 with a LoRA adapter, updated by agl-verl's
local learner on the CPU with verl's GRPO advantages and PPO clip loss; and the trainer config of
one of their runs (:func:`run_config`), which each example's ``config.py`` fills with its choices."""

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


CONCURRENCY = 16
"""Rollouts at once. On 2 cores prompt prefill dominates, so more at once adds little throughput and makes
every call wait longer (at 32, some of the SQL agent's base-model val rollouts ran past a 600 s timeout)."""
RUN_KEYS = ("seed", "workdir", "model_path")


def run_config(
    run: dict[str, Any],
    defaults: dict[str, int],
    *,
    lr: float,
    temperature: float,
    transitions: dict[str, Any],
    timeout_s: float,
    agent_max_tokens: bool = False,
) -> dict[str, Any]:
    """The :class:`agl_trainer.TrainerConfig` dict of one run of an example.

    ``run`` holds the run's ``seed``, ``workdir`` and ``model_path``, and may override any
    of ``defaults`` (the example's ``steps``, ``batch_size``, ``n_rollouts`` and
    ``max_response_tokens``). The test split is evaluated greedily before the first step
    and after the last one only (``val_every: 0``). ``agent_max_tokens`` tells the agent
    the response cap too (``resources["max_tokens"]``).
    """
    unknown = sorted(set(run) - {*RUN_KEYS, *defaults})
    missing = [key for key in RUN_KEYS if key not in run]
    if unknown or missing:
        raise TypeError(f"run: unknown {unknown}, missing {missing}")
    run = {**defaults, **run}
    workdir, model_path, seed, cap = Path(run["workdir"]), run["model_path"], run["seed"], run["max_response_tokens"]
    resources: dict[str, Any] = {"temperature": temperature}
    if agent_max_tokens:
        resources["max_tokens"] = cap
    backend = backend_config(model_path=model_path, lr=lr, seed=seed, workdir=workdir, temperature=temperature)
    return {
        "workdir": str(workdir),
        "store": f"sqlite:///{workdir.resolve() / 'agl.db'}",
        "seed": seed,
        "steps": run["steps"],
        "batch_size": run["batch_size"],
        "n_rollouts": run["n_rollouts"],
        "val_every": 0,
        "val_temperature": 0.0,
        "transitions": dict(transitions),
        "backend": {"name": "verl", "config": backend},
        "engine": {"name": "transformers", "config": {"model_path": str(model_path), "seed": seed}},
        "rollout": {
            "concurrency": min(run["batch_size"] * run["n_rollouts"], CONCURRENCY),
            "timeout_s": timeout_s,
            "max_attempts": 1,
            "max_response_tokens": cap,
            "resources": resources,
        },
    }
