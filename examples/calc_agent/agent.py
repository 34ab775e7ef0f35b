"""The agent: an AutoGen AgentChat ``AssistantAgent`` with the MCP calculator server.

::

    AssistantAgent("solver")  --calculate(expression)-->  mcp-server-calculator (stdio, McpWorkbench)
          '-- its final message: "ANSWER: <result>" (tool_call_summary_format)

Written the way an AutoGen user writes it: an ``OpenAIChatCompletionClient``, a
``McpWorkbench`` over ``StdioServerParams`` (``python -m mcp_server_calculator``, the
``mcp-server-calculator`` package), and the calculator's result as the agent's answer
(``reflect_on_tool_use=False`` with ``tool_call_summary_format="ANSWER: {result}"``). The only agl line is the
``AglChatCompletionClient`` wrapper, which records every model call with the agent's
name and the gateway's response id. The endpoint comes from the rollout context (or
``OPENAI_BASE_URL``/``OPENAI_API_KEY`` under ``agl run``); the answer is scored
afterwards by the reward plugin in ``rewards.py``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import ToolCallExecutionEvent, ToolCallRequestEvent
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import ChatCompletionClient
from autogen_ext.models.openai import OpenAIChatCompletionClient
from autogen_ext.tools.mcp import McpWorkbench, StdioServerParams

from agl_autogen import AglChatCompletionClient

from .prompts import SYSTEM_MESSAGE, demonstrations, worked_example

AGENT_NAME = "solver"
TOOL_NAME = "calculate"
"""The one tool ``mcp-server-calculator`` serves: ``calculate(expression: str) -> str``."""
MAX_TOOL_ITERATIONS = 1
"""Model calls that may request tools: one, whose calculator result is the answer."""
ANSWER_FORMAT = "ANSWER: {result}"
"""How the agent reports a calculator result as its final message (AutoGen's ``tool_call_summary_format``).

SmolLM2-135M did not write an ``ANSWER:`` line after seeing the result (see docs/results/calc-agent.md), so the
agent states the result itself: what the model has to get right is the expression."""

MODEL_INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}
"""What AutoGen needs to know of a model it has no entry for (the policy under training)."""
REQUEST_TIMEOUT_S = 1800.0
"""The client's wait for one model call. The openai client's default, 600 s, was too short on this 2-core
machine under a load of 20-25 (a batched call of 40 tokens took 512 s); the rollout's own timeout bounds
the episode."""


def calculator_server() -> StdioServerParams:
    """The MCP calculator as a subprocess of this interpreter, spoken to over stdio."""
    # 5 s (the default) is tight for a fresh interpreter on a busy 2-core machine.
    return StdioServerParams(command=sys.executable, args=["-m", "mcp_server_calculator"], read_timeout_seconds=60)


def model_client(ctx=None) -> OpenAIChatCompletionClient:
    """The policy's endpoint: the rollout context's, else ``OPENAI_BASE_URL`` from the environment."""
    resources = getattr(ctx, "resources", None) or {}
    return OpenAIChatCompletionClient(
        model=getattr(ctx, "model", None) or os.environ.get("OPENAI_MODEL", "agl-policy"),
        base_url=getattr(ctx, "base_url", None) or os.environ.get("OPENAI_BASE_URL"),
        api_key=getattr(ctx, "api_key", None) or os.environ.get("OPENAI_API_KEY", "unused"),
        model_info=MODEL_INFO,
        temperature=resources.get("temperature", 1.0),
        timeout=resources.get("request_timeout_s", REQUEST_TIMEOUT_S),
        max_retries=0,
    )


def tool_activity(messages: list[Any]) -> list[dict[str, Any]]:
    """The tool calls the agent made, each with its arguments, result and error flag, in order."""
    results: dict[str, Any] = {}
    requests = []
    for message in messages:
        if isinstance(message, ToolCallRequestEvent):
            requests.extend(message.content)
        elif isinstance(message, ToolCallExecutionEvent):
            results.update({r.call_id: r for r in message.content})
    out = []
    for call in requests:
        result = results.get(call.id)
        out.append(
            {
                "name": call.name,
                "arguments": call.arguments,
                "result": result.content if result is not None else None,
                "is_error": bool(result.is_error) if result is not None else True,
            }
        )
    return out


async def solve(
    client: ChatCompletionClient, question: str, system_message: str = SYSTEM_MESSAGE, demos: list[str] | None = None
) -> dict[str, Any]:
    """Run the assistant with a fresh calculator server on one question; its final reply and tool calls.

    ``system_message`` and ``demos`` (few-shot examples, "Question: ...\nAnswer: ..." texts shown before
    the worked example) are the rollout's resources when an algorithm such as agl-apo chose them."""
    async with McpWorkbench(calculator_server()) as calculator:
        agent = AssistantAgent(
            AGENT_NAME,
            model_client=AglChatCompletionClient(client),
            workbench=calculator,
            system_message=system_message,
            model_context=UnboundedChatCompletionContext(
                demonstrations(demos or [], AGENT_NAME) + worked_example(TOOL_NAME, AGENT_NAME)
            ),
            reflect_on_tool_use=False,
            max_tool_iterations=MAX_TOOL_ITERATIONS,
            tool_call_summary_format=ANSWER_FORMAT,
        )
        result = await agent.run(task=question)
    final = result.messages[-1]
    return {
        "answer": final.content if isinstance(final.content, str) else str(final.content),
        "tool_calls": tool_activity(result.messages),
    }


async def calc_agent(task: dict, ctx=None) -> dict[str, Any]:
    """Solve ``task["question"]``; returns the final reply and the tool calls, for the reward plugin."""
    client = model_client(ctx)
    resources = getattr(ctx, "resources", None) or {}  # the prompts a prompt optimizer (agl-apo) chose, if any
    try:
        return await solve(
            client, task["question"], resources.get("system_prompt", SYSTEM_MESSAGE), resources.get("few_shot", [])
        )
    finally:
        await client.close()
