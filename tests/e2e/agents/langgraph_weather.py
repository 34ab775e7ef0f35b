"""A LangGraph tool-calling graph, written the way the LangGraph quickstart writes one.

An LLM node bound to tools, a ToolNode, and a conditional edge between them. The
endpoint comes from the environment (``OPENAI_API_BASE``, ``OPENAI_API_KEY``), as
for any ChatOpenAI program. The first turn asks for the weather tool by name; later
turns let the model choose.

Prints one JSON line: the final answer, the tool runs and the model calls made.
"""

import json

from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

TOOL_RUNS = []


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    TOOL_RUNS.append(city)
    return f"It is sunny and 21 C in {city}."


tools = [get_weather]
llm = ChatOpenAI(model="gpt-4o-mini", temperature=0, max_tokens=48)
llm_must_look_up = llm.bind_tools(tools, tool_choice="get_weather")
llm_with_tools = llm.bind_tools(tools)


def assistant(state: MessagesState):
    looked_up = any(isinstance(m, ToolMessage) for m in state["messages"])
    model = llm_with_tools if looked_up else llm_must_look_up
    return {"messages": [model.invoke(state["messages"])]}


def route(state: MessagesState):
    # Look the weather up once; then answer.
    if sum(isinstance(m, ToolMessage) for m in state["messages"]) >= 1:
        return END
    return tools_condition(state)


builder = StateGraph(MessagesState)
builder.add_node("assistant", assistant)
builder.add_node("tools", ToolNode(tools))
builder.add_edge(START, "assistant")
builder.add_conditional_edges("assistant", route, ["tools", END])
builder.add_edge("tools", "assistant")
graph = builder.compile()

if __name__ == "__main__":
    result = graph.invoke(
        {
            "messages": [
                SystemMessage("You are a helpful weather assistant."),
                HumanMessage("What is the weather in Paris?"),
            ]
        }
    )
    ai = [m for m in result["messages"] if m.type == "ai"]
    print(
        json.dumps(
            {
                "answer": result["messages"][-1].content,
                "tool_runs": TOOL_RUNS,
                "model_calls": len(ai),
                "response_ids": [m.response_metadata.get("id") for m in ai],
            }
        )
    )
