"""LangGraph graphs: every LLM call carries its node's name, parents link up to the graph."""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

import agl
from agl_langchain import AglCallbackHandler
from tests.langchain.fakes import fake_model


class Draft(TypedDict):
    topic: str
    draft: str
    verdict: str
    rounds: int


def writer_graph(model):
    """write → check → (rewrite → check)* → end: a conditional edge decides."""

    def write(state: Draft) -> dict:
        return {"draft": model.invoke(f"write about {state['topic']}").content, "rounds": 0}

    def check(state: Draft) -> dict:
        return {"verdict": model.invoke(f"is this good? {state['draft']}").content}

    def rewrite(state: Draft) -> dict:
        return {"draft": model.invoke(f"improve: {state['draft']}").content, "rounds": state["rounds"] + 1}

    def route(state: Draft) -> str:
        return END if state["verdict"] == "good" or state["rounds"] >= 3 else "rewrite"

    g = StateGraph(Draft)
    g.add_node("write", write)
    g.add_node("check", check)
    g.add_node("rewrite", rewrite)
    g.add_edge(START, "write")
    g.add_edge("write", "check")
    g.add_conditional_edges("check", route, ["rewrite", END])
    g.add_edge("rewrite", "check")
    return g.compile()


def ancestors(span, by_id):
    chain = []
    while span.parent_id is not None:
        span = by_id[span.parent_id]
        chain.append(span.name)
    return chain


def test_each_llm_call_carries_its_node(cap):
    model = fake_model(["a draft", "bad", "a better draft", "good"])
    graph = writer_graph(model)
    handler = AglCallbackHandler()
    with agl.use_rollout(cap.ctx):
        out = graph.invoke({"topic": "owls"}, config={"callbacks": [handler]})
    assert out["draft"] == "a better draft" and out["verdict"] == "good"

    by_id = cap.by_id()
    llm = [s for s in by_id.values() if s.kind == "llm"]
    llm.sort(key=lambda s: s.seq)
    assert [s.attributes["gen_ai.agent.name"] for s in llm] == ["write", "check", "rewrite", "check"]
    assert [s.attributes["agl.agent.step"] for s in llm] == [1, 2, 3, 4]
    assert [s.attributes["gen_ai.output.messages"][0]["content"] for s in llm] == [
        "a draft",
        "bad",
        "a better draft",
        "good",
    ]
    assert llm[2].attributes["gen_ai.input.messages"] == [{"role": "user", "content": "improve: a draft"}]
    for s in llm:
        node = by_id[s.parent_id]
        assert node.kind == "agent" and node.name == s.attributes["gen_ai.agent.name"]
        assert node.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert ancestors(s, by_id)[-1] == "LangGraph"
        assert s.rollout_id == "ro-test" and s.trace_id == cap.ctx.trace_id
        assert s.status == "ok" and s.start_time <= s.end_time
    # the conditional edge is a chain run inside the node it leaves from, not a node itself
    routes = [s for s in by_id.values() if s.name == "route"]
    assert len(routes) == 2 and all(by_id[r.parent_id].name == "check" for r in routes)
    assert all("gen_ai.agent.name" not in r.attributes for r in routes)
    assert len({s.seq for s in by_id.values()}) == len(by_id)
    assert handler.errors == 0 and handler.open_runs() == 0


class Fan(TypedDict):
    topics: list[str]
    answers: Annotated[list[str], operator.add]
    summary: str


class Item(TypedDict):
    topic: str


def test_parallel_branches_and_a_subgraph(cap):
    model = fake_model(["x", "y", "z", "inner", "summary"], cycle=2)

    def research(item: Item) -> dict:
        return {"answers": [model.invoke(f"research {item['topic']}").content]}

    class Inner(TypedDict):
        topics: list[str]
        summary: str

    def polish(state: Inner) -> dict:
        return {"summary": model.invoke("polish").content}

    sub = StateGraph(Inner)
    sub.add_node("polish", polish)
    sub.add_edge(START, "polish")
    sub.add_edge("polish", END)
    subgraph = sub.compile()

    def fan_out(state: Fan):
        return [Send("research", {"topic": t}) for t in state["topics"]]

    def summarize(state: Fan) -> dict:
        return {"summary": model.invoke("sum up " + ",".join(sorted(state["answers"]))).content}

    g = StateGraph(Fan)
    g.add_node("research", research)
    g.add_node("editor", subgraph)
    g.add_node("summarize", summarize)
    g.add_conditional_edges(START, fan_out, ["research"])
    g.add_edge("research", "editor")
    g.add_edge("editor", "summarize")
    g.add_edge("summarize", END)
    graph = g.compile()

    with agl.use_rollout(cap.ctx):
        out = graph.invoke({"topics": ["a", "b", "c"], "answers": []}, config={"callbacks": [AglCallbackHandler()]})
    assert sorted(out["answers"]) == ["x", "y", "z"]

    by_id = cap.by_id()
    llm = sorted((s for s in by_id.values() if s.kind == "llm"), key=lambda s: s.seq)
    agents = [s.attributes["gen_ai.agent.name"] for s in llm]
    # the call inside the subgraph belongs to the subgraph (its node in the parent graph)
    assert agents == ["research"] * 3 + ["editor", "summarize"]
    assert [s.attributes["agl.langgraph.node"] for s in llm] == ["research"] * 3 + ["polish", "summarize"]
    research_nodes = {s.parent_id for s in llm[:3]}
    assert len(research_nodes) == 3, "each parallel branch is its own node run"
    polish = llm[3]
    # the inner node of the subgraph is the nearest node; the path goes through the subgraph node
    path = ancestors(polish, by_id)
    assert path[0] == "polish" and "editor" in path and path[-1] == "LangGraph"
    assert "editor:" in polish.attributes["agl.langgraph.checkpoint_ns"]
