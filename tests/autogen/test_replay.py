"""agl-autogen with AutoGen's ReplayChatCompletionClient: offline, real agents and teams."""

from __future__ import annotations

import json
import logging

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core import FunctionCall
from autogen_core.models import CreateResult, RequestUsage
from autogen_ext.models.replay import ReplayChatCompletionClient

import agl
import agl_autogen
from agl_autogen import AglChatCompletionClient


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


MODEL_INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}


def tool_call_then_answer() -> list[CreateResult | str]:
    call = CreateResult(
        finish_reason="function_calls",
        content=[FunctionCall(id="call-1", name="add", arguments=json.dumps({"a": 2, "b": 3}))],
        usage=RequestUsage(prompt_tokens=11, completion_tokens=7),
        cached=False,
    )
    return [call, "The sum is 5."]


async def test_assistant_with_tool_one_line(recorded):
    client = AglChatCompletionClient(ReplayChatCompletionClient(tool_call_then_answer(), model_info=MODEL_INFO))
    agent = AssistantAgent("calculator", model_client=client, tools=[add], reflect_on_tool_use=True)

    result = await agent.run(task="What is 2 + 3?")
    agl.emit_reward(1.0)

    assert result.messages[-1].content == "The sum is 5."
    llm = recorded.spans("llm")
    assert len(llm) == 2
    first, second = (s.attributes for s in llm)
    assert first["gen_ai.agent.name"] == "calculator"
    assert second["gen_ai.agent.name"] == "calculator"
    assert first["gen_ai.input.messages"][-1] == {
        "role": "user",
        "name": "user",
        "parts": [{"type": "text", "content": "What is 2 + 3?"}],
    }
    assert first["gen_ai.output.messages"][0]["parts"] == [
        {"type": "tool_call", "id": "call-1", "name": "add", "arguments": '{"a": 2, "b": 3}'}
    ]
    assert first["gen_ai.usage.input_tokens"] == 11
    assert [t["name"] for t in first["gen_ai.tool.definitions"]] == ["add"]
    # The second call sees the tool's result, and answers.
    assert second["gen_ai.input.messages"][-1]["parts"][0]["response"] == "5"
    assert second["gen_ai.output.messages"][0]["parts"] == [{"type": "text", "content": "The sum is 5."}]
    assert "gen_ai.response.id" not in first  # the replay client has none: the join uses call order

    (tool,) = recorded.spans("tool")
    assert tool.attributes["gen_ai.tool.name"] == "add"
    assert tool.attributes["gen_ai.tool.call.id"] == "call-1"
    assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == {"a": 2, "b": 3}
    assert tool.attributes["gen_ai.tool.call.result"] == "5"
    assert tool.attributes["gen_ai.agent.name"] == "calculator"

    (agent_span,) = recorded.spans("agent")
    assert agent_span.name == "invoke_agent calculator"
    assert {s.parent_id for s in llm} == {agent_span.span_id}
    assert tool.parent_id == agent_span.span_id
    assert all(s.rollout_id == "ro-test" for s in recorded.spans())
    (reward,) = recorded.store.query_rewards(rollout_id="ro-test")
    assert reward.value == 1.0


async def test_round_robin_team_names_each_agent(recorded, instrumented):
    writer = AssistantAgent("writer", model_client=ReplayChatCompletionClient(["draft 1", "draft 2"]))
    critic = AssistantAgent("critic", model_client=ReplayChatCompletionClient(["fix it", "APPROVE"]))
    team = RoundRobinGroupChat([writer, critic], termination_condition=MaxMessageTermination(5))

    result = await team.run(task="Write a haiku.")

    assert [m.source for m in result.messages] == ["user", "writer", "critic", "writer", "critic"]
    llm = recorded.spans("llm")
    names = [s.attributes["gen_ai.agent.name"] for s in llm]
    outputs = [s.attributes["gen_ai.output.messages"][0]["parts"][0]["content"] for s in llm]
    assert list(zip(names, outputs, strict=False)) == [
        ("writer", "draft 1"),
        ("critic", "fix it"),
        ("writer", "draft 2"),
        ("critic", "APPROVE"),
    ]
    agents = recorded.spans("agent")
    (team_span,) = [s for s in agents if s.attributes.get("agl.team.type")]
    assert team_span.attributes["agl.team.type"] == "RoundRobinGroupChat"
    assert team_span.attributes["agl.team.participants"] == ["writer", "critic"]
    invocations = [s for s in agents if s is not team_span]
    assert [s.attributes["gen_ai.agent.name"] for s in invocations] == ["writer", "critic", "writer", "critic"]
    assert all(s.parent_id == team_span.span_id for s in invocations)
    by_id = {s.span_id: s for s in invocations}
    for s in llm:  # each call is a child of the invocation of the agent that made it
        assert by_id[s.parent_id].attributes["gen_ai.agent.name"] == s.attributes["gen_ai.agent.name"]


