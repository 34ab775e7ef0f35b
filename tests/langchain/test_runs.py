"""Chat models, tools and agents in every invocation style: sync, async, batch, streams."""

from __future__ import annotations

import asyncio
import json
from typing import TypedDict

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import ToolException, tool
from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel

import agl
from agl_langchain import AglCallbackHandler
from tests.langchain.fakes import fake_model, tool_call


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_create_agent_tool_loop(cap):
    model = fake_model([tool_call("add", {"a": 2, "b": 3}, "call-1"), "the sum is 5"])
    agent = create_agent(model, tools=[add], system_prompt="You add numbers.", name="adder")
    with agl.use_rollout(cap.ctx):
        out = agent.invoke({"messages": [HumanMessage("what is 2+3?")]}, config={"callbacks": [AglCallbackHandler()]})
    assert out["messages"][-1].content == "the sum is 5"

    by_id = cap.by_id()
    llm = sorted((s for s in by_id.values() if s.kind == "llm"), key=lambda s: s.seq)
    assert len(llm) == 2
    first, second = (s.attributes for s in llm)
    assert [t["function"]["name"] for t in first["gen_ai.tool.definitions"]] == ["add"]
    assert first["gen_ai.input.messages"] == [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "what is 2+3?"},
    ]
    call = first["gen_ai.output.messages"][0]["tool_calls"][0]
    assert call["id"] == "call-1" and call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == {"a": 2, "b": 3}
    assert (
        first["gen_ai.agent.name"] == "adder"
        and first["agl.langgraph.node"] == "model"
        and first["agl.langchain.agent_name"] == "adder"
    )
    # the second call sees the tool's answer, in OpenAI form
    assert second["gen_ai.input.messages"][-1] == {
        "role": "tool",
        "content": "5",
        "name": "add",
        "tool_call_id": "call-1",
    }

    (tool_span,) = [s for s in by_id.values() if s.kind == "tool"]
    assert tool_span.name == "add" and tool_span.status == "ok"
    assert tool_span.attributes["gen_ai.tool.name"] == "add"
    assert tool_span.attributes["gen_ai.tool.call.id"] == "call-1"
    assert tool_span.attributes["gen_ai.tool.call.arguments"] == {"a": 2, "b": 3}
    assert tool_span.attributes["gen_ai.tool.call.result"] == "5"
    assert tool_span.attributes["gen_ai.agent.name"] == "adder"
    assert tool_span.attributes["agl.langgraph.node"] == "tools"
    assert llm[0].seq < tool_span.seq < llm[1].seq


def test_tool_errors_are_error_spans(cap):
    @tool
    def broken(x: int) -> int:
        """Always fails."""
        raise ToolException("no luck")

    # handled: the tool answers with the error and the agent goes on
    handled = broken.model_copy(update={"handle_tool_error": True})
    agent = create_agent(fake_model([tool_call("broken", {"x": 1}, "call-9"), "sorry"]), tools=[handled])
    with agl.use_rollout(cap.ctx):
        out = agent.invoke({"messages": [HumanMessage("go")]}, config={"callbacks": [AglCallbackHandler()]})
    assert out["messages"][-1].content == "sorry"
    (tool_span,) = cap.spans(kind="tool")
    assert tool_span.status == "error" and "no luck" in tool_span.attributes["gen_ai.tool.call.result"]

    # unhandled: the agent fails with the tool's own exception, and the span says so
    agent = create_agent(fake_model([tool_call("broken", {"x": 1}, "call-10"), "sorry"]), tools=[broken])
    ctx = agl.RolloutContext(rollout_id="ro-raise", writer=cap.writer)
    with agl.use_rollout(ctx):
        try:
            agent.invoke({"messages": [HumanMessage("go")]}, config={"callbacks": [AglCallbackHandler()]})
        except ToolException as exc:
            assert str(exc) == "no luck"
        else:
            raise AssertionError("the tool error should reach the caller")
    (tool_span,) = cap.spans("ro-raise", kind="tool")
    assert tool_span.status == "error" and tool_span.attributes["error.message"] == "no luck"
    assert any(s.name == "LangGraph" and s.status == "error" for s in cap.spans("ro-raise"))


class Verdict(BaseModel):
    ok: bool
    reason: str


def test_with_structured_output(cap):
    model = fake_model([tool_call("Verdict", {"ok": True, "reason": "fine"}, "call-s")])
    judge = model.with_structured_output(Verdict)
    with agl.use_rollout(cap.ctx):
        verdict = judge.invoke(
            [SystemMessage("judge"), HumanMessage("2+2=4")], config={"callbacks": [AglCallbackHandler()]}
        )
    assert verdict == Verdict(ok=True, reason="fine")
    (llm,) = cap.spans(kind="llm")
    assert llm.attributes["gen_ai.tool.definitions"][0]["function"]["name"] == "Verdict"
    out = llm.attributes["gen_ai.output.messages"][0]
    assert json.loads(out["tool_calls"][0]["function"]["arguments"]) == {"ok": True, "reason": "fine"}
    parent = cap.by_id()[llm.parent_id]
    assert parent.kind == "agent"  # the model | parser sequence


