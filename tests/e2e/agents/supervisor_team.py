"""The langgraph-supervisor quickstart's shape: a supervisor and two named workers.

As in the quickstart, the workers are built with ``create_react_agent(name=…)`` and
``create_agent(name=…)`` and the supervisor with ``create_supervisor``; every model is a
``ChatOpenAI`` whose endpoint comes from the environment. SmolLM2 never calls a tool on
its own, so the supervisor's model is bound to its hand-off tool with that tool chosen
(the one change from the quickstart): it hands off to ``math_expert`` on every turn, and
the recursion limit ends the run.

Prints one JSON line: the names of the nodes that ran and the number of model calls.
"""

import json

from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent
from langgraph_supervisor import create_handoff_tool, create_supervisor

CALLS = []


@tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@tool
def web_search(query: str) -> str:
    """Search the web for information."""
    return "Meta 67,317; Apple 164,000"


def model(max_tokens: int = 12) -> ChatOpenAI:
    return ChatOpenAI(model="gpt-4o", temperature=0, max_tokens=max_tokens)


math_agent = create_react_agent(
    model=model(), tools=[add], name="math_expert", prompt="You are a math expert. Always use one tool at a time."
)
research_agent = create_agent(
    model=model(), tools=[web_search], name="research_expert", system_prompt="You are a world class researcher."
)
handoffs = [create_handoff_tool(agent_name="math_expert"), create_handoff_tool(agent_name="research_expert")]
supervisor_model = model(max_tokens=48).bind_tools(
    handoffs, tool_choice={"type": "function", "function": {"name": "transfer_to_math_expert"}}
)
workflow = create_supervisor(
    [research_agent, math_agent],
    model=supervisor_model,
    tools=handoffs,
    prompt="You are a team supervisor managing a research expert and a math expert.",
)
app = workflow.compile()

if __name__ == "__main__":
    question = "what's the combined headcount of the FAANG companies in 2024?"
    nodes = []
    try:
        for update in app.stream({"messages": [{"role": "user", "content": question}]}, {"recursion_limit": 6}):
            nodes.extend(update)
    except GraphRecursionError:
        pass  # the supervisor hands off on every turn: the limit ends the run
    print(json.dumps({"nodes": nodes}))
