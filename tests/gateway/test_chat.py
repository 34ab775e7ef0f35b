"""Chat and text completions through the gateway, with the real openai client: what the
client gets back, what the engine was asked, and what was recorded."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.fake_engine import END, logprob, render_chat
from tests.gateway.conftest import TOKEN, calls_of

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]


def test_chat_records_exact_ids_and_returns_a_standard_answer(client, gateway, store, rollout, engine):
    resp = client.chat.completions.create(model="gpt-4o", messages=MESSAGES, temperature=0.7)
    assert resp.choices[0].message.content == "echo: hello"
    assert resp.id.startswith("chatcmpl-") and resp.model == "gpt-4o"  # the name the client asked for
    raw = resp.model_dump()
    assert "prompt_token_ids" not in (resp.model_extra or {}) and raw["choices"][0]["logprobs"] is None
    assert "token_ids" not in raw["choices"][0]

    sent = engine.requests[-1]
    assert sent["model"] == "fake-policy" and sent["return_token_ids"] is True and sent["logprobs"] is True

    [call] = calls_of(gateway, store, rollout)
    assert call.call_id == resp.id and call.rollout_id == rollout and call.seq == 0
    assert call.endpoint == "chat.completions" and call.requested_model == "gpt-4o"
    assert call.model_version == "v1" and call.latency_s > 0
    assert list(call.prompt_ids) == list(render_chat(MESSAGES).encode())
    assert bytes(call.response_ids.tolist()).decode() == "echo: hello" + END
    assert list(call.response_logprobs) == pytest.approx([logprob(t) for t in call.response_ids], abs=1e-6)
    assert call.request["messages"] == MESSAGES and call.response["id"] == resp.id
    assert call.response["choices"][0]["message"]["content"] == "echo: hello"


def test_client_that_asks_for_ids_and_logprobs_gets_them(client, gateway, store, rollout):
    resp = client.chat.completions.create(
        model="m", messages=MESSAGES, logprobs=True, extra_body={"return_token_ids": True}
    )
    extra = resp.model_extra
    assert extra["prompt_token_ids"] == list(render_chat(MESSAGES).encode())
    assert resp.choices[0].model_extra["token_ids"] == list(("echo: hello" + END).encode())
    assert [c.logprob for c in resp.choices[0].logprobs.content] == pytest.approx(
        [logprob(t) for t in resp.choices[0].model_extra["token_ids"]]
    )


def test_seq_orders_a_rollouts_calls_and_model_version_changes_apply(client, gateway, store, rollout):
    client.chat.completions.create(model="m", messages=MESSAGES)
    gateway.model_version = "v2"
    client.chat.completions.create(model="m", messages=MESSAGES)
    calls = calls_of(gateway, store, rollout)
    assert [c.seq for c in calls] == [0, 1]
    assert [c.model_version for c in calls] == ["v1", "v2"]


def test_streaming_records_the_same_ids_as_plain(client, gateway, store, rollout, engine):
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "echo: hello"
    assert all(c.usage is None for c in chunks) and all(c.choices for c in chunks)
    assert all("token_ids" not in (c.choices[0].model_extra or {}) for c in chunks)
    plain = client.chat.completions.create(model="m", messages=MESSAGES)
    assert engine.clients[-1] == engine.clients[-2]  # the stream's engine connection went back to the pool
    streamed_call, plain_call = calls_of(gateway, store, rollout)
    assert streamed_call.call_id == chunks[0].id
    assert list(streamed_call.prompt_ids) == list(plain_call.prompt_ids)
    assert list(streamed_call.response_ids) == list(plain_call.response_ids)
    assert list(streamed_call.response_logprobs) == list(plain_call.response_logprobs)
    assert streamed_call.response["choices"][0]["message"]["content"] == plain.choices[0].message.content


def test_stream_usage_only_when_asked(client):
    chunks = list(
        client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(render_chat(MESSAGES).encode())


def test_n_gives_one_record_per_choice(client, gateway, store, rollout):
    resp = client.chat.completions.create(model="m", messages=MESSAGES, n=2)
    assert [c.message.content for c in resp.choices] == ["echo: hello [0]", "echo: hello [1]"]
    calls = calls_of(gateway, store, rollout)
    assert [c.call_id for c in calls] == [f"{resp.id}-0", f"{resp.id}-1"]
    assert [c.seq for c in calls] == [0, 1]
    assert bytes(calls[1].response_ids.tolist()).decode() == "echo: hello [1]" + END
    assert calls[1].response["choices"][0]["index"] == 1 and len(calls[1].response["choices"]) == 1


def test_max_completion_tokens_and_stop(client, gateway, store, rollout, engine):
    resp = client.chat.completions.create(model="m", messages=MESSAGES, max_completion_tokens=4)
    assert resp.choices[0].finish_reason == "length" and resp.choices[0].message.content == "echo"
    assert engine.requests[-1]["max_tokens"] == 4 and "max_completion_tokens" not in engine.requests[-1]
    resp = client.chat.completions.create(model="m", messages=MESSAGES, stop=["l"])
    assert resp.choices[0].message.content == "echo: he"
    calls = calls_of(gateway, store, rollout)
    assert len(calls[0].response_ids) == 4 and bytes(calls[1].response_ids.tolist()) == b"echo: he"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "look a word up",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
        },
    }
]


def test_tool_calls_plain_and_streamed_and_multi_turn(client, gateway, store, rollout, engine):
    messages = [{"role": "user", "content": "call lookup for me"}]
    resp = client.chat.completions.create(
        model="m", messages=messages, tools=TOOLS, tool_choice="auto", parallel_tool_calls=False
    )
    [tc] = resp.choices[0].message.tool_calls
    assert resp.choices[0].finish_reason == "tool_calls" and tc.function.name == "lookup"
    assert engine.requests[-1]["parallel_tool_calls"] is False and engine.requests[-1]["tool_choice"] == "auto"
    streamed = list(client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True))
    args = "".join(
        c.choices[0].delta.tool_calls[0].function.arguments or ""
        for c in streamed
        if c.choices and c.choices[0].delta.tool_calls
    )
    assert args == tc.function.arguments
    messages += [
        resp.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tc.id, "content": "a greeting"},
    ]
    final = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert final.choices[0].message.content == "result: a greeting"

    first, second, third = calls_of(gateway, store, rollout)
    assert list(second.response_ids) == list(first.response_ids)
    assert second.response["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == tc.function.arguments
    assert list(third.prompt_ids[: len(first.prompt_ids) + len(first.response_ids)]) == list(first.prompt_ids) + list(
        first.response_ids
    )


def test_named_tool_choice_reaches_the_engine(client, engine):
    choice = {"type": "function", "function": {"name": "lookup"}}
    resp = client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, tool_choice=choice)
    assert resp.choices[0].message.tool_calls[0].function.name == "lookup"
    assert engine.requests[-1]["tool_choice"] == choice


def test_text_completions_with_text_and_token_prompts(gateway, store, rollout, key):
    with openai.OpenAI(base_url=gateway.rollout_base_url(rollout), api_key=key) as c:
        r1 = c.completions.create(model="m", prompt="abc", max_tokens=16)
        r2 = c.completions.create(model="m", prompt=[5, 6, 7, 8], max_tokens=16, logprobs=0)
        chunks = list(c.completions.create(model="m", prompt=[1, 2], max_tokens=16, stream=True))
    assert r1.id.startswith("cmpl-") and r1.choices[0].text == "echo 3" and r1.choices[0].logprobs is None
    assert r2.choices[0].logprobs.token_logprobs[0] == pytest.approx(logprob(ord("e")))
    assert "".join(c.choices[0].text for c in chunks) == "echo 2"
    calls = calls_of(gateway, store, rollout)
    assert [c.endpoint for c in calls] == ["completions"] * 3
    assert list(calls[0].prompt_ids) == list(b"abc") and list(calls[1].prompt_ids) == [5, 6, 7, 8]
    assert list(calls[2].prompt_ids) == [1, 2] and bytes(calls[2].response_ids.tolist()) == b"echo 2" + END.encode()
    assert calls[2].call_id == chunks[0].id and len(calls[2].response_logprobs) == len(calls[2].response_ids)


def test_production_traffic_and_rollout_header(gateway, store, rollout, key):
    with openai.OpenAI(base_url=gateway.base_url, api_key=TOKEN) as c:
        prod = c.chat.completions.create(model="m", messages=MESSAGES)
    with openai.OpenAI(base_url=gateway.base_url, api_key=key) as c:  # the rollout comes from the key
        tagged = c.chat.completions.create(model="m", messages=MESSAGES, extra_headers={"X-Agl-Rollout-Id": rollout})
    gateway.flush()
    [p] = store.query_llm_calls(production=True)
    assert p.call_id == prod.id and p.rollout_id is None
    assert [c.call_id for c in store.query_llm_calls(rollout_id=rollout)] == [tagged.id]


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list()] == ["fake-policy"]


def test_health_needs_no_token(gateway):
    assert httpx.get(f"{gateway.url}/health").json() == {"ok": True}


def test_engine_dropping_a_stream_gives_the_client_an_error_and_records_nothing(
    client, gateway, store, rollout, engine
):
    engine.break_stream_after = 2
    with pytest.raises(openai.APIError, match="dropped the stream"):
        list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    engine.break_stream_after = 2
    with client.responses.stream(model="m", input="hello") as stream:
        events = list(stream)
    message = events[-1].response.error.message
    assert events[-1].type == "response.failed" and "dropped the stream (request id " in message
    assert "127.0.0.1" not in message  # the engine's URL stays in the gateway's log
    assert calls_of(gateway, store, rollout) == []
    assert client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content == "echo: hello"
