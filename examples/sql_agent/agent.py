"""The agent: a LangGraph ``StateGraph`` that writes, checks, rewrites and runs a SQL query.

::

    write_query -> check_query -> (YES or 3 rounds) -> execute_query
                        ^               | NO
                        +- rewrite_query

Three LLM nodes and one that executes. The model answers in text (the SQL in a fenced
block), never through tool calls. Nothing here knows about training except
``AglCallbackHandler``: the endpoint comes from the rollout context (or from
``OPENAI_BASE_URL``/``OPENAI_API_KEY`` when run outside one, as under ``agl run``), and
the answer is scored afterwards by the reward plugin in ``rewards.py``. The graph is
left unnamed, so each node's calls are recorded under the node's name as the agent.
"""

from __future__ import annotations

import os
from typing import Any, TypedDict

import openai
from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

import agl
from agl_langchain import AglCallbackHandler

from .database import run_query
from .prompts import NO_QUERY, accepted, checker_messages, extract_sql, rewriter_messages, writer_messages

MAX_ROUNDS = 3
"""Checks before the query is run anyway."""

CHECKER_MAX_TOKENS = 24
"""The verdict is one line ("YES", or "NO" and the mistake); at temperature 1 the base checker
sometimes runs on without a newline, and every token it writes is decoded on the CPU."""

NODES = ("write_query", "check_query", "rewrite_query", "execute_query")

WRITER_MODEL = "sql-writer"
CHECKER_MODEL = "sql-checker"
"""The model name each role asks for where agl serves the rollout: the writer (and the rewriter,
which is the writer asked again) and the checker. A run of one policy serves every name the same
weights; a run that names policies routes each name to its own (``policies`` in ``config.py``)."""

FIRST_QUERY_RUNS = "first_query_runs"
FIRST_QUERY_RUNS_VALUE = 0.5
"""The intermediate reward the agent emits after the writer's first query: this much when the
query runs on the database (whatever its rows), 0 when it does not. The ``emitted`` credit
strategy adds it to the writer's call; ``broadcast`` and ``discounted`` use only the final reward.
Half the final reward, chosen before any run (not tuned): a query that runs is a step towards the
right one, not the goal."""


class SQLState(TypedDict, total=False):
    """What flows through the graph."""

    question: str
    sql: str
    verdict: str
    accepted: bool
    rounds: int
    rewrites: int
    rows: list | None
    error: str | None


def build_graph(writer: BaseChatModel, checker: BaseChatModel | None = None):
    """The compiled graph; ``checker`` defaults to ``writer`` (the same policy)."""
    checker = checker or writer

    def write_query(state: SQLState) -> SQLState:
        answer = writer.invoke(writer_messages(state["question"]))
        sql = extract_sql(answer.content)
        if agl.current_rollout() is not None:  # the database check costs a query; only training pays it
            runs = bool(sql) and run_query(sql).error is None
            agl.emit_reward(FIRST_QUERY_RUNS_VALUE if runs else 0.0, name=FIRST_QUERY_RUNS)
        return {"sql": sql, "rounds": 0, "rewrites": 0}

    def check_query(state: SQLState) -> SQLState:
        verdict = checker.invoke(checker_messages(state["question"], state["sql"] or NO_QUERY)).content
        return {"verdict": verdict, "accepted": accepted(verdict), "rounds": state["rounds"] + 1}

    def rewrite_query(state: SQLState) -> SQLState:
        answer = writer.invoke(rewriter_messages(state["question"], state["sql"] or NO_QUERY, state["verdict"]))
        return {"sql": extract_sql(answer.content), "rewrites": state["rewrites"] + 1}

    def execute_query(state: SQLState) -> SQLState:
        result = run_query(state["sql"])
        return {"rows": [list(r) for r in (result.rows or [])[:20]], "error": result.error}

    def after_check(state: SQLState) -> str:
        return "execute_query" if state["accepted"] or state["rounds"] >= MAX_ROUNDS else "rewrite_query"

    graph = StateGraph(SQLState)
    graph.add_node("write_query", write_query)
    graph.add_node("check_query", check_query)
    graph.add_node("rewrite_query", rewrite_query)
    graph.add_node("execute_query", execute_query)
    graph.add_edge(START, "write_query")
    graph.add_edge("write_query", "check_query")
    graph.add_conditional_edges("check_query", after_check, ["rewrite_query", "execute_query"])
    graph.add_edge("rewrite_query", "check_query")
    graph.add_edge("execute_query", END)
    return graph.compile()


# One connection pool for every rollout (a new one per ChatOpenAI costs tens of ms).
_http_client = openai.DefaultHttpxClient()
_http_async_client = openai.DefaultAsyncHttpxClient()


def chat_model(ctx, *, role_model: str, stop: list[str], max_tokens: int | None = None) -> ChatOpenAI:
    """The policy's endpoint: the rollout context's, else ``OPENAI_BASE_URL`` from the environment.

    In a rollout context the model asked for is ``role_model``; outside one it is ``$OPENAI_MODEL``
    (one model for every role, as a hosted endpoint serves).

    ``stop`` ends an answer where its useful part ends (the SQL block, the verdict's
    line); the response length is capped by the trainer (``rollout.max_response_tokens``)
    and, below that, by ``max_tokens``.
    """
    resources = getattr(ctx, "resources", None) or {}
    return ChatOpenAI(
        base_url=getattr(ctx, "base_url", None) or os.environ.get("OPENAI_BASE_URL"),
        api_key=getattr(ctx, "api_key", None) or os.environ.get("OPENAI_API_KEY", "unused"),
        model=role_model if getattr(ctx, "base_url", None) else os.environ.get("OPENAI_MODEL", "agl-policy"),
        temperature=resources.get("temperature", 1.0),
        stop=stop,
        max_tokens=max_tokens,
        max_retries=0,
        http_client=_http_client,
        http_async_client=_http_async_client,
    )


def sql_agent(task: dict, ctx=None) -> dict[str, Any]:
    """Answer ``task["question"]``; returns the final SQL and what the loop did, for the reward plugin."""
    writer = chat_model(ctx, role_model=WRITER_MODEL, stop=["\n```"])
    checker = chat_model(ctx, role_model=CHECKER_MODEL, stop=["\n"], max_tokens=CHECKER_MAX_TOKENS)
    state = build_graph(writer, checker).invoke(
        {"question": task["question"]}, config={"callbacks": [AglCallbackHandler()]}
    )
    return {
        "sql": state.get("sql", ""),
        "accepted": bool(state.get("accepted")),
        "rounds": state.get("rounds", 0),
        "rewrites": state.get("rewrites", 0),
        "error": state.get("error"),
    }
