"""The gateway and the transformers engine accept and refuse the same OpenAI requests.

Both check bodies with :mod:`agl_trainer.openai_requests`; where their hand-written
validators used to disagree (``n`` up to 128 or 64, ``top_p=0`` allowed or not, a tool
message answering no call, token ids past int32, ...), each request here goes to the real
engine directly and to a real gateway in front of it (with a SQLite store), and both must
answer alike: 200, or a 400 naming the same field.
"""

from __future__ import annotations

import httpx
import pytest

from agl_trainer.openai_requests import MAX_N
from tests.verl.conftest import GATEWAY_TOKEN as TOKEN

ENGINE_KEY = "engine-secret"  # tests/verl/conftest.py's tiny_engine
USER = [{"role": "user", "content": "what is 12 + 34 ?"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}


@pytest.fixture(scope="module")
def gateway(tiny_gateway):
    return tiny_gateway


def both(tiny_engine, gateway, path: str, body: dict) -> list[httpx.Response]:
    """The engine's answer to ``body``, then the gateway's."""
    targets = [(tiny_engine.urls[0], ENGINE_KEY), (gateway.base_url, TOKEN)]
    return [
        httpx.post(f"{base}{path}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        for base, key in targets
    ]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": MAX_N + 1}, "n"),  # both: OpenAI's 128 (the engine said 64)
        ({"n": 0}, "n"),
        ({"top_p": -0.1}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"seed": 2**63}, "seed"),  # the engine took any integer
        ({"seed": 1.5}, "seed"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"stop_token_ids": ["x"]}, "stop_token_ids[0]"),  # the gateway did not check it
        ({"messages": [*USER, {"role": "tool", "tool_call_id": "call_9", "content": "3"}]}, "messages[1].tool_call_id"),
        (
            {"messages": [*USER, {"role": "assistant", "tool_calls": [dict(CALL, id="")]}]},
            "messages[1].tool_calls[0].id",
        ),
        ({"messages": None}, "messages"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),  # the gateway passed it on
        ({"messages": [{"role": "user", "content": ["hi"]}]}, "messages[0].content[0]"),  # the engine took strings
    ],
)
def test_a_chat_request_both_refuse_names_the_same_field(tiny_engine, gateway, fields, param):
    for answer in both(tiny_engine, gateway, "/chat/completions", {"messages": USER, "max_tokens": 2, **fields}):
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", error
        assert error["message"].startswith(f"{param}: ")


@pytest.mark.parametrize(
    "fields",
    [
        {"n": MAX_N},  # the engine refused more than 64
        {"top_p": 0},  # the engine refused 0: its nucleus keeps the most likely token
        {"seed": 2**63 - 1},
        {"agent_sdk_extra": {"anything": [1, 2]}, "user": "u-1", "metadata": {"k": "v"}},  # unknown fields pass
    ],
)
def test_a_chat_request_both_accept(tiny_engine, gateway, fields):
    for answer in both(tiny_engine, gateway, "/chat/completions", {"messages": USER, "max_tokens": 1, **fields}):
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["choices"]) == fields.get("n", 1)


def test_top_p_zero_samples_the_most_likely_token(tiny_engine, gateway):
    greedy, nucleus = (
        both(tiny_engine, gateway, "/chat/completions", {"messages": USER, "max_tokens": 6, "seed": 1, **fields})
        for fields in ({"temperature": 0}, {"temperature": 1.5, "top_p": 0})
    )
    texts = {a.json()["choices"][0]["message"]["content"] for a in [*greedy, *nucleus]}
    assert len(texts) == 1, texts


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ""}, "prompt"),  # the engine took an empty prompt
        ({"prompt": [1, 2**31]}, "prompt"),
        ({"prompt": [1, -1]}, "prompt"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),  # the gateway passed it on
    ],
)
def test_a_completion_both_refuse_names_the_same_field(tiny_engine, gateway, fields, param):
    for answer in both(tiny_engine, gateway, "/completions", {"max_tokens": 2, **fields}):
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == param, answer.text
