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

A run with a policy per role is evaluated the way it trained: ``policies`` (the run's
``TrainerConfig.policies``) route each call by the model it names, and ``adapter`` maps each
trained policy to its adapter (a policy left out is served the base model; a frozen one its
own ``weights``):

.. code-block:: python

    ended = evaluate(
        my_agent, tasks, store=store, model_path="models/base",
        policies=[{"name": "writer", "models": ["sql-writer"]},
                  {"name": "checker", "models": ["sql-checker"], "train": False}],
        adapter={"writer": "runs/x/verl/versions/writer-step-30"},
    )
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agl.errors import ConfigError
from agl.runner import Agent
from agl.schema import ModelVersion, Rollout, Task, short_id
from agl.store.base import Store
from agl_trainer.engine import Engine
from agl_trainer.policy_backends import BASE_VERSION, PolicySet
from agl_trainer.policy_config import PolicyConfig
from agl_trainer.policy_routes import Routes


def evaluate(
    agent: Agent,
    tasks: Sequence[Task],
    *,
    store: Store,
    model_path: str | Path,
    adapter: str | Path | Mapping[str, str | Path] | None = None,
    policies: Sequence[PolicyConfig | Mapping[str, Any]] | None = None,
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
    version named after the directory; with ``policies`` (a run's ``TrainerConfig.policies``), a
    mapping of trained policy name to its adapter (:class:`ServedWeights`). ``engine`` serves
    ``model_path``; a caller that brings one starts and stops it (default: the ``transformers``
    engine at seed 0, made, started and stopped here). ``resources`` reach the agent as ``ctx.resources``,
    with ``temperature`` set. Rollouts run with ``mode`` (``val``; ``production`` records them as
    traffic, as ``agl run`` does) and a single attempt; ``seed`` gives each its own sampling seed,
    so the same call samples the same tokens again.
    """
    from agl.capture import BufferedWriter
    from agl.plugins import resolve
    from agl.runner import Runner
    from agl_trainer.gateway import Gateway

    served = ServedWeights.of(adapter, policies)
    owned = engine is None
    if engine is None:
        engine = resolve("engine", "transformers", {"model_path": str(model_path), "seed": 0})
    gateway = runner = thread = writer = None
    try:
        engine_urls = engine.start()
        version, routes = served.load(engine)
        writer = BufferedWriter(store)
        gateway = Gateway(store, engine_urls, model_version=version, writer=writer, routes=routes).start()
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


@dataclass(frozen=True)
class ServedWeights:
    """What an evaluation serves: one adapter (or the base model) as the engine's default weights,
    or a run's policies, each with its own."""

    adapter: Path | None = None
    policies: PolicySet | None = None
    policy_weights: dict[str, Path | None] = field(default_factory=dict)
    """Each policy's adapter (a trained one's, or a frozen one's ``weights``); None: the base model."""

    @classmethod
    def of(
        cls,
        adapter: str | Path | Mapping[str, str | Path] | None,
        policies: Sequence[PolicyConfig | Mapping[str, Any]] | None,
    ) -> ServedWeights:
        """Checked before anything starts: with ``policies``, ``adapter`` maps trained policy names to
        adapter directories (a :class:`ConfigError` for a name that is no trained policy, or for a
        single path); without, it is one adapter directory or None."""
        if not policies:
            if isinstance(adapter, Mapping):
                raise ConfigError("adapter: a mapping of policy to adapter needs the run's policies (policies=...)")
            return cls(adapter=Path(adapter).resolve() if adapter is not None else None)
        if adapter is not None and not isinstance(adapter, Mapping):
            raise ConfigError(
                "adapter: with policies, a mapping of each trained policy's name to its adapter directory"
            )
        policy_set = PolicySet([p if isinstance(p, PolicyConfig) else PolicyConfig.model_validate(p) for p in policies])
        adapters = {name: Path(path).resolve() for name, path in (adapter or {}).items()}
        trained = {p.name for p in policy_set.trained}
        unknown = sorted(set(adapters) - trained)
        if unknown:
            raise ConfigError(
                f"adapter: {', '.join(map(repr, unknown))} is no trained policy of the run "
                f"(trained: {', '.join(sorted(trained)) or 'none'})"
            )
        weights = {
            p.name: adapters.get(p.name)
            if p.config.train
            else (Path(p.config.weights).resolve() if p.config.weights else None)
            for p in policy_set.policies
        }
        for p in policy_set.policies:
            p.version = weights[p.name].name if weights[p.name] else BASE_VERSION
        return cls(policies=policy_set, policy_weights=weights)

    def load(self, engine: Engine) -> tuple[str | None, Routes | None]:
        """Have ``engine`` (started) serve these weights, as the trainer does; the gateway's
        ``model_version`` (None for a run of policies, whose calls record each its policy's) and
        table of policies (None without)."""
        if self.policies is None:
            if self.adapter is None:
                return BASE_VERSION, None
            engine.load_version(ModelVersion(version=self.adapter.name, path=str(self.adapter)))
            return self.adapter.name, None
        for p in self.policies.policies:
            path = self.policy_weights[p.name]
            if p.engine_name is not None or path is not None:
                version = ModelVersion(version=p.version, path=str(path) if path else None, policy=p.engine_name)
                engine.load_version(version)
        return None, self.policies.routes(engine)


def _rollouts(
    tasks: Sequence[Task],
    version: str | None,
    timeout_s: float,
    max_response_tokens: int | None,
    mode: str,
    seed: int | None,
) -> list[Rollout]:
    """One rollout a task, single attempt, under a new evaluation run's ids (``version`` None: a run of
    policies, whose calls each record their policy's version)."""
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
