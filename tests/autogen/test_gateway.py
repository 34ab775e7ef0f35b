"""agl-autogen against the real gateway: AutoGen's OpenAIChatCompletionClient, engine token ids."""

from __future__ import annotations

import json

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_ext.models.openai import OpenAIChatCompletionClient

import agl
from agl_autogen import AglChatCompletionClient

MODEL_INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}


def lookup(city: str) -> str:
    """Look up the weather in a city."""
    return f"sunny in {city}"


SNAPSHOT = "gpt-4o-2024-08-06"
"""A pinned model name. AutoGen maps the alias ``gpt-4o`` to this snapshot and warns unless the
answer names the snapshot, as OpenAI's does; the gateway answers with the name the client asked
for (it cannot know OpenAI's aliases), so the agent asks for the snapshot itself."""


# The warning AutoGen gives when the answer's model is not the one it resolved, made an error here.
@pytest.mark.filterwarnings("error:Resolved model mismatch")
async def test_assistant_with_tool_yields_engine_transitions(gateway_rollout):
    rig = gateway_rollout
    client = OpenAIChatCompletionClient(
        model=SNAPSHOT, base_url=rig.base_url, api_key=rig.key, model_info=MODEL_INFO, max_retries=0
    )
    agent = AssistantAgent(
        "forecaster",
        model_client=AglChatCompletionClient(client),
        tools=[lookup],
        reflect_on_tool_use=True,
    )
    # The fake engine calls a tool when the user message says "call <tool>".
    result = await agent.run(task="call lookup")
    await client.close()
    agl.emit_reward(1.0)

    assert result.messages[-1].content.startswith("result: ")
    llm = rig.spans("llm")
    calls = rig.calls()
    assert len(llm) == len(calls) == 2
    # Each span carries the id the gateway issued: the join is exact.
    assert [s.attributes["gen_ai.response.id"] for s in llm] == [c.call_id for c in calls]
    assert all(s.attributes["gen_ai.agent.name"] == "forecaster" for s in llm)
    assert llm[0].attributes["gen_ai.request.model"] == SNAPSHOT
    assert {c.response["model"] for c in calls} == {SNAPSHOT}  # the name AutoGen resolved: no warning
    (tool,) = rig.spans("tool")
    city = json.loads(tool.attributes["gen_ai.tool.call.arguments"])["city"]
    assert tool.attributes["gen_ai.tool.call.result"] == f"sunny in {city}"

    transitions, report = rig.transitions()
    assert report.joined_by_id == 2
    assert [t.token_source for t in transitions] == ["engine", "engine"]
    assert [t.agent for t in transitions] == ["forecaster", "forecaster"]
    assert all(len(t.prompt_ids) > 0 and len(t.response_ids) > 0 for t in transitions)
    assert [t.call_id for t in transitions] == [c.call_id for c in calls]
    assert [t.reward for t in transitions] == [1.0, 1.0]
