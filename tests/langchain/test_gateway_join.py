"""A real ChatOpenAI through the agl gateway: LLM spans join the gateway's token records.

The engine behind the gateway is tests/fake_engine.py (a fast test double speaking
vLLM's token-id dialect) in the fast tests, and agl-verl's transformers engine with a
tiny random model in the slow one.
"""

from __future__ import annotations

from typing import TypedDict

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

import agl
from agl.capture import BufferedWriter
from agl.schema import Rollout, RolloutStatus, Task
from agl_langchain import AglCallbackHandler
from agl_trainer.gateway import Gateway
from agl_trainer.transitions import build_transitions
from tests.fake_engine import FakeEngine

TOKEN = "gw-token"


class Doc(TypedDict):
    topic: str
    draft: str
    verdict: str


def two_agent_graph(model):
    def write(state: Doc) -> dict:
        return {"draft": model.invoke([HumanMessage(f"write about {state['topic']}")]).content}

    def check(state: Doc) -> dict:
        return {"verdict": model.invoke([HumanMessage(f"check: {state['draft']}")]).content}

    g = StateGraph(Doc)
    g.add_node("write", write)
    g.add_node("check", check)
    g.add_edge(START, "write")
    g.add_edge("write", "check")
    g.add_edge("check", END)
    return g.compile()


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Harness:
    """Store, gateway and one claimed rollout at a time; runs an agent and builds its transitions."""

    def __init__(self, store, gateway: Gateway):
        self.store = store
        self.gateway = gateway
        self.writer = BufferedWriter(store, interval_s=0.05)
        store.add_tasks([Task(task_id="task-lc", input={"topic": "owls"})])
        self._n = 0

    def model(self, rollout_id: str, **kwargs) -> ChatOpenAI:
        key = self.gateway.rollout_key(rollout_id, self.store.get_rollout(rollout_id).attempt)  # the agent's key
        return ChatOpenAI(
            base_url=self.gateway.rollout_base_url(rollout_id), api_key=key, model="anything", max_retries=0, **kwargs
        )

    def rollout(self) -> str:
        self._n += 1
        rid = f"ro-lc-{self._n}"
        self.store.enqueue([Rollout(rollout_id=rid, task_id="task-lc")])
        (claimed,) = self.store.claim("runner-lc")
        assert claimed.rollout_id == rid
        return rid

    def finish(self, rid: str):
        self.writer.flush()
        self.gateway.flush()
        return self.store.finish(rid, RolloutStatus.SUCCEEDED, output="done")

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
def harness(sqlite_store):
    with FakeEngine() as engine:
        gw = Gateway(sqlite_store, [engine.url], token=TOKEN, model_version="v1").start()
        h = Harness(sqlite_store, gw)
        yield h
        h.close()
        gw.stop()


def test_llm_spans_carry_the_gateway_call_ids(harness):
    rid = harness.rollout()
    ctx = agl.RolloutContext(rollout_id=rid, writer=harness.writer)
    with agl.use_rollout(ctx):
        out = two_agent_graph(harness.model(rid)).invoke(
            {"topic": "owls"}, config={"callbacks": [AglCallbackHandler()]}
        )
        agl.emit_reward(1.0)
    assert out["draft"] == "echo: write about owls"
    rollout = harness.finish(rid)

    calls = {c.call_id: c for c in harness.store.query_llm_calls(rollout_id=rid)}
    spans = sorted(harness.store.query_spans(rollout_id=rid, kind="llm"), key=lambda s: s.seq)
    assert len(calls) == len(spans) == 2
    assert [s.attributes["gen_ai.response.id"] for s in spans] == sorted(calls, key=lambda c: calls[c].seq)
    for s in spans:
        call = calls[s.attributes["gen_ai.response.id"]]
        assert call.requested_model == "anything" == s.attributes["gen_ai.request.model"]
        assert s.attributes["gen_ai.usage.output_tokens"] == len(call.response_ids)
        assert s.attributes["gen_ai.usage.input_tokens"] == len(call.prompt_ids)

    ts, report = build_transitions(harness.store, [rollout])
    assert report.joined_by_id == 2 and report.unmatched_spans == 0 and report.text_only == 0
    assert [(t.agent, t.token_source, t.reward) for t in ts] == [("write", "engine", 1.0), ("check", "engine", 1.0)]
    assert [list(t.response_ids) for t in ts] == [list(calls[t.call_id].response_ids) for t in ts]


