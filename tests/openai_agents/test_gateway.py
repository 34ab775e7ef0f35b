"""agl-openai-agents with real Agents, Runner and AsyncOpenAI clients against the agl gateway."""

from __future__ import annotations

import json

import pytest
from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.models.openai_provider import OpenAIProvider

import agl
import agl_openai_agents
from agl_openai_agents import convert


@function_tool
def lookup(city: str) -> str:
    """Look up the weather in a city."""
    return f"sunny in {city}"


def agents_for(model_for) -> Agent:
    # The fake engine calls a tool when the last user message says "call <tool>", or
    # when tool_choice is required; the SDK resets tool_choice after a tool call.
    specialist = Agent(
        name="specialist",
        instructions="Answer weather questions with the lookup tool.",
        tools=[lookup],
        model=model_for(),
        model_settings=ModelSettings(tool_choice="required"),
    )
    return Agent(name="triage", instructions="Route the question.", handoffs=[specialist], model=model_for())


async def test_chat_completions_tool_and_handoff(openai_client, gateway_rollout, user_processor):
    rig = gateway_rollout
    client = openai_client(rig.base_url, rig.key)
    triage = agents_for(lambda: OpenAIChatCompletionsModel(model="gpt-4o", openai_client=client))
    seen_by_user_before = len(user_processor.ended)

    result = await Runner.run(triage, "call transfer_to_specialist")
    agl.emit_reward(1.0)

    assert result.last_agent.name == "specialist"
    assert result.final_output.startswith("result: ")
    llm = rig.spans("llm")
    calls = rig.calls()
    assert len(llm) == len(calls) == 3
    assert [s.attributes["gen_ai.agent.name"] for s in llm] == ["triage", "specialist", "specialist"]
    assert [s.attributes["gen_ai.response.id"] for s in llm] == [c.call_id for c in calls]
    first = llm[0].attributes
    assert first["gen_ai.request.model"] == "gpt-4o"
    assert first["gen_ai.input.messages"][0] == {
        "role": "system",
        "parts": [{"type": "text", "content": "Route the question."}],
    }
    (call_part,) = first["gen_ai.output.messages"][0]["parts"]
    assert call_part["type"] == "tool_call" and call_part["name"] == "transfer_to_specialist"
    assert first["gen_ai.usage.input_tokens"] == len(calls[0].prompt_ids)

    (tool,) = rig.spans("tool")
    assert tool.attributes["gen_ai.tool.name"] == "lookup"
    assert tool.attributes["gen_ai.agent.name"] == "specialist"
    city = json.loads(tool.attributes["gen_ai.tool.call.arguments"])["city"]
    assert tool.attributes["gen_ai.tool.call.result"] == f"sunny in {city}"

    (handoff,) = [s for s in rig.spans("custom") if s.name.startswith("handoff")]
    assert handoff.attributes["agl.handoff.from_agent"] == "triage"
    assert handoff.attributes["agl.handoff.to_agent"] == "specialist"
    agents = {s.attributes["gen_ai.agent.name"]: s for s in rig.spans("agent")}
    assert agents["triage"].attributes["agl.agent.handoffs"] == ["specialist"]
    assert agents["specialist"].attributes["agl.agent.tools"] == ["lookup"]
    assert llm[0].parent_id == agents["triage"].span_id
    assert tool.parent_id == agents["specialist"].span_id
    # The user's own processor still saw every span.
    assert len(user_processor.ended) - seen_by_user_before >= len(rig.spans())

    transitions, report = rig.transitions()
    assert report.joined_by_id == 3
    assert [t.agent for t in transitions] == ["triage", "specialist", "specialist"]
    assert {t.token_source for t in transitions} == {"engine"}
    assert all(t.prompt_ids and t.response_ids for t in transitions)


