"""A real ChatAnthropic through the agl gateway's Messages API: LLM spans join the gateway's token records.

The engine behind the gateway is tests/fake_engine.py (a test double speaking vLLM's
token-id dialect); its prompt ids are the bytes of ``render_chat``, so the recorded ids
can be checked against the chat template's.
"""

from __future__ import annotations

import pytest
from langchain.agents import create_agent
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import HumanMessage, SystemMessage

import agl
from agl_langchain import AglCallbackHandler
from agl_trainer.gateway import Gateway
from agl_trainer.transitions import build_transitions
from tests.fake_engine import FakeEngine, render_chat
from tests.langchain.test_gateway_join import TOKEN, Harness, add, two_agent_graph


class AnthropicHarness(Harness):
    def model(self, rollout_id: str, **kwargs) -> ChatAnthropic:
        key = self.gateway.rollout_key(rollout_id, self.store.get_rollout(rollout_id).attempt)  # the agent's key
        return ChatAnthropic(
            base_url=self.gateway.rollout_anthropic_url(rollout_id),
            api_key=key,
            model="claude-sonnet-4-5",
            max_tokens=256,
            max_retries=0,
            **kwargs,
        )


@pytest.fixture
def harness(sqlite_store):
    with FakeEngine() as engine:
        gw = Gateway(sqlite_store, [engine.url], token=TOKEN, model_version="v1").start()
        h = AnthropicHarness(sqlite_store, gw)
        h.engine = engine
        yield h
        h.close()
        gw.stop()


def test_chat_anthropic_spans_carry_the_gateway_call_ids(harness):
    rid = harness.rollout()
    with agl.use_rollout(agl.RolloutContext(rollout_id=rid, writer=harness.writer)):
        out = two_agent_graph(harness.model(rid)).invoke(
            {"topic": "owls"}, config={"callbacks": [AglCallbackHandler()]}
        )
        agl.emit_reward(1.0)
    assert out["draft"] == "echo: write about owls"
    sent = list(harness.engine.requests)
    rollout = harness.finish(rid)

    calls = sorted(harness.store.query_llm_calls(rollout_id=rid), key=lambda c: c.seq)
    spans = sorted(harness.store.query_spans(rollout_id=rid, kind="llm"), key=lambda s: s.seq)
    assert [c.endpoint for c in calls] == ["messages", "messages"]
    assert [s.attributes["gen_ai.response.id"] for s in spans] == [c.call_id for c in calls]
    for call, span, req in zip(calls, spans, sent, strict=True):
        assert list(call.prompt_ids) == list(render_chat(req["messages"]).encode())  # the template's ids
        assert span.attributes["gen_ai.usage.output_tokens"] == len(call.response_ids)
        assert span.attributes["gen_ai.usage.input_tokens"] == len(call.prompt_ids)

    ts, report = build_transitions(harness.store, [rollout])
    assert report.joined_by_id == 2 and report.unmatched_spans == 0 and report.text_only == 0
    assert [(t.agent, t.token_source, t.reward) for t in ts] == [("write", "engine", 1.0), ("check", "engine", 1.0)]
    assert [list(t.response_ids) for t in ts] == [list(c.response_ids) for c in calls]


def test_chat_anthropic_tool_loop_through_the_gateway(harness):
    rid = harness.rollout()
    agent = create_agent(harness.model(rid), tools=[add], name="calculator")
    with agl.use_rollout(agl.RolloutContext(rollout_id=rid, writer=harness.writer)):
        out = agent.invoke({"messages": [("user", "please call add")]}, config={"callbacks": [AglCallbackHandler()]})
        agl.emit_reward(0.5)
    assert out["messages"][-1].content == "result: 2"
    rollout = harness.finish(rid)

    calls = sorted(harness.store.query_llm_calls(rollout_id=rid), key=lambda c: c.seq)
    assert calls[0].response["content"][0]["type"] == "tool_use"
    assert calls[1].request["messages"][-1]["content"][0]["type"] == "tool_result"
    llm = [s for s in harness.store.query_spans(rollout_id=rid) if s.kind == "llm"]
    assert {s.attributes["gen_ai.response.id"] for s in llm} == {c.call_id for c in calls} and len(calls) == 2
    ts, report = build_transitions(harness.store, [rollout])
    assert report.joined_by_id == 2 and [t.agent for t in ts] == ["calculator", "calculator"]
    assert all(t.token_source == "engine" for t in ts)


async def test_streamed_chat_anthropic_joins_by_order(harness):
    """ChatAnthropic (langchain-anthropic 1.7) gives its callbacks no response id for a streamed
    call, so streamed spans have none; the builder joins them by order, confirmed by their
    messages (the Anthropic request's ``system`` read as the first message)."""
    rid = harness.rollout()
    graph = two_agent_graph(harness.model(rid, streaming=True))
    with agl.use_rollout(agl.RolloutContext(rollout_id=rid, writer=harness.writer)):
        events = [
            e async for e in graph.astream_events({"topic": "bats"}, config={"callbacks": [AglCallbackHandler()]})
        ]
        reply = await harness.model(rid, streaming=True).ainvoke(
            [SystemMessage("be brief"), HumanMessage("and now?")], config={"callbacks": [AglCallbackHandler()]}
        )
        agl.emit_reward(1.0)
    assert sum(e["event"] == "on_chat_model_stream" for e in events) > 2 and reply.content == "echo: and now?"
    rollout = harness.finish(rid)
    spans = list(harness.store.query_spans(rollout_id=rid, kind="llm"))
    assert len(spans) == 3 and all("gen_ai.response.id" not in s.attributes for s in spans)
    ts, report = build_transitions(harness.store, [rollout])
    assert report.joined_by_order == 3 and report.unmatched_spans == 0, report
    assert [t.token_source for t in ts] == ["engine"] * 3
    assert sorted(t.agent or "" for t in ts) == ["", "check", "write"]


def test_streamed_tool_loop_joins_by_order(harness):
    """A streamed tool loop: the tool's answer, a tool_result block in the Anthropic request,
    is the ToolMessage the span recorded."""
    rid = harness.rollout()
    agent = create_agent(harness.model(rid, streaming=True), tools=[add], name="calculator")
    with agl.use_rollout(agl.RolloutContext(rollout_id=rid, writer=harness.writer)):
        out = agent.invoke({"messages": [("user", "please call add")]}, config={"callbacks": [AglCallbackHandler()]})
        agl.emit_reward(0.5)
    assert out["messages"][-1].text == "result: 2"
    rollout = harness.finish(rid)
    calls = sorted(harness.store.query_llm_calls(rollout_id=rid), key=lambda c: c.seq)
    spans = sorted(harness.store.query_spans(rollout_id=rid, kind="llm"), key=lambda s: s.seq)
    assert [s.attributes["gen_ai.usage.input_tokens"] for s in spans] == [len(c.prompt_ids) for c in calls]
    ts, report = build_transitions(harness.store, [rollout])
    assert report.joined_by_order == 2 and report.unmatched_spans == 0, report
    assert [(t.agent, t.token_source) for t in ts] == [("calculator", "engine")] * 2
