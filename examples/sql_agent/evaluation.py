"""Scoring finished rollouts, and running the agent on a split outside training.

:func:`summarize` turns ended rollouts (their outputs and LLM spans, read from an agl
store) into the figures the README reports: success overall and per tier, rewrite
rounds per question, the checker's acceptance rate and LLM calls per agent. Success
is the reward plugin's execution match, recomputed from the stored output.

:func:`run_split` serves a model (the base, or the base with a LoRA adapter merged)
with the transformers engine behind the agl gateway and runs the agent on every task
once, greedily, the way the trainer's evaluation does.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from agl.schema import Rollout, RolloutStatus, Task
from agl.store.base import Store

from .questions import TIERS
from .rewards import execution_match, predicted_sql


def agent_calls(store: Store, rollout_ids: list[str]) -> dict[str, int]:
    """LLM calls per agent (``gen_ai.agent.name`` of the llm spans) over these rollouts."""
    counts: Counter[str] = Counter()
    for span in store.query_spans(rollout_ids=rollout_ids, kind="llm"):
        counts[span.attributes.get("gen_ai.agent.name") or "(none)"] += 1
    return dict(sorted(counts.items()))


def summarize(rollouts: list[Rollout], tasks: dict[str, dict], store: Store | None = None) -> dict[str, Any]:
    """Success (overall and per tier) and behaviour of the agent over ended rollouts.

    ``tasks`` maps task ids to task inputs. A rollout that failed or timed out counts
    as a failure; its rounds count as 0.
    """
    per_tier: dict[str, list[float]] = {t: [] for t in TIERS}
    rounds = rewrites = accepted = 0
    statuses: Counter[str] = Counter()
    for r in rollouts:
        task = tasks[r.task_id]
        statuses[r.status.value] += 1
        output = r.output if r.status == RolloutStatus.SUCCEEDED and isinstance(r.output, dict) else {}
        score = execution_match(predicted_sql(output), task["gold_sql"], bool(task.get("ordered")))
        per_tier.setdefault(task.get("tier", "all"), []).append(score)
        rounds += int(output.get("rounds", 0))
        rewrites += int(output.get("rewrites", 0))
        accepted += bool(output.get("accepted"))
    scores = [s for values in per_tier.values() for s in values]
    n = max(len(scores), 1)
    summary: dict[str, Any] = {
        "n": len(scores),
        "success": sum(scores) / n,
        "success_by_tier": {t: (sum(v) / len(v) if v else None) for t, v in per_tier.items()},
        "rewrites_per_question": rewrites / n,
        "checks_per_question": rounds / n,
        "checker_acceptance": accepted / rounds if rounds else None,
        "statuses": dict(statuses),
    }
    if store is not None:
        summary["agent_calls"] = agent_calls(store, [r.rollout_id for r in rollouts])
    return summary


def _tasks(items: list[dict], split: str) -> list[Task]:
    return [Task(task_id=t["task_id"], input=t["input"], split=split) for t in items]


def run_split(
    items: list[dict],
    *,
    model_path: str | Path,
    workdir: Path,
    adapter: str | Path | None = None,
    split: str = "test",
    concurrency: int = 16,
    resources: dict[str, Any] | None = None,
    timeout_s: float = 1200.0,
    max_response_tokens: int | None = 64,
) -> dict[str, Any]:
    """Run the agent once on each task (temperature 0) and summarize; returns the summary.

    Everything the run records (rollouts, spans, gateway calls) goes to a SQLite store in
    ``workdir``.
    """
    from agl.capture import BufferedWriter
    from agl.runner import Runner
    from agl.schema import ModelVersion, short_id
    from agl.store.base import open_store
    from agl_trainer.gateway import Gateway
    from agl_verl.engines.transformers_engine import TransformersEngine

    from .agent import sql_agent

    workdir.mkdir(parents=True, exist_ok=True)
    store = open_store(f"sqlite:///{workdir.resolve() / 'agl.db'}")
    engine = TransformersEngine(model_path, seed=0)
    gateway = runner = thread = writer = None
    try:
        engine_urls = engine.start()
        version = "base"
        if adapter is not None:
            version = Path(adapter).name
            engine.load_version(ModelVersion(version=version, path=str(Path(adapter).resolve())))
        writer = BufferedWriter(store)
        gateway = Gateway(store, engine_urls, model_version=version, writer=writer).start()
        tasks = _tasks(items, split)
        store.add_tasks(tasks)
        runner = Runner(
            sql_agent,
            store,
            gateway_url=gateway.url,
            rollout_keys=gateway.keys,
            resources={**(resources or {}), "temperature": 0.0},
            concurrency=concurrency,
            writer=writer,
        )
        thread = threading.Thread(target=runner.run_sync, name="sql-eval-runner", daemon=True)
        thread.start()
        run = "eval-" + short_id(8)
        rollouts = [
            Rollout(
                rollout_id=f"{run}-{i}",
                task_id=t.task_id,
                mode="val",
                model_version=version,
                timeout_s=timeout_s,
                max_response_tokens=max_response_tokens,
                max_attempts=1,
            )
            for i, t in enumerate(tasks)
        ]
        store.enqueue(rollouts)
        ended = store.wait([r.rollout_id for r in rollouts], poll_s=0.2)
        gateway.flush()
        return summarize(ended, {t.task_id: t.input for t in tasks}, store)
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
        engine.stop()
        store.close()


def timed(fn, *args, **kwargs) -> tuple[Any, float]:
    """``fn(*args, **kwargs)`` and the seconds it took."""
    started = time.monotonic()
    value = fn(*args, **kwargs)
    return value, time.monotonic() - started