async def test_streamed_chat_completions_carry_response_ids(openai_client, gateway_rollout):
    rig = gateway_rollout
    client = openai_client(rig.base_url, rig.key)
    agent = Agent(name="streamer", instructions="Be brief.", model=OpenAIChatCompletionsModel("gpt-4o", client))
    result = Runner.run_streamed(agent, "hello there")
    async for _ in result.stream_events():
        pass
    assert result.final_output == "echo: hello there"
    (llm,) = rig.spans("llm")
    (call,) = rig.calls()
    assert llm.attributes["gen_ai.response.id"] == call.call_id
    assert llm.attributes["gen_ai.agent.name"] == "streamer"


async def test_default_responses_path(openai_client, gateway_rollout):
    rig = gateway_rollout
    client = openai_client(rig.base_url, rig.key)
    triage = agents_for(lambda: "gpt-4o")  # a model name: the SDK's default provider path (Responses API)
    config = RunConfig(model_provider=OpenAIProvider(openai_client=client))

    result = await Runner.run(triage, "call transfer_to_specialist", run_config=config)
    agl.emit_reward(0.5)

    assert result.last_agent.name == "specialist"
    llm = rig.spans("llm")
    calls = rig.calls()
    assert len(llm) == len(calls) == 3
    assert all(s.attributes["agl.api"] == "responses" for s in llm)
    assert [s.attributes["gen_ai.agent.name"] for s in llm] == ["triage", "specialist", "specialist"]
    assert [s.attributes["gen_ai.response.id"] for s in llm] == [c.call_id for c in calls]
    assert llm[0].attributes["gen_ai.system_instructions"] == "Route the question."
    assert llm[1].attributes["gen_ai.output.messages"][0]["parts"][0]["name"] == "lookup"

    transitions, report = rig.transitions()
    assert report.joined_by_id == 3
    assert [t.reward for t in transitions] == [0.5] * 3
    assert {t.token_source for t in transitions} == {"engine"}


async def test_tracing_disabled_still_reaches_the_gateway(openai_client, gateway_rollout):
    rig = gateway_rollout
    client = openai_client(rig.base_url, rig.key)
    agent = Agent(name="dark", model=OpenAIChatCompletionsModel("gpt-4o", client))
    result = await Runner.run(agent, "hi", run_config=RunConfig(tracing_disabled=True))
    assert result.final_output == "echo: hi"
    assert rig.spans() == []
    assert len(rig.calls()) == 1


async def test_internal_failure_never_breaks_the_agent(openai_client, gateway_rollout, monkeypatch):
    rig = gateway_rollout
    agl_openai_agents.instrument()

    def broken(*args, **kwargs):
        raise RuntimeError("agl bug")

    monkeypatch.setattr(convert, "to_agl", broken)
    agl_openai_agents.errors.clear()
    client = openai_client(rig.base_url, rig.key)
    agent = Agent(name="robust", model=OpenAIChatCompletionsModel("gpt-4o", client))
    result = await Runner.run(agent, "still works")
    assert result.final_output == "echo: still works"
    assert agl_openai_agents.errors["on_span_end"] >= 2  # the generation and the agent span
    assert rig.spans() == []


@pytest.mark.slow
@pytest.mark.parametrize(("value", "on"), [("yes", True), ("1", True), ("0", False), ("", False), ("Off", False)])
def test_env_var_instruments_at_startup(tmp_path, value, on):
    import subprocess
    import sys

    code = "import agl_openai_agents; print(agl_openai_agents.instrumented())"
    env = {"AGL_OPENAI_AGENTS_INSTRUMENT": value, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == str(on), out.stderr
    assert "agl_openai_agents" not in out.stderr


@pytest.mark.slow
def test_env_var_with_a_value_env_flag_refuses_is_reported_and_off(tmp_path):
    import subprocess
    import sys

    code = "import agl_openai_agents; print(agl_openai_agents.instrumented())"
    env = {"AGL_OPENAI_AGENTS_INSTRUMENT": "sure", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
    assert "AGL_OPENAI_AGENTS_INSTRUMENT='sure': use 1, true, yes or on" in out.stderr