async def test_instrument_captures_unwrapped_clients_once(recorded, instrumented):
    inner = ReplayChatCompletionClient(["hello"])
    wrapped = AglChatCompletionClient(inner)  # wrapping on top of instrument() must not double count
    agent = AssistantAgent("greeter", model_client=wrapped)
    await agent.run(task="hi")
    plain = AssistantAgent("plain", model_client=ReplayChatCompletionClient(["bye"]))
    await plain.run(task="bye")

    llm = recorded.spans("llm")
    assert [s.attributes["gen_ai.agent.name"] for s in llm] == ["greeter", "plain"]


async def test_streaming_is_captured(recorded, instrumented):
    agent = AssistantAgent(
        "streamer", model_client=ReplayChatCompletionClient(["one two three"]), model_client_stream=True
    )
    chunks = [m async for m in agent.run_stream(task="count")]
    assert chunks  # the agent streamed
    (llm,) = recorded.spans("llm")
    assert llm.attributes["agl.stream"] is True
    assert llm.attributes["gen_ai.output.messages"][0]["parts"][0]["content"] == "one two three"
    assert llm.attributes["gen_ai.agent.name"] == "streamer"


async def test_uninstrument_stops_capture(recorded):
    agl_autogen.instrument()
    agl_autogen.uninstrument()
    agent = AssistantAgent("quiet", model_client=ReplayChatCompletionClient(["ok"]))
    await agent.run(task="hi")
    assert recorded.spans() == []
    assert not agl_autogen.instrumented()


async def test_capture_failure_never_breaks_the_agent(recorded, monkeypatch, caplog):
    from agl_autogen import _record, convert

    def broken(*args, **kwargs):
        raise RuntimeError("store is on fire")

    monkeypatch.setattr(_record.agl, "span", broken)
    monkeypatch.setattr(convert, "output_messages", broken)
    agl_autogen.errors.clear()
    client = AglChatCompletionClient(ReplayChatCompletionClient(["still fine", "again"]))
    agent = AssistantAgent("robust", model_client=client)
    with caplog.at_level(logging.WARNING, logger="agl_autogen"):
        r1 = await agent.run(task="one")
        r2 = await agent.run(task="two")
    assert r1.messages[-1].content == "still fine"
    assert r2.messages[-1].content == "again"
    assert agl_autogen.errors["model call end"] == 2
    assert agl_autogen.errors["agent span start"] == 2
    # logged once per place, however often it fails
    assert sum("model call end" in r.getMessage() for r in caplog.records) == 1


async def test_user_errors_pass_through_unchanged(recorded):
    class Boom(Exception):
        pass

    class FailingClient(ReplayChatCompletionClient):
        async def create(self, *args, **kwargs):
            raise Boom("model down")

    agent = AssistantAgent("failing", model_client=AglChatCompletionClient(FailingClient(["x"])))
    try:
        await agent.run(task="hi")
    except Boom:
        pass
    else:
        raise AssertionError("the model client's error must reach the caller")
    (llm,) = recorded.spans("llm")
    assert llm.status == "error"
    assert llm.attributes["error.type"] == "Boom" and llm.attributes["error.message"] == "model down"
    # a failed call keeps its agent and its request, so it still joins its gateway record
    assert llm.attributes["gen_ai.agent.name"] == "failing"
    assert llm.attributes["gen_ai.input.messages"][-1]["parts"] == [{"type": "text", "content": "hi"}]
    (agent_span,) = recorded.spans("agent")
    assert agent_span.status == "error"
