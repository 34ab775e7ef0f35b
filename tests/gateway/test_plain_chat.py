"""The plain-chat shortcut past the request model: it only ever passes what the model accepts.

:func:`agl_trainer.gateway.plain_chat.is_plain_chat` lets a chat request through without building
:class:`~agl_trainer.openai_requests.ChatCompletionRequest`. These tests hold it to the model:
over thousands of bodies mixed from valid and invalid values of every field it tells (and of
fields it leaves to the model), each body it calls plain is one the model accepts; the bodies
agents send most are plain (else the shortcut saves nothing); and a request the shortcut refuses
to tell is still refused by the gateway, naming the field.
"""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from agl_trainer.gateway import validate
from agl_trainer.gateway.errors import GatewayError
from agl_trainer.gateway.plain_chat import _MESSAGE_FIELDS, PLAIN_FIELDS, is_plain_chat
from agl_trainer.openai_requests import ChatCompletionRequest, Message

VALUES = [
    None, True, False, 0, 1, 2, 3, -1, 64, 128, 129, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1,
    0.0, 0.5, 1.0, 2.0, 2.5, -2.0, -2.5, 1e300, float("nan"), "", "x", "gpt-4o", [], ["a"], ["a", 1], [1, 2],
    {}, {"type": "text"}, {"include_usage": True},
]  # fmt: skip
CONTENTS = [None, "", "hi", 5, [], [{"type": "text", "text": "hi"}], [{"type": "text"}], {"text": "x"}]
ROLES = ["system", "developer", "user", "assistant", "tool", "function", "robot", None, 3, ["user"]]
MESSAGE_EXTRAS = [
    {},
    {"name": "alice"},
    {"tool_call_id": "c1"},
    {"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    {"tool_calls": None},
    {"tool_calls": [{"id": "", "function": {"name": "f", "arguments": "{}"}}]},
]
VALID = {
    "model": ["gpt-4o"], "temperature": [0, 0.7, 2], "top_p": [0, 1, 0.9], "seed": [0, -5, 2**63 - 1],
    "stop": ["\n", ["a", "b"], []], "stream": [True, False], "n": [1, 128], "max_tokens": [1, 4096],
    "max_completion_tokens": [16], "frequency_penalty": [-2, 0.5], "presence_penalty": [2.0], "ignore_eos": [True],
    "return_token_ids": [False], "logprobs": [True], "parallel_tool_calls": [False], "add_generation_prompt": [True],
    "continue_final_message": [False],
}  # fmt: skip
OTHER_FIELDS = ["tools", "tool_choice", "response_format", "stream_options", "top_logprobs", "stop_token_ids", "user"]


def _message(rng: random.Random) -> object:
    if rng.random() < 0.05:
        return rng.choice(["hi", None, 3, []])
    plain = rng.random() < 0.7
    message = {
        "role": rng.choice(ROLES[:4] if plain else ROLES),
        "content": rng.choice(["hi", ""] if plain else CONTENTS),
    }
    if rng.random() < 0.1:
        del message["content"]
    if rng.random() < 0.3:
        message.update(rng.choice(MESSAGE_EXTRAS))
    return message


def _body(rng: random.Random) -> dict:
    body: dict = {}
    if rng.random() < 0.95:
        body["messages"] = [_message(rng) for _ in range(rng.choice([0, 1, 2, 3, 3]))] if rng.random() < 0.95 else None
    for name in rng.sample(sorted(PLAIN_FIELDS.keys() - {"messages"}) + OTHER_FIELDS, rng.randint(0, 4)):
        body[name] = rng.choice(VALID.get(name, VALUES) if rng.random() < 0.6 else VALUES)
    return body


def _model_accepts(body: dict) -> bool:
    try:
        ChatCompletionRequest.model_validate(body)
    except ValidationError:
        return False
    return True


def test_a_plain_body_is_one_the_model_accepts():
    rng = random.Random(46)
    plain = refused_by_model = 0
    for _ in range(20_000):
        body = _body(rng)
        if is_plain_chat(body):
            plain += 1
            assert _model_accepts(body), body
        elif not _model_accepts(body):
            refused_by_model += 1
    # the mix holds both kinds in numbers, so the check above means something
    assert plain > 1000
    assert refused_by_model > 1000


@pytest.mark.parametrize(
    "body",
    [
        {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi", "name": "alice"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "2 + 3?"},
            ],
            "max_tokens": 64,
            "temperature": 0.7,
            "top_p": 1,
            "seed": 7,
            "stop": ["\n"],
            "n": 2,
            "stream": False,
            "logprobs": True,
            "user": "someone",  # not the model's: passed on
        },
    ],
)
def test_what_agents_send_most_is_plain(body):
    assert is_plain_chat(body)
    assert _model_accepts(body)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": 2.5}, "temperature"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": True}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 129}, "n"),
        ({"messages": [{"role": "tool", "content": "4"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}, "tool_choice"),
    ],
)
def test_a_body_the_shortcut_leaves_to_the_model_is_still_refused(body, param):
    assert not is_plain_chat(body)
    with pytest.raises(GatewayError) as err:
        validate.check_chat(body)
    assert err.value.status == 400
    assert err.value.param == param


def test_the_message_fields_it_knows_are_the_models():
    assert set(Message.model_fields) == _MESSAGE_FIELDS


def test_every_field_it_tells_is_the_models():
    assert PLAIN_FIELDS.keys() <= ChatCompletionRequest.model_fields.keys()
