"""An OpenAI Agents SDK agent with tracing switched off, as some SDK programs do.

``set_tracing_disabled(True)``: no trace processor sees anything, so whatever trains this
agent can only use what its model endpoint saw. The default model path (the Responses
API) and client (``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` from the environment). The agent
must call its tool first; then it answers (the SDK resets ``tool_choice`` after a tool
call).

Prints one JSON line: the final output, the tool runs and the number of model responses.
"""

import asyncio
import json

from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled

set_tracing_disabled(True)

TOOL_RUNS = []


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    TOOL_RUNS.append([a, b])
    return a + b


agent = Agent(
    name="Calculator",
    instructions="You are a calculator. Use the add tool, then give the result.",
    tools=[add],
    model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=48),
)


async def main() -> None:
    result = await Runner.run(agent, "What is 12 + 30?", max_turns=3)
    print(
        json.dumps(
            {
                "answer": result.final_output,
                "tool_runs": TOOL_RUNS,
                "model_calls": len(result.raw_responses),
                "response_ids": [r.response_id for r in result.raw_responses],
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
