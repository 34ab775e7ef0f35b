"""The Responses API through the gateway with the real openai client (as the OpenAI Agents SDK uses it)."""

from __future__ import annotations

import json

import httpx
import pytest

from agl_trainer.gateway import Gateway, check_continuity
from tests.fake_engine import END, FakeEngine, render_chat
from tests.gateway.conftest import TOKEN, calls_of

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "weather in a city",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    }
]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]


def test_plain_text_with_instructions(client, gateway, store, rollout, engine):
    resp = client.responses.create(model="gpt-5", instructions="be brief", input="hello", temperature=0.5)
    assert resp.output_text == "echo: hello" and resp.status == "completed" and resp.id.startswith("resp_")
    assert resp.usage.input_tokens == len(
        render_chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]).encode()
    )
    sent = engine.requests[-1]
    assert sent["messages"][0] == {"role": "system", "content": "be brief"} and sent["temperature"] == 0.5
    [call] = calls_of(gateway, store, rollout)
    assert call.endpoint == "responses" and call.call_id == resp.id and call.requested_model == "gpt-5"
    assert list(call.prompt_ids) == list(render_chat(sent["messages"]).encode())
    assert bytes(call.response_ids.tolist()).decode() == "echo: hello" + END
    assert call.response["output"][0]["content"][0]["text"] == "echo: hello"
    assert len(call.response_logprobs) == len(call.response_ids)


def test_function_tools_multi_turn(client, gateway, store, rollout, engine):
    first = client.responses.create(
        model="m", input="call get_weather please", tools=TOOLS, tool_choice="auto", parallel_tool_calls=False
    )
    [fc] = [o for o in first.output if o.type == "function_call"]
    assert fc.name == "get_weather" and json.loads(fc.arguments) == {"city": "call get_weather please"}
    assert engine.requests[-1]["tools"] == CHAT_TOOLS and engine.requests[-1]["parallel_tool_calls"] is False
    items = [
        {"role": "user", "content": "call get_weather please"},
        {"type": "function_call", "call_id": fc.call_id, "name": fc.name, "arguments": fc.arguments},
        {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"},
    ]
    second = client.responses.create(model="m", input=items, tools=TOOLS)
    assert second.output_text == "result: sunny"
    assert engine.requests[-1]["messages"][1]["tool_calls"][0]["id"] == fc.call_id
    assert engine.requests[-1]["messages"][2] == {"role": "tool", "tool_call_id": fc.call_id, "content": "sunny"}
    calls = calls_of(gateway, store, rollout)
    assert [c.status for c in check_continuity(calls)] == ["new", "extends"]


@pytest.mark.parametrize(
    "choice, sent",
    [
        ("required", "required"),
        ({"type": "function", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}),
    ],
)
def test_tool_choice_required_and_named(client, engine, choice, sent):
    resp = client.responses.create(model="m", input="hi", tools=TOOLS, tool_choice=choice)
    assert resp.output[0].type == "function_call" and engine.requests[-1]["tool_choice"] == sent


def test_streamed_text_and_tool_calls(client, gateway, store, rollout):
    with client.responses.stream(model="m", input="hello there") as stream:
        events = [e.type for e in stream]
        final = text_final = stream.get_final_response()
    assert events[:2] == ["response.created", "response.in_progress"] and events[-1] == "response.completed"
    assert "response.output_text.delta" in events and final.output_text == "echo: hello there"
    with client.responses.stream(model="m", input="x", tools=TOOLS, tool_choice="required") as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    [fc] = final.output
    assert fc.type == "function_call" and deltas == fc.arguments and json.loads(fc.arguments) == {"city": "x"}
    seqs = [e.sequence_number for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    text_call, tool_call = calls_of(gateway, store, rollout)
    assert text_call.call_id == text_final.id and tool_call.call_id == final.id
    assert tool_call.response["output"][0]["arguments"] == fc.arguments
    assert bytes(tool_call.response_ids.tolist()).decode().startswith("<tool_call>")


def test_streamed_matches_plain_ids(client, gateway, store, rollout):
    client.responses.create(model="m", input="same")
    with client.responses.stream(model="m", input="same") as stream:
        stream.get_final_response()
    plain, streamed = calls_of(gateway, store, rollout)
    assert list(plain.prompt_ids) == list(streamed.prompt_ids)
    assert list(plain.response_ids) == list(streamed.response_ids)
    assert list(plain.response_logprobs) == list(streamed.response_logprobs)


def test_max_output_tokens_gives_incomplete(client):
    resp = client.responses.create(model="m", input="hello", max_output_tokens=3)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"input": None}, "input"),
    ],
)
def test_unsupported_or_malformed_is_400_naming_the_field(gateway, rollout, key, extra, param):
    body = {"model": "m", "input": "hi", **extra}
    r = httpx.post(
        f"{gateway.rollout_base_url(rollout)}/responses", json=body, headers={"Authorization": f"Bearer {key}"}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_json_schema_output(store, rollout):
    fmt = {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": True}}
    with FakeEngine(structured_output=True) as eng, Gateway(store, [eng.url], token=TOKEN) as gw:
        r = httpx.post(
            f"{gw.base_url}/responses",
            json={"model": "m", "input": "hi", "text": fmt},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert json.loads(r.json()["output"][0]["content"][0]["text"]) == {"echo": "hi"}
        assert eng.requests[-1]["response_format"]["json_schema"]["name"] == "answer"
    with FakeEngine(structured_output=False) as eng, Gateway(store, [eng.url], token=TOKEN) as gw:
        r = httpx.post(
            f"{gw.base_url}/responses",
            json={"model": "m", "input": "hi", "text": fmt},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
