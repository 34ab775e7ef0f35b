"""Scoring finished rollouts, and running the agent on a split outside training.

:func:`summarize` turns ended rollouts (their outputs, and the gateway's records of
their LLM calls, read from an agl store) into the figures docs/results/calc-agent.md reports: the
success rate (the reward plugin's numeric match, recomputed from the stored output),
the tool-call validity rate, tool calls per episode, and how often the calculator
answered with an error.

:func:`run_split` runs the agent on every task, on the base model or a LoRA adapter
(:func:`agl_trainer.evaluate`: the transformers engine behind the agl gateway), the way
the trainer's evaluation does: once and greedily by default, or ``samples`` times at a
temperature, to see how many problems a GRPO group of that size would carry a signal on.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from agl.schema import Rollout, RolloutStatus
from agl.store.base import Store
from examples.sampling import group_by_item

from .rewards import final_reply, numeric_match
from .tool_calls import tool_call_figures


def summarize(rollouts: list[Rollout], tasks: dict[str, dict], store: Store | None = None) -> dict[str, Any]:
    """Success and tool use over ended rollouts; ``tasks`` maps task ids to task inputs.

    A rollout that failed or timed out counts as a failure with no tool calls. With a
    ``store``, the tool-call figures come from the gateway's records of the rollouts'
    LLM calls (see :mod:`calc_agent.tool_calls`).
    """
    statuses: Counter[str] = Counter()
    scores: list[float] = []
    by_operations: dict[int, list[float]] = {}
    by_task: dict[str, float] = {}
    executed = errors = 0
    for r in rollouts:
        task = tasks[r.task_id]
        statuses[r.status.value] += 1
        output = r.output if r.status == RolloutStatus.SUCCEEDED and isinstance(r.output, dict) else {}
        score = numeric_match(final_reply(output), task["answer"])
        scores.append(score)
        by_operations.setdefault(task["operations"], []).append(score)
        by_task[r.task_id] = score
        calls = output.get("tool_calls") or []
        executed += len(calls)
        errors += sum(bool(c.get("is_error")) for c in calls)
    n = max(len(scores), 1)
    summary: dict[str, Any] = {
        "n": len(scores),
        "success": sum(scores) / n,
        "success_by_operations": {str(k): sum(v) / len(v) for k, v in sorted(by_operations.items())},
        "tool_executions_per_episode": executed / n,
        "tool_error_rate": errors / executed if executed else None,
        "statuses": dict(statuses),
    }
    by_problem = group_by_item(by_task)
    if any(len(v) > 1 for v in by_problem.values()):
        summary["problems_with_a_success"] = sum(max(v) > 0 for v in by_problem.values()) / len(by_problem)
    if store is not None:
        ids = [r.rollout_id for r in rollouts]
        summary.update(tool_call_figures(store.query_llm_calls(rollout_ids=ids), len(ids)))
        summary["llm_calls_per_episode"] = len(list(store.query_spans(rollout_ids=ids, kind="llm"))) / n
    return summary


def run_split(
    items: list[dict], *, max_response_tokens: int | None = 64, timeout_s: float = 600.0, **options: Any
) -> dict[str, Any]:
    """Run the agent on each task and summarize (:func:`examples.evaluation.run_agent` takes ``options``).

    With ``samples`` above 1 the summary adds ``problems_with_a_success``: the fraction
    of problems on which at least one sample succeeded (a GRPO group of that size
    learns only from those).
    """
    from examples.evaluation import run_agent

    from .agent import calc_agent

    return run_agent(
        calc_agent, summarize, items, max_response_tokens=max_response_tokens, timeout_s=timeout_s, **options
    )
