"""The client sees the model name it asked for, on every endpoint, plain and streamed;
the engine is asked for the model it serves, and the record keeps the served version."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.conftest import calls_of

ASKED = "gpt-4o-mini"
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions_echo_the_requested_model(client, gateway, store, rollout, engine, stream):
    if stream:
        chunks = list(client.chat.completions.create(model=ASKED, messages=MESSAGES, stream=True))
        assert chunks and {c.model for c in chunks} == {ASKED}
    else:
        assert client.chat.completions.create(model=ASKED, messages=MESSAGES).model == ASKED
    assert engine.requests[-1]["model"] == "fake-policy"
    [call] = calls_of(gateway, store, rollout)
    assert call.requested_model == ASKED and call.model_version == "v1" and call.response["model"] == ASKED


@pytest.mark.parametrize("stream", [False, True])
def test_text_completions_echo_the_requested_model(client, engine, stream):
    if stream:
        chunks = list(client.completions.create(model=ASKED, prompt="hi", stream=True))
        assert chunks and {c.model for c in chunks} == {ASKED}
    else:
        assert client.completions.create(model=ASKED, prompt="hi").model == ASKED
    assert engine.requests[-1]["model"] == "fake-policy"


@pytest.mark.parametrize("stream", [False, True])
def test_responses_echo_the_requested_model(client, engine, stream):
    if stream:
        events = list(client.responses.create(model=ASKED, input="hello", stream=True))
        models = {e.response.model for e in events if hasattr(e, "response")}
        assert models == {ASKED} and events[-1].type == "response.completed"
    else:
        assert client.responses.create(model=ASKED, input="hello").model == ASKED
    assert engine.requests[-1]["model"] == "fake-policy"


def test_without_a_requested_model_the_served_one_is_named(gateway, rollout, key):
    url = gateway.rollout_base_url(rollout) + "/chat/completions"
    resp = httpx.post(url, json={"messages": MESSAGES}, headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert resp.status_code == 200 and resp.json()["model"] == "fake-policy"
