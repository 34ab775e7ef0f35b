"""What programs written for the ``anthropic`` SDK depend on, through the gateway.

The SDK's own beta tool runner (``client.beta.messages.tool_runner``) and its thread
fallback, prefill continuation, ``toolu_`` ids, ``request-id`` headers, refusals in the
Messages API's vocabulary. The engine is the scripted fake (tests/fake_engine.py): a tool
runner needs a model that calls the tool and then answers its result, which only a
scripted engine does reliably, and its prompt ids are the bytes of ``render_chat``, so a
recorded prompt can be checked against the template exactly. The same behaviours
against the real transformers engine are in tests/verl/test_messages_engine.py.
"""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from anthropic import beta_tool

from agl_trainer.gateway import Gateway
from agl_trainer.policy_config import PolicyConfig
from agl_trainer.policy_routes import Routes
from tests.fake_engine import render_chat
from tests.gateway.conftest import TOKEN, calls_of
from tests.gateway.test_messages import TOOLS

CITY_WEATHER = {"Paris": "sunny, 21 C"}


@beta_tool
def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
        city: The city's name.
    """
    return CITY_WEATHER.get(city, f"no report for {city}")


@pytest.fixture
def claude(gateway, rollout, key) -> anthropic.Anthropic:
    with anthropic.Anthropic(base_url=gateway.rollout_anthropic_url(rollout), api_key=key, max_retries=0) as c:
        yield c


def _runner_messages(claude: anthropic.Anthropic, stream: bool) -> list:
    """The SDK's tool runner as its docs show it: iterate the runner, one message per turn (threads on, by default)."""
    runner = claude.beta.messages.tool_runner(
        model="claude-sonnet-4-5",
        max_tokens=200,
        tools=[get_weather],
        messages=[{"role": "user", "content": "call get_weather for Paris"}],
        stream=stream,
    )
    if not stream:
        return list(runner)
    messages = []
    for turn in runner:  # each turn is a stream of events
        for _ in turn:
            pass
        messages.append(turn.get_final_message())
    return messages


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_the_sdks_tool_runner_completes_a_tool_round_trip(claude, gateway, store, rollout, engine, stream):
    first, second = _runner_messages(claude, stream)
    [use] = first.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    assert first.stop_reason == "tool_use"
    # the fake engine's arguments are the user's text; the runner ran the tool and sent back its answer
    assert second.content[0].text == "result: no report for call get_weather for Paris"
    assert second.stop_reason == "end_turn"
    calls = calls_of(gateway, store, rollout)
    assert [c.call_id for c in calls] == [first.id, second.id]  # the refused threaded request is no call
    assert len(engine.requests) == 2  # the threaded first request was refused before any engine saw it
    history = engine.requests[-1]["messages"]
    assert [m["role"] for m in history] == ["user", "assistant", "tool"]
    assert history[1]["tool_calls"][0]["id"] == use.id and history[2]["tool_call_id"] == use.id
    assert list(calls[1].prompt_ids) == list(render_chat(history, engine.requests[-1]["tools"]).encode())
    assert "thread" not in calls[0].request and "thread" not in calls[1].request


def test_a_thread_is_refused_in_the_shape_the_sdk_falls_back_on(claude):
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.post(
            "/v1/messages",
            body={
                "model": "m",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": "hi"}],
                "thread": {"type": "create"},
            },
            cast_to=object,
        )
    error = caught.value.body["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith("thread: ")
    assert error["details"] == {"error_code": "thread_unsupported_request", "unsupported": ["thread"]}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_prefill_is_continued_and_recorded_as_continued(claude, gateway, store, rollout, engine, stream):
    messages = [
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": [{"type": "text", "text": "Hi! The answer is"}]},
    ]
    if stream:
        with claude.messages.stream(model="m", max_tokens=100, messages=messages) as s:
            msg = s.get_final_message()
    else:
        msg = claude.messages.create(model="m", max_tokens=100, messages=messages)
    sent = engine.requests[-1]
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    [call] = calls_of(gateway, store, rollout)
    prompt = bytes(call.prompt_ids.tolist()).decode()
    assert prompt == render_chat(sent["messages"], continue_final=True)
    assert prompt.endswith("<assistant>Hi! The answer is")  # open: no end of turn, no new assistant turn
    assert msg.content[0].text == "echo: Hi! The answer is"  # only the continuation, as Claude answers
    assert msg.usage.input_tokens == len(call.prompt_ids)


def test_an_empty_prefill_starts_the_answer_afresh(claude, engine):
    claude.messages.create(
        model="m",
        max_tokens=20,
        messages=[{"role": "user", "content": "hello"}, {"role": "assistant", "content": []}],
    )
    sent = engine.requests[-1]
    assert sent["messages"] == [{"role": "user", "content": "hello"}] and "continue_final_message" not in sent


def test_a_prefill_holding_a_tool_use_is_refused_naming_it(claude):
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model="m",
            max_tokens=20,
            tools=TOOLS,
            messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": [use]}],
        )
    assert caught.value.body["error"]["message"].startswith("messages[1].content: a last assistant message")


def test_count_tokens_counts_the_continued_prompt(claude, engine):
    messages = [{"role": "user", "content": "hey"}, {"role": "assistant", "content": "Well,"}]
    count = claude.messages.count_tokens(model="m", messages=messages)
    assert count.input_tokens == len(render_chat(engine.requests[-1]["messages"], continue_final=True).encode())


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_tool_use_ids_are_toolu_ids(claude, engine, stream):
    body = {
        "model": "m",
        "max_tokens": 200,
        "tools": TOOLS,
        "messages": [{"role": "user", "content": "call get_weather"}],
    }
    if stream:
        with claude.messages.stream(**body) as s:
            msg = s.get_final_message()
    else:
        msg = claude.messages.create(**body)
    [use] = msg.content
    assert use.id.startswith("toolu_") and not use.id.startswith("toolu_call_")
    assert use.id.removeprefix("toolu_") in {f"{i}_{n}" for i in range(2) for n in range(1, 3)}  # the engine's call_0_1


