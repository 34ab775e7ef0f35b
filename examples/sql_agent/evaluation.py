"""Scoring finished rollouts, and running the agent on a split outside training.

:func:`summarize` turns ended rollouts (their outputs and LLM spans, read from an agl
store) into the figures the README reports: success overall and per tier, rewrite
rounds per question, the checker's acceptance rate, how often the final query runs at
all, how often the writer answers with a one-line query, and LLM calls per agent.
Success is the reward plugin's execution match, recomputed from the stored output.

:func:`run_split` serves a model (the base, or the base with a LoRA adapter) with an
engine (the transformers engine unless the caller brings another, such as ``vllm``)
behind the agl gateway and runs the agent on every task, once and greedily by
default, the way the trainer's evaluation does (:func:`examples.evaluation.run_agent`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from agl.schema import Rollout, RolloutStatus
from agl.store.base import Store

from .database import run_query
from .prompts import extract_sql
from .questions import TIERS
from .rewards import execution_match, predicted_sql


def agent_calls(store: Store, rollout_ids: list[str]) -> dict[str, int]:
    """LLM calls per agent (``gen_ai.agent.name`` of the llm spans) over these rollouts."""
    counts: Counter[str] = Counter()
    for span in store.query_spans(rollout_ids=rollout_ids, kind="llm"):
        counts[span.attributes.get("gen_ai.agent.name") or "(none)"] += 1
    return dict(sorted(counts.items()))


def writer_one_line(store: Store, rollout_ids: list[str]) -> float | None:
    """The share of the writer's answers that are a query on one line, the worked examples' form."""
    queries = []
    for span in store.query_spans(rollout_ids=rollout_ids, kind="llm"):
        if span.attributes.get("gen_ai.agent.name") == "write_query":
            messages = span.attributes.get("gen_ai.output.messages") or [{}]
            queries.append(extract_sql(messages[0].get("content") or ""))
    return sum(bool(q) and "\n" not in q for q in queries) / len(queries) if queries else None


def summarize(rollouts: list[Rollout], tasks: dict[str, dict], store: Store | None = None) -> dict[str, Any]:
    """Success (overall and per tier) and behaviour of the agent over ended rollouts.

    ``tasks`` maps task ids to task inputs. A rollout that failed or timed out counts
    as a failure; its rounds count as 0. ``solved`` lists the task ids answered right, so
    that two runs can be compared question by question.
    """
    per_tier: dict[str, list[float]] = {t: [] for t in TIERS}
    rounds = rewrites = accepted = runs = 0
    solved: list[str] = []
    statuses: Counter[str] = Counter()
    for r in rollouts:
        task = tasks[r.task_id]
        statuses[r.status.value] += 1
        output = r.output if r.status == RolloutStatus.SUCCEEDED and isinstance(r.output, dict) else {}
        sql = predicted_sql(output)
        score = execution_match(sql, task["gold_sql"], bool(task.get("ordered")))
        runs += isinstance(sql, str) and run_query(sql).ok  # an empty query does not run
        per_tier.setdefault(task.get("tier", "all"), []).append(score)
        if score:
            solved.append(r.task_id)
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
        "final_query_runs": runs / n,
        "statuses": dict(statuses),
        "solved": sorted(solved),
    }
    if store is not None:
        ids = [r.rollout_id for r in rollouts]
        summary["agent_calls"] = agent_calls(store, ids)
        summary["writer_one_line"] = writer_one_line(store, ids)
    return summary


def run_split(
    items: list[dict], *, max_response_tokens: int | None = 64, timeout_s: float = 1200.0, **options: Any
) -> dict[str, Any]:
    """Run the agent on each task (once and greedily by default) and summarize.

    :func:`examples.evaluation.run_agent` takes ``options``: ``engine`` (another engine to
    serve the model, such as ``vllm``, started and stopped by the caller), ``resources``,
    ``temperature`` and ``samples`` among them.
    """
    from examples.evaluation import run_agent

    from .agent import sql_agent

    return run_agent(
        sql_agent, summarize, items, max_response_tokens=max_response_tokens, timeout_s=timeout_s, **options
    )
