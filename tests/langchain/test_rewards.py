"""Rewards from inside the agent: agl.emit_reward and the agl_reward custom event."""

from __future__ import annotations

from typing import TypedDict

from langchain_core.callbacks import adispatch_custom_event, dispatch_custom_event
from langgraph.graph import END, START, StateGraph

import agl
from agl_langchain import AglCallbackHandler
from tests.langchain.fakes import fake_model


class S(TypedDict):
    answer: str


def graded_graph(model, grade):
    def solve(state: S) -> dict:
        return {"answer": model.invoke("2+2?").content}

    def judge(state: S) -> dict:
        grade(state)
        return {}

    g = StateGraph(S)
    g.add_node("solve", solve)
    g.add_node("judge", judge)
    g.add_edge(START, "solve")
    g.add_edge("solve", "judge")
    g.add_edge("judge", END)
    return g.compile()


def test_custom_event_reward_attaches_to_the_node_span(cap):
    def grade(state):
        dispatch_custom_event("agl_reward", {"value": 1.0 if state["answer"] == "4" else 0.0, "name": "correct"})
        dispatch_custom_event("agl_reward", 0.25)
        dispatch_custom_event("progress", {"note": "graded"})

    with agl.use_rollout(cap.ctx):
        graded_graph(fake_model(["4"]), grade).invoke({"answer": ""}, config={"callbacks": [AglCallbackHandler()]})

    by_id = cap.by_id()
    (judge,) = [s for s in by_id.values() if s.name == "judge"]
    rewards = sorted(cap.rewards(), key=lambda r: r.seq)
    assert [(r.name, r.value) for r in rewards] == [("correct", 1.0), ("reward", 0.25)]
    assert all(r.span_id == judge.span_id and r.rollout_id == "ro-test" for r in rewards)
    assert all(r.source == "langchain" for r in rewards)
    (event,) = [s for s in by_id.values() if s.kind == "custom"]
    assert event.name == "progress" and event.parent_id == judge.span_id
    assert event.attributes["agl.event.data"] == {"note": "graded"}


def test_reward_event_without_a_number_is_kept_as_a_custom_span(cap):
    def grade(state):
        dispatch_custom_event("agl_reward", {"value": "great"})

    with agl.use_rollout(cap.ctx):
        graded_graph(fake_model(["4"]), grade).invoke({"answer": ""}, config={"callbacks": [AglCallbackHandler()]})
    assert cap.rewards() == []
    (event,) = cap.spans(kind="custom")
    assert event.name == "agl_reward" and event.attributes["agl.event.data"] == {"value": "great"}


def test_emit_reward_inside_a_node_uses_the_current_rollout(cap):
    def grade(state):
        agl.emit_reward(0.5, name="style")

    with agl.use_rollout(cap.ctx):
        graded_graph(fake_model(["4"]), grade).invoke({"answer": ""}, config={"callbacks": [AglCallbackHandler()]})
    (reward,) = cap.rewards()
    assert (reward.rollout_id, reward.name, reward.value) == ("ro-test", "style", 0.5)


async def test_async_custom_event_reward(cap):
    class A(TypedDict):
        x: int

    async def score(state: A) -> dict:
        await adispatch_custom_event("agl_reward", {"value": 2})
        return {}

    g = StateGraph(A)
    g.add_node("score", score)
    g.add_edge(START, "score")
    g.add_edge("score", END)
    with agl.use_rollout(cap.ctx):
        await g.compile().ainvoke({"x": 1}, config={"callbacks": [AglCallbackHandler()]})
    (reward,) = cap.rewards()
    (node,) = [s for s in cap.spans() if s.name == "score"]
    assert reward.value == 2.0 and reward.span_id == node.span_id
