"""Record real training steps of an example as fixtures (:mod:`tests.benchmarks.step_fixtures`).

The example's own trainer config (its spec, seed and defaults), in a temporary work
directory, with no test-split evaluation: ``Trainer.fit`` gets no val tasks, so the
before and after evaluations of ``python -m examples.<agent>.train`` do not run.
"""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path
from typing import Any

import agl
from tests.benchmarks.step_fixtures import DATA_DIR, MEASURED_KEYS, Call, StepFixture, write_fixture

AGENTS = ("calc_agent", "rag_agent", "sql_agent")


class TransitionCapture:
    """A plugin that keeps each step's transitions as the backend gets them."""

    def __init__(self) -> None:
        self.by_step: dict[int, list[dict[str, Any]]] = {}

    @agl.hookimpl
    def agl_transitions_built(self, step, transitions) -> None:
        """Keep ``step``'s transitions (as JSON)."""
        self.by_step[step] = [t.model_dump(mode="json", exclude_defaults=True) for t in transitions]


def recorded_call(call: Any, temperature: float, cap: int) -> Call:
    """A store's :class:`agl.schema.LLMCall` as a fixture's call."""
    request = call.request or {}
    max_tokens = request.get("max_completion_tokens") or request.get("max_tokens") or call.max_response_tokens or cap
    return Call(
        prompt_ids=list(call.prompt_ids),
        response_ids=list(call.response_ids),
        temperature=float(request.get("temperature", temperature)),
        max_tokens=int(max_tokens),
    )


def step_rollouts(store: Any, step: int, temperature: float, cap: int) -> list[list[Call]]:
    """The calls of each training rollout of ``step``, in the order the trainer enqueued them."""
    rollouts = [r for r in store.query_rollouts(step=step) if r.mode == "train"]
    out = []
    for rollout in rollouts:
        calls = [c for c in store.query_llm_calls(rollout_id=rollout.rollout_id) if not c.aborted]
        out.append([recorded_call(c, temperature, cap) for c in calls])
    return out


def record(agent: str, steps: int, seed: int = 0, directory: Path = DATA_DIR) -> list[Path]:
    """Train ``agent`` for ``steps`` steps and write one fixture a step; returns their paths."""
    import torch

    from agl.store.base import open_store
    from agl_trainer import Trainer
    from agl_verl.models import smollm2_dir
    from examples.training import parse_train_args, train_metrics

    if agent not in AGENTS:
        raise ValueError(f"agent: {agent!r} is not one of {', '.join(AGENTS)}")
    spec = importlib.import_module(f"examples.{agent}.spec").SPEC
    args, train = parse_train_args(spec, ["--seed", str(seed), "--steps", str(steps)], None)
    torch.set_num_threads(args.threads)
    spec.register_reward()
    capture = TransitionCapture()
    agl.register_plugin(capture, name="bench-step-transitions")
    paths = []
    try:
        with tempfile.TemporaryDirectory(prefix=f"agl-record-{agent}-") as tmp:
            workdir = Path(tmp)
            config = spec.trainer_config(
                args,
                seed=seed,
                workdir=workdir,
                model_path=smollm2_dir(),
                steps=steps,
                batch_size=args.batch_size,
                n_rollouts=args.n_rollouts,
                max_response_tokens=args.max_response_tokens,
            )
            config["progress"] = False
            Trainer(config).fit(spec.agent, train_tasks=train, val_tasks=None)
            settings = {
                "seed": seed,
                "lr": config["backend"]["config"]["lr"],
                "temperature": config["rollout"]["resources"]["temperature"],
                "concurrency": config["rollout"]["concurrency"],
                "max_response_tokens": args.max_response_tokens,
            }
            store = open_store(config["store"], create=False)
            try:
                for metrics in train_metrics(workdir):
                    step = metrics["step"]
                    rollouts = step_rollouts(store, step, settings["temperature"], args.max_response_tokens)
                    measured = {k: round(float(metrics[k]), 3) for k in MEASURED_KEYS if k in metrics}
                    fixture = StepFixture(agent, step, rollouts, capture.by_step.get(step, []), measured, settings)
                    paths.append(write_fixture(fixture, directory))
            finally:
                store.close()
    finally:
        agl.plugins.unregister(capture)
    return paths
