"""Anthropic's Messages API through the gateway, with the real ``anthropic`` SDK.

The engine is the fake (tests/fake_engine.py): its prompt ids are the bytes of
``render_chat`` of the chat messages it got, so every recorded call can be checked
against the chat template's ids exactly.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from agl.schema import Rollout
from agl_trainer.gateway import check_continuity
from agl_trainer.transitions import TransitionConfig, build_transitions
from tests.fake_engine import END, render_chat
from tests.gateway.conftest import calls_of, key_of, new_rollout

TOOLS = [
    {
        "name": "get_weather",
        "description": "weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": TOOLS[0]["input_schema"], "description": "weather in a city"},
    }
]


@pytest.fixture
def claude(gateway, rollout, key) -> anthropic.Anthropic:
    """The real anthropic client, pointed at the gateway for one rollout with that rollout's key (x-api-key)."""
    with anthropic.Anthropic(base_url=gateway.rollout_anthropic_url(rollout), api_key=key, max_retries=0) as c:
        yield c


def assert_template_ids(call, sent: dict) -> None:
    """The recorded prompt ids are the chat template's ids of what the engine got; logprobs match the ids."""
    assert list(call.prompt_ids) == list(render_chat(sent["messages"], sent.get("tools")).encode())
    assert len(call.response_logprobs) == len(call.response_ids) > 0


def test_text_with_system_is_recorded_with_template_ids(claude, gateway, store, rollout, engine):
    msg = claude.messages.create(
        model="claude-sonnet-4-5",
        max_tokens=100,
        system="be brief",
        messages=[{"role": "user", "content": "hello"}],
        metadata={"user_id": "u-1"},
        extra_body={"temperature": 0.5},  # the API takes it; this SDK version no longer names it
    )
    assert msg.id.startswith("msg_") and msg.model == "claude-sonnet-4-5" and msg.role == "assistant"
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "echo: hello"
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    sent = engine.requests[-1]
    assert sent["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    assert sent["temperature"] == 0.5 and sent["max_tokens"] == 100 and sent["user"] == "u-1"
    assert msg.usage.input_tokens == len(render_chat(sent["messages"]).encode())
    [call] = calls_of(gateway, store, rollout)
    assert call.endpoint == "messages" and call.call_id == msg.id and call.requested_model == "claude-sonnet-4-5"
    assert_template_ids(call, sent)
    assert bytes(call.response_ids.tolist()).decode() == "echo: hello" + END
    assert msg.usage.output_tokens == len(call.response_ids)
    assert call.response["content"] == [{"type": "text", "text": "echo: hello"}]
    assert call.request["system"] == "be brief"  # the client's own request is what is kept


async def test_async_client(gateway, rollout, key, store, engine):
    async with anthropic.AsyncAnthropic(
        base_url=gateway.rollout_anthropic_url(rollout), api_key=key, max_retries=0
    ) as claude:
        msg = await claude.messages.create(
            model="m", max_tokens=50, messages=[{"role": "user", "content": [{"type": "text", "text": "hi async"}]}]
        )
        count = await claude.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi async"}])
    assert msg.content[0].text == "echo: hi async"
    [call] = calls_of(gateway, store, rollout)  # count_tokens is not a call of the policy
    assert call.call_id == msg.id and count.input_tokens == len(call.prompt_ids) == msg.usage.input_tokens
    assert_template_ids(call, engine.requests[-2])


def test_tool_use_and_tool_result_round_trip(claude, gateway, store, rollout, engine):
    first = claude.messages.create(
        model="m", max_tokens=200, tools=TOOLS, messages=[{"role": "user", "content": "call get_weather please"}]
    )
    [use] = first.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "call get_weather please"}
    assert first.stop_reason == "tool_use"
    assert engine.requests[-1]["tools"] == CHAT_TOOLS and "tool_choice" not in engine.requests[-1]
    history = [
        {"role": "user", "content": "call get_weather please"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]},
    ]
    second = claude.messages.create(model="m", max_tokens=200, tools=TOOLS, messages=history)
    assert second.content[0].text == "result: sunny" and second.stop_reason == "end_turn"
    sent = engine.requests[-1]
    assert sent["messages"][1]["tool_calls"] == [
        {"id": use.id, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(use.input)}}
    ]
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": use.id, "content": "sunny"}
    calls = calls_of(gateway, store, rollout)
    assert [c.call_id for c in calls] == [first.id, second.id]
    assert_template_ids(calls[1], sent)
    # the second prompt extends the first prompt and its answer: one growing conversation
    assert [c.status for c in check_continuity(calls)] == ["new", "extends"]


