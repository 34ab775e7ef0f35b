"""An AutoGen AgentChat AssistantAgent with a tool and streaming, as in the AgentChat quickstart.

``OpenAIChatCompletionClient`` reads ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` from the
environment like the openai client under it. ``model_client_stream=True`` streams the
model's tokens; ``reflect_on_tool_use=True`` makes a second call that turns the tool's
result into the answer.

Prints one JSON line: the final answer, the tool runs and the number of model calls.
"""

import asyncio
import json

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import ModelClientStreamingChunkEvent
from autogen_ext.models.openai import OpenAIChatCompletionClient

TOOL_RUNS = []


async def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    TOOL_RUNS.append(city)
    return f"It is sunny and 21 C in {city}."


async def main() -> None:
    model_client = OpenAIChatCompletionClient(model="gpt-4o", temperature=0, max_tokens=48)
    agent = AssistantAgent(
        name="weather_agent",
        model_client=model_client,
        tools=[get_weather],
        system_message="You are a helpful assistant. Use the get_weather tool to answer weather questions.",
        reflect_on_tool_use=True,
        model_client_stream=True,
    )
    chunks = 0
    result = None
    async for event in agent.run_stream(task="What is the weather in Paris? Call get_weather."):
        if isinstance(event, ModelClientStreamingChunkEvent):
            chunks += 1
        result = event
    await model_client.close()
    calls = sum(1 for m in result.messages if getattr(m, "models_usage", None) is not None)
    print(
        json.dumps(
            {
                "answer": result.messages[-1].to_text(),
                "tool_runs": TOOL_RUNS,
                "model_calls": calls,
                "stream_chunks": chunks,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
