"""Scoring finished rollouts, and running the agent on a split outside training.

:func:`summarize` turns ended rollouts (their outputs and LLM spans, read from an agl
store) into the figures docs/results/sql-agent.md reports: success overall and per tier, rewrite
rounds per question, the checker's acceptance rate, how often the final query runs at
all, how often the writer answers with a one-line query, and LLM calls per agent.
Success is the reward plugin's execution match, recomputed from the stored output.
With the store, :func:`checker_figures` also measures the checker on each of its recorded
calls: how often it accepted, and how often its verdict agreed with the execution match of
the query it was shown.

:func:`run_split` serves a model (the base, or the base with a LoRA adapter) with an
engine (the transformers engine unless the caller brings another, such as ``vllm``)
behind the agl gateway and runs the agent on every task, once and greedily by
default, the way the trainer's evaluation does (:func:`examples.evaluation.run_agent`).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from agl.schema import Rollout, RolloutStatus
from agl.store.base import Store

from .database import run_query
from .prompts import accepted, checked_query, extract_sql
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


CHECKER = "check_query"
"""The checker's agent name on its calls' spans (its LangGraph node's name)."""


def _messages(value: Any) -> list:
    """A span's messages attribute as a list (OpenTelemetry keeps it as JSON text)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    return value if isinstance(value, list) else []


def _content(messages: list) -> str | None:
    """The text of the last message, when it is text."""
    last = messages[-1] if messages else None
    content = last.get("content") if isinstance(last, dict) else None
    return content if isinstance(content, str) else None


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def checker_figures(store: Store, rollouts: list[Rollout], tasks: dict[str, dict]) -> dict[str, Any]:
    """How the checker did on every call it made in these rollouts, read from its llm spans.

    Each ``check_query`` call was shown one query (in its last request message,
    :data:`prompts.CHECK_USER`) and answered a verdict (:func:`prompts.accepted`); the query is
    scored against its question's gold query by the reward's execution match. ``checks``: the
    calls scored; ``acceptance``: the share it accepted; ``accuracy``: the share whose verdict
    agrees with the execution match; ``right_queries``: how many of the checked queries were
    right; ``acceptance_of_right`` / ``acceptance_of_wrong``: the share of the right (wrong)
    queries it accepted; a share of nothing is None. ``unread``: its calls whose record holds no
    such message or no text verdict (an error), counted but not scored.
    """
    task_of = {r.rollout_id: tasks[r.task_id] for r in rollouts}
    scores: dict[tuple[str, str, bool], bool] = {}
    checks = unread = accepts = agrees = right = accepted_right = 0
    for span in store.query_spans(rollout_ids=list(task_of), kind="llm"):
        if span.attributes.get("gen_ai.agent.name") != CHECKER:
            continue
        sql = checked_query(_content(_messages(span.attributes.get("gen_ai.input.messages"))) or "")
        verdict = _content(_messages(span.attributes.get("gen_ai.output.messages")))
        if sql is None or verdict is None:
            unread += 1
            continue
        task = task_of[span.rollout_id]
        key = (sql, task["gold_sql"], bool(task.get("ordered")))
        if key not in scores:
            scores[key] = execution_match(*key) == 1.0
        is_right, yes = scores[key], accepted(verdict)
        checks += 1
        accepts += yes
        agrees += yes == is_right
        right += is_right
        accepted_right += yes and is_right
    return {
        "checks": checks,
        "acceptance": _share(accepts, checks),
        "accuracy": _share(agrees, checks),
        "right_queries": right,
        "acceptance_of_right": _share(accepted_right, right),
        "acceptance_of_wrong": _share(accepts - accepted_right, checks - right),
        "unread": unread,
    }


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
        summary["checker"] = checker_figures(store, rollouts, tasks)
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
