"""The agent: an OpenAI Agents SDK ``Agent`` with a ``search`` tool, run by ``Runner.run``.

Written as an Agents SDK user writes one: a ``@function_tool``, an ``Agent`` with
instructions and model settings, and ``Runner.run`` with a turn limit. The model name
is resolved by the SDK's default provider, so its calls take the default Responses API
path (``/v1/responses``); the provider's client points at the rollout's route on the
agl gateway (``ctx.base_url``, ``ctx.api_key``), or at ``OPENAI_BASE_URL`` under
``agl run``. agl's trace processor records the agent, its LLM calls and its tool calls.

The first call must search (``tool_choice="required"``: a small model never calls a tool
on its own, and the engine then forces the start of the call); the SDK resets the
choice to ``auto`` after a tool has run (``reset_tool_choice``), so the model decides
whether to search again or answer. Nothing here knows about training: the answer is
scored afterwards by the reward plugin in ``rewards.py``.

A response cut at the token cap ends the Responses stream ``incomplete``, which the
SDK (0.24) raises as ``ModelBehaviorError``; so does an answer that never comes within
``MAX_TURNS``. Both end the episode with no answer (reward 0) and the reason in the
output, not with a failed rollout: the calls made so far are still trained.
"""

from __future__ import annotations

import os
from typing import Any

from agents import (
    Agent,
    AgentsException,
    MaxTurnsExceeded,
    ModelBehaviorError,
    ModelSettings,
    RunConfig,
    Runner,
    function_tool,
    set_trace_processors,
)
from agents.models.openai_provider import OpenAIProvider
from openai import AsyncOpenAI

import agl_openai_agents

from .prompts import INSTRUCTIONS
from .retrieval import default_index, format_hits

AGENT_NAME = "researcher"
MAX_TURNS = 4
"""LLM calls per episode at most: up to three searches and the answer."""
MAX_TOKENS = 96
"""The agent's own response cap (``max_output_tokens``) unless ``resources["max_tokens"]`` gives one:
a search call takes about 25 tokens; the base model's answers often restate a passage."""
REQUEST_TIMEOUT_S = 3600.0
"""The client's limit on one model call. The openai client's own default (600 s) failed whole rollouts on a
shared 2-core machine where calls queued behind others; the runner's rollout timeout bounds an episode."""
STOP = ["</tool_call>", "</tool_response>"]
"""Where an answer ends: after a call (the engine parses an unclosed last block), or where a made-up
tool response ends (the base model often answers by writing one). Sent in ``extra_body``, the SDK's
way to pass parameters it has no field for."""

# agl records every run; nothing goes to OpenAI's trace backend (set_trace_processors replaces its exporter).
set_trace_processors([agl_openai_agents.instrument()])


@function_tool
def search(query: str) -> str:
    """Search the passages for a name or a few words; returns the best matching passages."""
    return format_hits(default_index().search(query))


TOOLS = [search]


def build_agent(*, temperature: float = 1.0, max_tokens: int = MAX_TOKENS, model: str = "gpt-4o-mini") -> Agent:
    """The agent; ``model`` is only a name, the gateway serves the policy whatever it is called."""
    return Agent(
        name=AGENT_NAME,
        instructions=INSTRUCTIONS,
        tools=TOOLS,
        model=model,
        model_settings=ModelSettings(
            temperature=temperature,
            max_tokens=max_tokens,
            tool_choice="required",
            parallel_tool_calls=False,
            extra_body={"stop": STOP},
        ),
    )


def _stopped(reason: str, exc: Exception) -> dict[str, Any]:
    return {"answer": "", "stopped": reason, "error": f"{type(exc).__name__}: {exc}"[:300]}


async def rag_agent(task: dict, ctx=None) -> dict[str, Any]:
    """Answer ``task["question"]``; returns the answer and how the episode ended, for the reward plugin."""
    resources = getattr(ctx, "resources", None) or {}
    client = AsyncOpenAI(
        base_url=getattr(ctx, "base_url", None) or os.environ.get("OPENAI_BASE_URL"),
        api_key=getattr(ctx, "api_key", None) or os.environ.get("OPENAI_API_KEY", "unused"),
        max_retries=0,
        timeout=REQUEST_TIMEOUT_S,
    )
    agent = build_agent(
        temperature=resources.get("temperature", 1.0),
        max_tokens=resources.get("max_tokens", MAX_TOKENS),
        model=getattr(ctx, "model", None) or os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
    )
    config = RunConfig(model_provider=OpenAIProvider(openai_client=client), workflow_name="rag_agent")
    try:
        result = await Runner.run(agent, task["question"], max_turns=MAX_TURNS, run_config=config)
    except ModelBehaviorError as exc:  # a response cut at the token cap (Responses status "incomplete")
        return _stopped("truncated", exc)
    except MaxTurnsExceeded as exc:
        return _stopped("max_turns", exc)
    except AgentsException as exc:
        return _stopped("agent_error", exc)
    finally:
        await client.close()
    return {"answer": str(result.final_output or ""), "stopped": None, "error": None}
