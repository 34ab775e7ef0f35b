"""A LangChain ``create_agent`` agent whose tool calls the model itself.

Written like the LangChain agents quickstart: a chat model, a tool, a system prompt.
The ``summarize`` tool asks a second ChatOpenAI for a one-line summary, so one agent
run makes model calls from two places (the agent loop and inside the tool). A small
middleware asks for a tool on the first turn. The endpoint comes from the environment
(``OPENAI_API_BASE``, ``OPENAI_API_KEY``).

Prints one JSON line: the final answer, the tool runs and the number of model calls.
"""

import json

from langchain.agents import create_agent
from langchain.agents.middleware import wrap_model_call
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

TOOL_RUNS = []
WRITER_CALLS = []

writer = ChatOpenAI(model="gpt-4.1-nano", temperature=0, max_tokens=24)


@tool
def summarize(text: str) -> str:
    """Summarize a text in one short sentence."""
    TOOL_RUNS.append(text)
    reply = writer.invoke(f"Summarize in one short sentence: {text}")
    WRITER_CALLS.append(reply.response_metadata.get("id"))
    return reply.content


@wrap_model_call
def tool_first(request, handler):
    if not any(isinstance(m, ToolMessage) for m in request.messages):
        request = request.override(tool_choice="required")
    return handler(request)


agent = create_agent(
    model=ChatOpenAI(model="gpt-4o", temperature=0, max_tokens=48),
    tools=[summarize],
    system_prompt="You are a research assistant. Use the summarize tool, then answer briefly.",
    middleware=[tool_first],
    name="researcher",
)

if __name__ == "__main__":
    text = "Owls are birds of prey that hunt at night. They have large eyes and can turn their heads far."
    result = agent.invoke(
        {"messages": [{"role": "user", "content": f"Summarize this for me: {text}"}]}, {"recursion_limit": 8}
    )
    ai = [m for m in result["messages"] if m.type == "ai"]
    print(
        json.dumps(
            {
                "answer": result["messages"][-1].content,
                "tool_runs": TOOL_RUNS,
                "model_calls": len(ai) + len(WRITER_CALLS),
                "response_ids": [m.response_metadata.get("id") for m in ai] + WRITER_CALLS,
            }
        )
    )