def test_create_agent_tool_loop_through_the_gateway(harness):
    rid = harness.rollout()
    agent = create_agent(harness.model(rid), tools=[add], name="calculator")
    with agl.use_rollout(agl.RolloutContext(rollout_id=rid, writer=harness.writer)):
        out = agent.invoke(
            {"messages": [HumanMessage("please call add")]}, config={"callbacks": [AglCallbackHandler()]}
        )
        agl.emit_reward(0.5)
    assert out["messages"][-1].content == "result: 2"
    rollout = harness.finish(rid)

    spans = sorted(harness.store.query_spans(rollout_id=rid), key=lambda s: s.seq)
    llm = [s for s in spans if s.kind == "llm"]
    (tool_span,) = [s for s in spans if s.kind == "tool"]
    call_ids = {c.call_id for c in harness.store.query_llm_calls(rollout_id=rid)}
    assert {s.attributes["gen_ai.response.id"] for s in llm} == call_ids and len(call_ids) == 2
    assert llm[0].attributes["gen_ai.output.messages"][0]["tool_calls"][0]["function"]["name"] == "add"
    assert llm[0].attributes["gen_ai.tool.definitions"][0]["function"]["name"] == "add"
    assert tool_span.attributes["gen_ai.tool.call.result"] == "2"

    ts, report = build_transitions(harness.store, [rollout])
    assert report.joined_by_id == 2 and [t.agent for t in ts] == ["calculator", "calculator"]
    assert all(t.token_source == "engine" for t in ts)


async def test_streamed_calls_join_by_order(harness):
    """ChatOpenAI drops the response id of streamed chunks (langchain-openai 1.7), so streamed
    spans have none; the builder then joins them by order, confirmed by their messages."""
    rid = harness.rollout()
    graph = two_agent_graph(harness.model(rid, streaming=True))
    with agl.use_rollout(agl.RolloutContext(rollout_id=rid, writer=harness.writer)):
        events = [
            e async for e in graph.astream_events({"topic": "bats"}, config={"callbacks": [AglCallbackHandler()]})
        ]
        agl.emit_reward(1.0)
    assert sum(e["event"] == "on_chat_model_stream" for e in events) > 2
    rollout = harness.finish(rid)
    spans = list(harness.store.query_spans(rollout_id=rid, kind="llm"))
    assert len(spans) == 2 and all("gen_ai.response.id" not in s.attributes for s in spans)
    ts, report = build_transitions(harness.store, [rollout])
    assert report.joined_by_order == 2 and report.unmatched_spans == 0
    assert [(t.agent, t.token_source) for t in ts] == [("write", "engine"), ("check", "engine")]


@pytest.mark.slow
def test_join_with_a_real_engine(sqlite_store, tmp_path):
    """The same join against agl-verl's transformers engine serving a tiny random model."""
    from agl_verl.engines.transformers_engine import TransformersEngine
    from agl_verl.models import build_tiny_model

    corpus = ["write about owls and check the draft .", "hello world ! how are you ? fine , thanks ."]
    model_dir = build_tiny_model(tmp_path / "tiny", corpus, vocab_size=120, seed=0)
    engine = TransformersEngine(model_dir, max_batch_size=4, max_model_len=512)
    (url,) = engine.start()
    gw = Gateway(sqlite_store, [url], token=TOKEN, model_version="v1").start()
    h = Harness(sqlite_store, gw)
    try:
        rid = h.rollout()
        with agl.use_rollout(agl.RolloutContext(rollout_id=rid, writer=h.writer)):
            two_agent_graph(h.model(rid, max_tokens=8, temperature=1.0)).invoke(
                {"topic": "owls"}, config={"callbacks": [AglCallbackHandler()]}
            )
            agl.emit_reward(1.0)
        rollout = h.finish(rid)
        calls = {c.call_id: c for c in sqlite_store.query_llm_calls(rollout_id=rid)}
        spans = list(sqlite_store.query_spans(rollout_id=rid, kind="llm"))
        assert len(spans) == 2 and {s.attributes["gen_ai.response.id"] for s in spans} == set(calls)
        ts, report = build_transitions(sqlite_store, [rollout])
        assert report.joined_by_id == 2 and sorted(t.agent for t in ts) == ["check", "write"]
        for t in ts:
            call = calls[t.call_id]
            assert list(t.prompt_ids) == list(call.prompt_ids) and len(t.response_ids) > 0
            assert t.response_logprobs is not None and len(t.response_logprobs) == len(t.response_ids)
    finally:
        h.close()
        gw.stop()
        engine.stop()
