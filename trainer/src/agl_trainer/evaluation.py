"""Run an agent once on each of some tasks, outside training: evaluating a base model or a checkpoint.

.. code-block:: python

    from agl.store.base import open_store
    from agl_trainer.evaluation import evaluate

    store = open_store("sqlite:///runs/eval/agl.db")
    ended = evaluate(my_agent, tasks, store=store, model_path="models/base", adapter="runs/x/verl/versions/step-12")
    success = sum(r.output == t.input["answer"] for r, t in zip(ended, tasks)) / len(tasks)

Everything a training run's validation has is here: an engine serves the model (the
``transformers`` engine unless the caller brings one), the agl gateway records every
call's token ids, and an in-process runner runs the agent on each task with its
rollout's key, greedily by default. The rollouts, spans and calls land in ``store``, so
the caller can read whatever it wants to report from there (calls per agent, tool-call
validity, ...).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from agl.runner import Agent
from agl.schema import ModelVersion, Rollout, Task, short_id
from agl.store.base import Store
from agl_trainer.engine import Engine


def evaluate(
    agent: Agent,
    tasks: Sequence[Task],
    *,
    store: Store,
    model_path: str | Path,
    adapter: str | Path | None = None,
    engine: Engine | None = None,
    temperature: float = 0.0,
    resources: dict[str, Any] | None = None,
    concurrency: int = 16,
    timeout_s: float = 1200.0,
    max_response_tokens: int | None = None,
    mode: Literal["val", "production"] = "val",
    seed: int | None = None,
) -> list[Rollout]:
    """Run ``agent`` once on each of ``tasks`` and return the ended rollouts, in the tasks' order.

    ``tasks`` are added to ``store`` (which the caller opens and closes). ``adapter`` is a
    LoRA adapter or checkpoint directory served on top of ``model_path`` as the model
    version named after the directory. ``engine`` serves ``model_path``; a caller that
    brings one starts and stops it (default: the ``transformers`` engine at seed 0,
    made, started and stopped here). ``resources`` reach the agent as ``ctx.resources``,
    with ``temperature`` set. Rollouts run with ``mode`` (``val``; ``production`` records them as
    traffic, as ``agl run`` does) and a single attempt; ``seed`` gives each its own sampling seed,
    so the same call samples the same tokens again.
    """
    from agl.capture import BufferedWriter
    from agl.plugins import resolve
    from agl.runner import Runner
    from agl_trainer.gateway import Gateway

    owned = engine is None
    if engine is None:
        engine = resolve("engine", "transformers", {"model_path": str(model_path), "seed": 0})
    gateway = runner = thread = writer = None
    try:
        engine_urls = engine.start()
        version = "base"
        if adapter is not None:
            version = Path(adapter).name
            engine.load_version(ModelVersion(version=version, path=str(Path(adapter).resolve())))
        writer = BufferedWriter(store)
        gateway = Gateway(store, engine_urls, model_version=version, writer=writer).start()
        store.add_tasks(list(tasks))
        runner = Runner(
            agent,
            store,
            gateway_url=gateway.url,
            rollout_keys=gateway.keys,
            resources={**(resources or {}), "temperature": temperature},
            concurrency=concurrency,
            writer=writer,
        )
        thread = threading.Thread(target=runner.run_sync, name="agl-evaluation-runner", daemon=True)
        thread.start()
        rollouts = _rollouts(tasks, version, timeout_s, max_response_tokens, mode, seed)
        store.enqueue(rollouts)
        ended = store.wait([r.rollout_id for r in rollouts], poll_s=0.2)
        gateway.flush()
        writer.flush()
        return ended
    finally:
        if runner is not None:
            runner.stop()
            if thread is not None:
                thread.join(30)
            runner.close()
        if gateway is not None:
            gateway.stop()
        if writer is not None:
            writer.close()
        if owned:
            engine.stop()


def _rollouts(
    tasks: Sequence[Task], version: str, timeout_s: float, max_response_tokens: int | None, mode: str, seed: int | None
) -> list[Rollout]:
    """One rollout a task, single attempt, under a new evaluation run's ids."""
    run = ("eval-" if mode == "val" else "traffic-") + short_id(8)
    return [
        Rollout(
            rollout_id=f"{run}-{i}",
            task_id=task.task_id,
            mode=mode,
            seed=None if seed is None else seed * 1_000_003 + i,
            model_version=version,
            timeout_s=timeout_s,
            max_response_tokens=max_response_tokens,
            max_attempts=1,
        )
        for i, task in enumerate(tasks)
    ]
