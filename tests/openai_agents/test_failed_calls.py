"""A failed call keeps its agent and its request, so it still joins the gateway's record.

The client gives up on the first call after the gateway has answered (an httpx
response hook raising ``ReadTimeout``, as a client timeout would): the gateway has
recorded the call, the SDK ends its span with an error and no response.
"""

from __future__ import annotations

import json

import httpx
import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.exceptions import ModelBehaviorError
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.models.openai_provider import OpenAIProvider
from openai import APITimeoutError, AsyncOpenAI

import agl
from agl_trainer.transitions import TransitionConfig, build_transitions


def timing_out_client(openai_client, base_url: str, key: str) -> AsyncOpenAI:
    """A real client whose first response arrives too late: the call fails after the gateway recorded it."""
    seen: list[httpx.Response] = []

    async def give_up_on_first(response: httpx.Response) -> None:
        seen.append(response)
        if len(seen) == 1:
            raise httpx.ReadTimeout("gave up waiting", request=response.request)

    http = httpx.AsyncClient(event_hooks={"response": [give_up_on_first]})
    return openai_client(base_url, key, http_client=http)


def run_config(path: str, client: AsyncOpenAI) -> tuple[Agent, RunConfig]:
    if path == "responses":  # a model name: the SDK's default provider path
        agent = Agent(name="triage", instructions="Route the question.", model="gpt-4o")
        return agent, RunConfig(model_provider=OpenAIProvider(openai_client=client))
    model = OpenAIChatCompletionsModel(model="gpt-4o", openai_client=client)
    return Agent(name="triage", instructions="Route the question.", model=model), RunConfig()


@pytest.mark.parametrize("path", ["responses", "chat_completions"])
async def test_a_failed_call_keeps_its_agent_and_joins(openai_client, gateway_rollout, path):
    rig = gateway_rollout
    agent, config = run_config(path, timing_out_client(openai_client, rig.base_url, rig.key))
    with pytest.raises(APITimeoutError):
        await Runner.run(agent, "where is my bag?", run_config=config)
    agl.emit_reward(0.0)

    (call,) = rig.calls()  # the gateway answered and recorded the call the client gave up on
    (llm,) = rig.spans("llm")
    attrs = llm.attributes
    assert llm.status == "error"
    assert "gen_ai.response.id" not in attrs
    assert attrs["gen_ai.agent.name"] == "triage"
    assert attrs["gen_ai.request.model"] == "gpt-4o"
    assert attrs["gen_ai.input.messages"] == [
        {"role": "system", "parts": [{"type": "text", "content": "Route the question."}]},
        {"role": "user", "parts": [{"type": "text", "content": "where is my bag?"}]},
    ]

    rig.writer.flush()
    rig.gateway.flush()
    ts, report = rig.transitions()
    assert report.joined_by_order == 1 and report.unmatched_spans == 0 and report.gateway_only == 0
    (t,) = ts
    assert t.call_id == call.call_id and t.agent == "triage" and t.token_source == "engine"
    kept, _ = build_transitions(rig.store, [rig.store.get_rollout(rig.rollout_id)], TransitionConfig(agents=["triage"]))
    assert [k.call_id for k in kept] == [call.call_id]


async def test_a_failed_call_without_sensitive_data_keeps_its_agent_only(openai_client, gateway_rollout):
    rig = gateway_rollout
    agent, config = run_config("responses", timing_out_client(openai_client, rig.base_url, rig.key))
    config.trace_include_sensitive_data = False
    with pytest.raises(APITimeoutError):
        await Runner.run(agent, "where is my bag?", run_config=config)
    (llm,) = rig.spans("llm")
    attrs = llm.attributes
    assert llm.status == "error"
    assert attrs["gen_ai.agent.name"] == "triage" and attrs["gen_ai.request.model"] == "gpt-4o"
    # the run keeps messages out of its spans, and so does agl
    assert "gen_ai.input.messages" not in attrs and "gen_ai.system_instructions" not in attrs
    assert "error.message" not in attrs


async def test_a_successful_call_without_sensitive_data_records_no_messages(openai_client, gateway_rollout):
    rig = gateway_rollout
    client = openai_client(rig.base_url, rig.key)
    agent, config = run_config("responses", client)
    config.trace_include_sensitive_data = False
    result = await Runner.run(agent, "hello", run_config=config)
    assert result.final_output == "echo: hello"
    (llm,) = rig.spans("llm")
    assert llm.status == "ok" and "gen_ai.input.messages" not in llm.attributes


@function_tool
def lookup(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


class CutSecondCall(httpx.AsyncBaseTransport):
    """Sends the second model request with ``max_output_tokens`` 2, so its answer is cut (``incomplete``)."""

    def __init__(self):
        self.inner = httpx.AsyncHTTPTransport()
        self.sent = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        if self.sent == 2:
            body = {**json.loads(request.content), "max_output_tokens": 2}
            headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
            request = httpx.Request(request.method, request.url, headers=headers, json=body)
        return await self.inner.handle_async_request(request)


async def test_a_call_cut_after_a_tool_turn_joins_by_its_request(openai_client, gateway_rollout):
    """The SDK raises on a Responses answer cut at the cap, leaving its span without a response id; its
    request (a function call and its output in the input) still finds the gateway's record."""
    rig = gateway_rollout
    http = httpx.AsyncClient(transport=CutSecondCall())
    client = openai_client(rig.base_url, rig.key, http_client=http)
    agent = Agent(name="helper", instructions="Use the tool.", model="gpt-4o", tools=[lookup])
    config = RunConfig(model_provider=OpenAIProvider(openai_client=client))
    with pytest.raises(ModelBehaviorError):
        await Runner.run(agent, "call lookup for Paris", run_config=config)
    agl.emit_reward(0.0)
    rig.writer.flush()
    rig.gateway.flush()

    first, cut = sorted(rig.calls(), key=lambda c: c.created_at)
    assert cut.response["status"] == "incomplete"
    ts, report = rig.transitions()
    assert report.joined_by_id == 1 and report.joined_by_order == 1 and report.unmatched_spans == 0
    assert [(t.call_id, t.agent) for t in ts] == [(first.call_id, "helper"), (cut.call_id, "helper")]