def test_batch_runs_in_threads_attach_to_the_rollout(cap):
    model = fake_model([f"answer {i}" for i in range(8)])
    handler = AglCallbackHandler()
    with agl.use_rollout(cap.ctx):
        outs = model.batch([f"q{i}" for i in range(8)], config={"callbacks": [handler], "max_concurrency": 4})
    assert sorted(o.content for o in outs) == sorted(f"answer {i}" for i in range(8))
    llm = cap.spans(kind="llm")
    assert len(llm) == 8 and all(s.rollout_id == "ro-test" for s in llm)
    assert sorted(s.attributes["gen_ai.input.messages"][0]["content"] for s in llm) == sorted(f"q{i}" for i in range(8))
    assert len({s.span_id for s in llm}) == 8 and handler.errors == 0


def test_stream_records_the_whole_answer(cap):
    model = fake_model(["one two three"])
    with agl.use_rollout(cap.ctx):
        chunks = list(model.stream("count", config={"callbacks": [AglCallbackHandler()]}))
    assert len(chunks) > 1
    (llm,) = cap.spans(kind="llm")
    assert llm.attributes["gen_ai.output.messages"][0]["content"] == "one two three"


def test_model_error_is_recorded_and_raised_unchanged(cap):
    model = fake_model([])  # the iterator is empty: the fake raises
    handler = AglCallbackHandler()
    with agl.use_rollout(cap.ctx):
        try:
            model.invoke("hi", config={"callbacks": [handler]})
        except Exception as exc:  # whatever the fake raises reaches the caller untouched
            raised = exc
        else:
            raise AssertionError("the fake model should have failed")
    (llm,) = cap.spans(kind="llm")
    assert llm.status == "error" and llm.attributes["error.type"] == type(raised).__name__
    assert handler.errors == 0


class Story(TypedDict):
    text: str


def async_graph(model):
    async def draft(state: Story) -> dict:
        return {"text": (await model.ainvoke("draft")).content}

    async def edit(state: Story) -> dict:
        return {"text": (await model.ainvoke("edit " + state["text"])).content}

    g = StateGraph(Story)
    g.add_node("draft", draft)
    g.add_node("edit", edit)
    g.add_edge(START, "draft")
    g.add_edge("draft", "edit")
    g.add_edge("edit", END)
    return g.compile()


async def test_astream_events_async_graph(cap):
    graph = async_graph(fake_model(["first words", "final words"]))
    with agl.use_rollout(cap.ctx):
        events = [e async for e in graph.astream_events({"text": ""}, config={"callbacks": [AglCallbackHandler()]})]
    assert any(e["event"] == "on_chat_model_stream" for e in events)
    llm = sorted(cap.spans(kind="llm"), key=lambda s: s.seq)
    assert [s.attributes["gen_ai.agent.name"] for s in llm] == ["draft", "edit"]
    assert [s.attributes["gen_ai.output.messages"][0]["content"] for s in llm] == ["first words", "final words"]


async def test_concurrent_async_rollouts_stay_apart(cap):
    """Two rollouts on one event loop: the handler (run inline) sees each one's context."""
    handler = AglCallbackHandler()

    async def one(rollout_id: str) -> None:
        ctx = agl.RolloutContext(rollout_id=rollout_id, writer=cap.writer)
        with agl.use_rollout(ctx):
            graph = async_graph(fake_model([f"{rollout_id} a", f"{rollout_id} b"]))
            async for _ in graph.astream({"text": ""}, config={"callbacks": [handler]}):
                await asyncio.sleep(0)

    await asyncio.gather(one("ro-a"), one("ro-b"))
    for rid in ("ro-a", "ro-b"):
        llm = cap.spans(rid, kind="llm")
        assert len(llm) == 2
        assert all(s.attributes["gen_ai.output.messages"][0]["content"].startswith(rid) for s in llm)
        assert all(s.rollout_id == rid for s in cap.spans(rid))


def test_llm_result_metadata_is_recorded(cap):
    reply = AIMessage(
        "hello",
        response_metadata={"id": "chatcmpl-42", "model_name": "gpt-x", "finish_reason": "stop"},
        usage_metadata={"input_tokens": 7, "output_tokens": 2, "total_tokens": 9},
    )
    model = fake_model([reply])
    with agl.use_rollout(cap.ctx):
        model.invoke("hi", config={"callbacks": [AglCallbackHandler()]})
    (llm,) = cap.spans(kind="llm")
    a = llm.attributes
    assert a["gen_ai.response.id"] == "chatcmpl-42"
    assert a["gen_ai.response.model"] == "gpt-x"
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (7, 2)