def test_every_answer_has_a_request_id(claude, client, gateway, rollout, key):
    msg = claude.messages.with_raw_response.create(
        model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    )
    assert msg.headers["request-id"].startswith("req_") and msg.parse()._request_id == msg.headers["request-id"]
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model="m", max_tokens=10, messages=[])
    assert caught.value.request_id is not None and caught.value.request_id.startswith("req_")
    with claude.messages.with_streaming_response.create(
        model="m", max_tokens=10, stream=True, messages=[{"role": "user", "content": "hi"}]
    ) as streamed:
        assert streamed.headers["request-id"].startswith("req_")
    chat = client.chat.completions.with_raw_response.create(
        model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    )
    assert chat.headers["x-request-id"].startswith("req_")
    with pytest.raises(openai.AuthenticationError) as refused:
        openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="wrong", max_retries=0).models.list()
    assert refused.value.request_id is not None
    ids = {msg.headers["request-id"], caught.value.request_id, chat.headers["x-request-id"]}
    assert len(ids) == 3  # one per answer


def test_a_wrong_credential_is_named_by_the_header_that_carried_it(gateway):
    """A client that sends ``x-api-key`` (as Anthropic's API documents it) is told about its x-api-key;
    the SDK (2.14) sends its key as a bearer token, and is told about that."""
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    raw = httpx.post(f"{gateway.url}/v1/messages", json=body, headers={"x-api-key": "not-a-key"})
    assert raw.status_code == 401 and raw.json()["error"] == {
        "type": "authentication_error",
        "message": "invalid x-api-key",
    }
    with (
        anthropic.Anthropic(base_url=gateway.url, api_key="not-a-key", max_retries=0) as c,
        pytest.raises(anthropic.AuthenticationError) as caught,
    ):
        c.messages.create(**body)
    assert caught.value.body["error"]["message"] == "invalid bearer token"


@pytest.mark.parametrize("thinking", [{"type": "enabled", "budget_tokens": 1024}, {"type": "adaptive"}])
def test_extended_thinking_is_refused_not_dropped(claude, engine, thinking):
    sent_before = len(engine.requests)
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model="m", max_tokens=2048, thinking=thinking, messages=[{"role": "user", "content": "think"}]
        )
    assert caught.value.body["error"]["message"].startswith("thinking: extended thinking")
    assert len(engine.requests) == sent_before
    ok = claude.messages.create(
        model="m", max_tokens=20, thinking={"type": "disabled"}, messages=[{"role": "user", "content": "plain"}]
    )
    assert ok.content[0].text == "echo: plain"


def test_count_tokens_is_routed_like_the_other_routes(store, engine):
    routes = Routes([PolicyConfig(name="writer", models=["claude-writer"])], {"writer": None})
    hi = [{"role": "user", "content": "hi"}]
    with (
        Gateway(store, [engine.url], token=TOKEN, routes=routes) as gw,
        anthropic.Anthropic(base_url=gw.url, api_key=TOKEN, max_retries=0) as c,
    ):
        known = c.messages.count_tokens(model="claude-writer", messages=hi)
        assert known.input_tokens == len(render_chat(hi).encode())
        for call in (
            lambda: c.messages.count_tokens(model="claude-nobody", messages=hi),
            lambda: c.messages.create(model="claude-nobody", max_tokens=5, messages=hi),
        ):
            with pytest.raises(anthropic.NotFoundError) as caught:
                call()
            assert caught.value.body["error"]["type"] == "not_found_error"
            assert "claude-nobody" in caught.value.body["error"]["message"]


def test_request_id_header_is_on_a_raw_401(gateway):
    r = httpx.post(f"{gateway.url}/v1/messages", json={})
    assert r.status_code == 401 and r.headers["request-id"] == r.headers["x-request-id"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_tool_call_cut_by_max_tokens_stops_with_max_tokens_and_no_markup(claude, gateway, store, rollout, stream):
    """The fake engine writes its call as ``<tool_call>{...}</tool_call>`` and streams it as text when cut."""
    body = {
        "model": "m",
        "max_tokens": 24,
        "tools": TOOLS,
        "messages": [{"role": "user", "content": "call get_weather"}],
    }
    if stream:
        with claude.messages.stream(**body) as s:
            texts = [e.text for e in s if e.type == "text"]
            msg = s.get_final_message()
        assert texts == []
    else:
        msg = claude.messages.create(**body)
    assert msg.stop_reason == "max_tokens" and msg.content == []
    [call] = calls_of(gateway, store, rollout)
    assert bytes(call.response_ids.tolist()).decode() == '<tool_call>{"name": "get'  # all recorded
    assert len(call.response_ids) == 24


def test_text_streams_beside_tools_while_it_cannot_be_a_call(claude):
    """A guard on the gateway's hold-back of what may be tool-call markup (passes on main too: there the
    gateway held nothing back): text with a ``<`` that begins no call still streams in pieces, whole."""
    with claude.messages.stream(
        model="m", max_tokens=100, tools=TOOLS, messages=[{"role": "user", "content": "no tools <tool_ here"}]
    ) as s:
        texts = [e.text for e in s if e.type == "text"]
        msg = s.get_final_message()
    assert "".join(texts) == msg.content[0].text == "echo: no tools <tool_ here"
    assert len(texts) > 3 and msg.stop_reason == "end_turn"