@pytest.mark.parametrize(
    "choice, sent",
    [
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}),
        ({"type": "none"}, "none"),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto"),
    ],
)
def test_tool_choice(claude, engine, choice, sent):
    msg = claude.messages.create(
        model="m", max_tokens=200, tools=TOOLS, tool_choice=choice, messages=[{"role": "user", "content": "hi"}]
    )
    assert engine.requests[-1]["tool_choice"] == sent
    assert engine.requests[-1].get("parallel_tool_calls") is (
        False if choice.get("disable_parallel_tool_use") else None
    )
    assert [b.type for b in msg.content] == (["text"] if choice["type"] in ("none", "auto") else ["tool_use"])


def test_streamed_text_and_tool_use(claude, gateway, store, rollout):
    with claude.messages.stream(model="m", max_tokens=100, messages=[{"role": "user", "content": "hello there"}]) as s:
        events = [e.type for e in s]
        text_final = s.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop" and "text" in events
    assert text_final.content[0].text == "echo: hello there" and text_final.stop_reason == "end_turn"
    raw = []
    with claude.messages.stream(
        model="m", max_tokens=300, tools=TOOLS, messages=[{"role": "user", "content": "call get_weather"}]
    ) as s:
        raw = [e for e in s if e.type in ("content_block_start", "input_json", "content_block_stop")]
        tool_final = s.get_final_message()
    [use] = tool_final.content
    assert use.type == "tool_use" and use.input == {"city": "call get_weather"} and tool_final.stop_reason == "tool_use"
    assert raw[0].type == "content_block_start" and raw[0].content_block.name == "get_weather"
    assert json.loads("".join(e.partial_json for e in raw if e.type == "input_json")) == use.input
    text_call, tool_call = calls_of(gateway, store, rollout)
    assert (text_call.call_id, tool_call.call_id) == (text_final.id, tool_final.id)
    assert tool_call.response["content"] == [use.model_dump(exclude_none=True)]
    assert bytes(tool_call.response_ids.tolist()).decode().startswith("<tool_call>")
    assert text_final.usage.input_tokens == len(text_call.prompt_ids)
    assert text_final.usage.output_tokens == len(text_call.response_ids)


def test_raw_event_sequence(gateway, rollout, key):
    """The event names and order on the wire, as Anthropic's streaming reference gives them."""
    body = {"model": "m", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hey"}]}
    with httpx.stream(
        "POST", f"{gateway.rollout_base_url(rollout)}/messages", json=body, headers={"x-api-key": key}
    ) as r:
        lines = [line for line in r.iter_lines() if line.startswith("event: ")]
    names = [line.removeprefix("event: ") for line in lines]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}


def test_streamed_ids_equal_plain_ids(claude, gateway, store, rollout):
    claude.messages.create(model="m", max_tokens=50, messages=[{"role": "user", "content": "same"}])
    with claude.messages.stream(model="m", max_tokens=50, messages=[{"role": "user", "content": "same"}]) as s:
        s.get_final_message()
    plain, streamed = calls_of(gateway, store, rollout)
    assert list(plain.prompt_ids) == list(streamed.prompt_ids)
    assert list(plain.response_ids) == list(streamed.response_ids)
    assert list(plain.response_logprobs) == list(streamed.response_logprobs)
    assert plain.response["content"] == streamed.response["content"]


def test_stop_sequences_and_max_tokens(claude, engine):
    msg = claude.messages.create(
        model="m", max_tokens=50, stop_sequences=["l"], messages=[{"role": "user", "content": "hello"}]
    )
    assert engine.requests[-1]["stop"] == ["l"]
    assert (msg.stop_reason, msg.stop_sequence, msg.content[0].text) == ("stop_sequence", "l", "echo: he")
    short = claude.messages.create(model="m", max_tokens=3, messages=[{"role": "user", "content": "hello"}])
    assert short.stop_reason == "max_tokens" and short.content[0].text == "ech"


