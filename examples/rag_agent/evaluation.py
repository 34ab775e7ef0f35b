"""Scoring finished rollouts, and running the agent on a split outside training.

:func:`summarize` turns ended rollouts and what the store holds of them into the
figures docs/results/rag-agent.md reports: token F1 and exact match (overall, one-hop, two-hop), how
episodes ended, tool calls per episode, and the tool-call validity rate, read from the
gateway's record of every LLM call (the token truth: a response cut at the cap is
there too, whatever the SDK made of it).

:func:`run_split` serves a model (the base, or the base with a LoRA adapter) with the
transformers engine behind the agl gateway and runs the agent on every task, the way the
trainer's evaluation does: once and greedily by default, or ``samples`` times at a
temperature, to see how many questions a GRPO group of that size would learn from.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from typing import Any

from agl.schema import LLMCall, Rollout, RolloutStatus
from agl.store.base import Store
from examples.sampling import group_by_item

from .rewards import exact_match, predicted_answer, token_f1

TOOL_CALL_OPEN = "<tool_call>"


def _tool_schemas() -> dict[str, dict]:
    from .agent import TOOLS

    return {tool.name: tool.params_json_schema for tool in TOOLS}


_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}


def valid_arguments(arguments: Any, schema: dict) -> bool:
    """Whether ``arguments`` (a JSON string) is an object with the schema's required keys, of their types."""
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        return False
    if not isinstance(args, dict):
        return False
    properties = schema.get("properties") or {}
    if schema.get("additionalProperties") is False and set(args) - set(properties):
        return False
    for key in schema.get("required") or []:
        if key not in args:
            return False
    for key, value in args.items():
        kind = _JSON_TYPES.get((properties.get(key) or {}).get("type"))
        if kind is not None and (not isinstance(value, kind) or (kind is str and not value.strip())):
            return False
    return True


def call_verdict(call: LLMCall, schemas: dict[str, dict]) -> str:
    """How one LLM call went: ``valid`` (a parseable call to an existing tool with valid arguments),
    ``invalid`` (it tried: a call item that is not valid, or ``<tool_call>`` text the engine could not
    parse) or ``answer`` (text, no attempt)."""
    items = (call.response or {}).get("output") or []
    calls = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call"]
    if calls:
        ok = all(c.get("name") in schemas and valid_arguments(c.get("arguments"), schemas[c["name"]]) for c in calls)
        return "valid" if ok else "invalid"
    text = "".join(
        part.get("text") or ""
        for item in items
        if isinstance(item, dict) and item.get("type") == "message"
        for part in item.get("content") or []
        if isinstance(part, dict)
    )
    return "invalid" if TOOL_CALL_OPEN in text else "answer"


def tool_call_figures(store: Store, rollout_ids: list[str]) -> dict[str, Any]:
    """LLM calls, tool calls and the validity rate over these rollouts."""
    schemas = _tool_schemas()
    verdicts = Counter(
        call_verdict(c, schemas) for c in store.query_llm_calls(rollout_ids=rollout_ids) if not c.aborted
    )
    executed = Counter(s.rollout_id for s in store.query_spans(rollout_ids=rollout_ids, kind="tool"))
    n_calls = sum(verdicts.values())
    attempts = verdicts["valid"] + verdicts["invalid"]
    n = max(len(rollout_ids), 1)
    return {
        "llm_calls": n_calls,
        "llm_calls_per_episode": n_calls / n,
        "tool_call_attempts": attempts,
        "valid_tool_calls": verdicts["valid"],
        "tool_call_validity": verdicts["valid"] / n_calls if n_calls else None,
        "attempt_validity": verdicts["valid"] / attempts if attempts else None,
        "tool_calls_per_episode": sum(executed.values()) / n,
    }


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(rollouts: list[Rollout], tasks: dict[str, dict], store: Store | None = None) -> dict[str, Any]:
    """F1 and exact match (overall and by hops) and how the episodes ended; tool-call figures given ``store``.

    ``tasks`` maps task ids to task inputs. A rollout that failed or timed out scores 0.
    When questions were sampled more than once, the summary adds the fraction of them on
    which some sample scored (``questions_with_a_hit``) and on which the samples' F1 differ
    (``questions_with_signal``: the ones a GRPO group of that size learns from).
    """
    f1: dict[int, list[float]] = {1: [], 2: []}
    em: dict[int, list[float]] = {1: [], 2: []}
    statuses: Counter[str] = Counter()
    stopped: Counter[str] = Counter()
    by_task: dict[str, float] = {}
    for r in rollouts:
        task = tasks[r.task_id]
        statuses[r.status.value] += 1
        output = r.output if r.status == RolloutStatus.SUCCEEDED and isinstance(r.output, dict) else {}
        stopped[output.get("stopped") or ("answered" if output else "no output")] += 1
        answer = predicted_answer(output)
        by_task[r.task_id] = token_f1(answer, task["answer"])
        f1.setdefault(task["hops"], []).append(by_task[r.task_id])
        em.setdefault(task["hops"], []).append(exact_match(answer, task["answer"]))
    every_f1 = [v for values in f1.values() for v in values]
    every_em = [v for values in em.values() for v in values]
    summary: dict[str, Any] = {
        "n": len(every_f1),
        "f1": _mean(every_f1) or 0.0,
        "exact_match": _mean(every_em) or 0.0,
        "f1_by_hops": {str(h): _mean(v) for h, v in sorted(f1.items())},
        "exact_match_by_hops": {str(h): _mean(v) for h, v in sorted(em.items())},
        "endings": dict(sorted(stopped.items())),
        "statuses": dict(statuses),
    }
    groups = group_by_item(by_task)
    if any(len(v) > 1 for v in groups.values()):
        summary["questions_with_a_hit"] = sum(max(v) > 0 for v in groups.values()) / len(groups)
        summary["questions_with_signal"] = sum(max(v) > min(v) for v in groups.values()) / len(groups)
    if store is not None:
        summary.update(tool_call_figures(store, [r.rollout_id for r in rollouts]))
    return summary


def run_split(
    items: list[dict],
    *,
    max_response_tokens: int | None = None,
    concurrency: int = 6,
    timeout_s: float = 1800.0,
    **options: Any,
) -> dict[str, Any]:
    """Run the agent on each task and summarize (:func:`examples.evaluation.run_agent` takes ``options``).

    ``max_response_tokens`` caps every response at the gateway and is the agent's own cap
    (``resources["max_tokens"]``) too.
    """
    from examples.evaluation import run_agent

    from .agent import rag_agent

    return run_agent(
        rag_agent,
        summarize,
        items,
        max_response_tokens=max_response_tokens,
        concurrency=concurrency,
        timeout_s=timeout_s,
        resources={"max_tokens": max_response_tokens} if max_response_tokens else None,
        **options,
    )
