"""The OpenAI Agents SDK, on its default Responses path, through the gateway (fake engine)."""

from __future__ import annotations

from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool

from agl_trainer.gateway import check_continuity
from tests.gateway.conftest import calls_of, key_of


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def make_agent(openai_client, gateway, rollout) -> Agent:
    client = openai_client(gateway.rollout_base_url(rollout), key_of(gateway, gateway.store, rollout))
    return Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model="gpt-5.2", openai_client=client),
    )


async def test_agent_with_a_tool_runs_and_every_call_is_recorded(openai_client, gateway, store, rollout):
    result = await Runner.run(
        make_agent(openai_client, gateway, rollout),
        "call get_weather for Paris",
        run_config=RunConfig(tracing_disabled=True),
    )
    assert result.final_output == "result: sunny in call get_weather for Paris"
    calls = calls_of(gateway, store, rollout)
    assert [c.endpoint for c in calls] == ["responses", "responses"]
    assert [c.requested_model for c in calls] == ["gpt-5.2", "gpt-5.2"]
    assert [r.status for r in check_continuity(calls)] == ["new", "extends"]
    assert [c.call_id for c in calls] == [r.response_id for r in result.raw_responses]


async def test_streamed_agent_run(openai_client, gateway, store, rollout):
    run = Runner.run_streamed(
        make_agent(openai_client, gateway, rollout),
        "call get_weather for Rome",
        run_config=RunConfig(tracing_disabled=True),
    )
    kinds = [event.type async for event in run.stream_events()]
    assert run.final_output == "result: sunny in call get_weather for Rome"
    assert "raw_response_event" in kinds
    calls = calls_of(gateway, store, rollout)
    assert len(calls) == 2 and all(len(c.response_ids) == len(c.response_logprobs) for c in calls)
