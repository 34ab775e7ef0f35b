"""The rollout's response cap (``Rollout.max_response_tokens``), enforced by the gateway.

The fake engine (a test double, see tests/fake_engine.py) answers ``echo: <text>``, one
token a byte, and cuts the answer at ``max_tokens`` with finish reason ``length``: what
reaches it, and what the client and the store see, is what these tests check.
"""

from __future__ import annotations

import openai
import pytest
from agents import Agent, ModelBehaviorError, OpenAIResponsesModel, RunConfig, Runner

from agl.runner import Runner as RolloutRunner
from agl.schema import Rollout, RolloutStatus
from agl_trainer.gateway import Gateway
from agl_trainer.transitions import TransitionConfig, build_transitions
from tests.fake_engine import FakeEngine
from tests.gateway.conftest import TOKEN, calls_of, key_of

CAP = 5
LONG = "tell me something long enough to pass the cap"


@pytest.fixture
def capped(store) -> str:
    store.enqueue([Rollout(rollout_id="ro-capped", task_id="task-1", max_response_tokens=CAP)])
    return "ro-capped"


@pytest.fixture
def capped_client(gateway, store, capped):
    store.claim("runner", limit=1)
    key = key_of(gateway, store, capped)
    with openai.OpenAI(base_url=gateway.rollout_base_url(capped), api_key=key, max_retries=0) as c:
        yield c


@pytest.mark.parametrize("asked, sent", [(None, CAP), (3, 3), (50, CAP)])
def test_chat_gets_the_lower_of_the_clients_limit_and_the_cap(capped_client, engine, gateway, store, asked, sent):
    extra = {} if asked is None else {"max_tokens": asked}
    resp = capped_client.chat.completions.create(model="m", messages=[{"role": "user", "content": LONG}], **extra)
    assert engine.requests[-1]["max_tokens"] == sent
    assert resp.choices[0].finish_reason == "length" and len(resp.choices[0].message.content) == sent
    [call] = calls_of(gateway, store, "ro-capped")
    assert call.max_response_tokens == CAP and len(call.response_ids) == sent
    assert "max_tokens" not in call.request or call.request["max_tokens"] == asked  # the client's own request


def test_max_completion_tokens_and_streams_are_capped_too(capped_client, engine, gateway, store):
    stream = capped_client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": LONG}], max_completion_tokens=40, stream=True
    )
    chunks = list(stream)
    assert engine.requests[-1]["max_tokens"] == CAP
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    [call] = calls_of(gateway, store, "ro-capped")
    assert len(call.response_ids) == CAP


def test_text_completions_are_capped(capped_client, engine):
    resp = capped_client.completions.create(model="m", prompt=LONG, max_tokens=100)
    assert engine.requests[-1]["max_tokens"] == CAP and resp.choices[0].finish_reason == "length"


def test_a_rollout_without_a_cap_keeps_the_clients_request(client, engine):
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": LONG}])
    assert "max_tokens" not in engine.requests[-1]


@pytest.mark.parametrize("stream", [False, True])
def test_responses_name_the_limit_that_ended_the_answer(capped_client, stream):
    def create(**kw):
        if not stream:
            return capped_client.responses.create(model="m", input=LONG, **kw)
        events = list(capped_client.responses.create(model="m", input=LONG, stream=True, **kw))
        assert events[-1].type == "response.incomplete"
        return events[-1].response

    capped_answer = create()
    assert capped_answer.status == "incomplete"
    assert capped_answer.incomplete_details.reason == "rollout_max_response_tokens"  # not the client's parameter
    assert capped_answer.usage.output_tokens == CAP
    own = create(max_output_tokens=3)
    assert own.status == "incomplete" and own.incomplete_details.reason == "max_output_tokens"


def test_a_full_context_is_not_blamed_on_the_client(store):
    with FakeEngine(max_model_len=40) as engine:
        gw = Gateway(store, [engine.url], token=TOKEN).start()
        try:
            store.enqueue([Rollout(rollout_id="ro-ctx", task_id="task-1")])
            store.claim("runner", limit=1)
            key = key_of(gw, store, "ro-ctx")
            with openai.OpenAI(base_url=gw.rollout_base_url("ro-ctx"), api_key=key, max_retries=0) as c:
                resp = c.responses.create(model="m", input="a question")
        finally:
            gw.stop()
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "context_length"


def test_the_agents_sdk_under_a_cap_fails_its_rollout_and_the_call_still_trains(gateway, store, capped):
    """Agents SDK 0.24 raises ModelBehaviorError on an incomplete response. Under the runner that
    ends the rollout ``failed`` with the reason in its error, and the capped call becomes a
    transition with ``failed_reward`` (0 by default), as verl scores an over-long response."""
    store.enqueue([Rollout(rollout_id="ro-capped-2", task_id="task-1", max_response_tokens=CAP)])
    seen: list[BaseException] = []

    async def agent(task_input, ctx):
        client = openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0)
        sdk_agent = Agent(name="talker", instructions="Talk.", model=OpenAIResponsesModel("m", client))
        try:
            return (await Runner.run(sdk_agent, LONG, run_config=RunConfig(tracing_disabled=True))).final_output
        except ModelBehaviorError as exc:
            seen.append(exc)
            raise
        finally:
            await client.close()

    runner = RolloutRunner(agent, store, gateway_url=gateway.url, rollout_keys=gateway.keys, concurrency=2)
    try:
        assert runner.run_sync(until_idle=True) == {"failed": 2}
    finally:
        runner.close()
    assert len(seen) == 2 and all("rollout_max_response_tokens" in str(e) for e in seen)
    ended = [store.get_rollout(r) for r in (capped, "ro-capped-2")]
    assert all(r.status == RolloutStatus.FAILED and "rollout_max_response_tokens" in r.error for r in ended)
    gateway.flush()
    transitions, report = build_transitions(store, ended, TransitionConfig())
    assert len(transitions) == 2 and report.transitions == 2
    assert all(len(t.response_ids) == CAP and t.reward == 0.0 for t in transitions)
