"""The reward plugin: execution match against the gold query.

The predicted SQL earns 1 when it returns the same rows as the gold SQL: the same
multiset of rows, and the same order too when the question asks for one. Numbers are
compared rounded to 2 decimals (``SUM`` of prices, ``AVG``). A missing, malformed,
failing or slow query earns 0; nothing the model wrote raises into the rollout. A gold
query that does not run (a missing database, a broken task) is not the model's failure:
:class:`GoldQueryError` says so instead of paying 0.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import agl

from .database import QueryResult, run_query


def _normal(row: tuple) -> tuple:
    return tuple(round(v, 2) if isinstance(v, float) else v for v in row)


class GoldQueryError(RuntimeError):
    """The task's gold query did not run, so no answer can be scored."""


@lru_cache(maxsize=4096)
def gold_rows(gold_sql: str) -> tuple[tuple, ...]:
    """The gold query's rows (cached: the same question comes back every epoch)."""
    result = run_query(gold_sql, timeout_s=10.0)
    if not result.ok or result.truncated:
        raise GoldQueryError(f"gold_sql {gold_sql!r}: {result.error or 'more rows than the cap'}")
    return tuple(result.rows)


def same_result(predicted: QueryResult, gold: tuple[tuple, ...], ordered: bool) -> bool:
    """Whether ``predicted`` ran and returned ``gold``'s rows (in order when ``ordered``)."""
    if not predicted.ok or predicted.truncated:
        return False
    got = [_normal(r) for r in predicted.rows]
    want = [_normal(r) for r in gold]
    return got == want if ordered else Counter(got) == Counter(want)


def execution_match(predicted_sql: str | None, gold_sql: str, ordered: bool = False) -> float:
    """1.0 when ``predicted_sql`` returns the gold query's result, else 0.0."""
    if not isinstance(predicted_sql, str) or not predicted_sql.strip():
        return 0.0
    return 1.0 if same_result(run_query(predicted_sql), gold_rows(gold_sql), ordered) else 0.0


def predicted_sql(output) -> str | None:
    """The final SQL in the agent's output (the agent returns a dict; a bare string is taken as SQL)."""
    if isinstance(output, dict):
        return output.get("sql")
    return output if isinstance(output, str) else None


@agl.hookimpl
def agl_reward(rollout, spans, llm_calls, rewards):
    """Execution match of the agent's final SQL against the task's gold SQL."""
    task = rollout.task.input
    return execution_match(predicted_sql(rollout.output), task["gold_sql"], bool(task.get("ordered")))
