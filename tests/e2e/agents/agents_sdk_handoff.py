"""An OpenAI Agents SDK triage agent that hands off to a weather agent, as in the SDK's handoff examples.

The SDK's default model path (the Responses API) and its default client, which reads
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` from the environment. The triage agent must
hand off (``tool_choice="required"``; the handoff is its only tool); the weather agent
must call its tool, whose result is the final output (``stop_on_first_tool``).

Prints one JSON line: the final output, the last agent, the tool runs and the number
of model responses.
"""

import json

from agents import Agent, ModelSettings, Runner, function_tool

TOOL_RUNS = []


@function_tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    TOOL_RUNS.append(city)
    return f"It is sunny and 21 C in {city}."


weather_agent = Agent(
    name="Weather agent",
    handoff_description="Answers questions about the weather.",
    instructions="You answer weather questions. Always use the get_weather tool.",
    tools=[get_weather],
    tool_use_behavior="stop_on_first_tool",
    model_settings=ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=48),
)

triage_agent = Agent(
    name="Triage agent",
    instructions="Hand weather questions off to the weather agent.",
    handoffs=[weather_agent],
    model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=48),
)

if __name__ == "__main__":
    result = Runner.run_sync(triage_agent, "What is the weather in Paris?", max_turns=4)
    print(
        json.dumps(
            {
                "answer": result.final_output,
                "last_agent": result.last_agent.name,
                "tool_runs": TOOL_RUNS,
                "model_calls": len(result.raw_responses),
                "response_ids": [r.response_id for r in result.raw_responses],
            }
        )
    )