def test_the_rollouts_cap_ends_with_max_tokens(gateway, store, engine):
    store.enqueue([Rollout(rollout_id="ro-capped", task_id="task-1", max_response_tokens=4)])
    store.claim("runner", limit=1)
    key = key_of(gateway, store, "ro-capped")
    with anthropic.Anthropic(base_url=gateway.rollout_anthropic_url("ro-capped"), api_key=key, max_retries=0) as c:
        msg = c.messages.create(model="m", max_tokens=500, messages=[{"role": "user", "content": "a long one"}])
        with c.messages.stream(model="m", max_tokens=500, messages=[{"role": "user", "content": "again"}]) as s:
            streamed = s.get_final_message()
    assert engine.requests[-1]["max_tokens"] == 4
    assert msg.stop_reason == streamed.stop_reason == "max_tokens" and msg.content[0].text == "echo"
    calls = calls_of(gateway, store, "ro-capped")
    assert [len(c.response_ids) for c in calls] == [4, 4] and {c.max_response_tokens for c in calls} == {4}


def test_calls_become_transitions(claude, gateway, store, rollout):
    msg = claude.messages.create(
        model="m", max_tokens=50, system="sys", messages=[{"role": "user", "content": "train me"}]
    )
    gateway.flush()
    rollout_row = store.finish(rollout, "succeeded", output="done")
    [t], report = build_transitions(store, [rollout_row], TransitionConfig(missing_reward=0.0, with_text=True))
    assert report.gateway_only == 1 and t.call_id == msg.id and t.token_source == "engine"
    [call] = calls_of(gateway, store, rollout)
    assert list(t.prompt_ids) == list(call.prompt_ids) and list(t.response_ids) == list(call.response_ids)
    assert list(t.response_logprobs) == list(call.response_logprobs)
    assert t.prompt_messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": "train me"}]
    assert t.response_text == "echo: train me"


def test_a_rollout_key_in_x_api_key_opens_only_its_rollout(gateway, store, rollout, key):
    other = new_rollout(store, "ro-other")
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    ok = httpx.post(f"{gateway.url}/v1/messages", json=body, headers={"x-api-key": key})
    assert ok.status_code == 200 and ok.json()["type"] == "message"
    wrong = httpx.post(f"{gateway.rollout_base_url(other)}/messages", json=body, headers={"x-api-key": key})
    assert wrong.status_code == 403 and wrong.json()["error"]["type"] == "permission_error"
    other_key = key_of(gateway, store, other)
    assert httpx.post(f"{gateway.rollout_base_url(other)}/messages", json=body, headers={"x-api-key": other_key})
    none = httpx.post(f"{gateway.url}/v1/messages", json=body)
    assert none.status_code == 401 and none.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": none.json()["error"]["message"]},
    }
    assert "x-api-key" in none.json()["error"]["message"]
    [call] = calls_of(gateway, store, rollout)  # /v1/messages with no header is the key's rollout
    assert call.call_id == ok.json()["id"]


@pytest.mark.parametrize(
    "change, field",
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": "10"}, "max_tokens"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0].type",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]}]},
            "messages[0].content[0].tool_use_id",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": {}}]}]},
            "messages[0].content[0].type",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": TOOLS}, "tool_choice.name"),
        ({"temperature": 1.5}, "temperature"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_bad_requests_are_400_in_anthropics_shape_naming_the_field(claude, change, field):
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    body = {k: v for k, v in (body | change).items() if v is not None}
    with pytest.raises(anthropic.BadRequestError) as caught:  # the SDK's own POST, as its create() sends it
        claude.post("/v1/messages", body=body, cast_to=object)
    err = caught.value.body
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert err["error"]["message"].startswith(f"{field}: "), err


def test_count_tokens_is_the_rendered_prompts_length(claude, engine, gateway, store, rollout):
    count = claude.messages.count_tokens(
        model="m", system="sys", tools=TOOLS, messages=[{"role": "user", "content": "how long am I?"}]
    )
    sent = engine.requests[-1]
    assert count.input_tokens == len(render_chat(sent["messages"], sent["tools"]).encode())
    assert sent["max_tokens"] == 1 and not calls_of(gateway, store, rollout)
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.count_tokens(model="m", messages=[])
    assert caught.value.body["error"]["message"].startswith("messages: ")


def test_a_tool_call_whose_arguments_are_no_object_is_answered_as_text():
    """tool_use.input must be an object: a call the engine parsed with other arguments stays the model's text."""
    from agl_trainer.gateway.messages_api import from_chat_response

    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}
    chat = {
        "choices": [{"message": {"content": None, "tool_calls": [call]}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    msg = from_chat_response(chat, {"model": "m"}, "msg_x", None)
    assert msg["content"] == [{"type": "text", "text": json.dumps({"name": "f", "arguments": "[1, 2]"})}]
    assert msg["stop_reason"] == "end_turn" and msg["usage"] == {"input_tokens": 3, "output_tokens": 2}
