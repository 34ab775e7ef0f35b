"""What clients get when something is wrong: OpenAI-style bodies naming the field."""

from __future__ import annotations

import httpx
import openai
import pytest

from agl.schema import RolloutStatus
from agl_trainer.gateway import Gateway
from tests.conftest import free_port
from tests.fake_engine import FakeEngine
from tests.gateway.conftest import ADMIN_TOKEN, TOKEN, calls_of, new_rollout

MESSAGES = [{"role": "user", "content": "hi"}]
_AUTO = object()


def post(gateway, path, body, token=_AUTO, **kw):
    """POST with the rollout's key on its own routes (attempt 1: a rollout claimed once), else the gateway token."""
    if token is _AUTO:
        rid = path.split("/")[2] if path.startswith("/rollouts/") else None
        token = gateway.rollout_key(rid, 1) if rid else TOKEN
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if isinstance(body, (bytes, str)):
        return httpx.post(f"{gateway.url}{path}", content=body, headers=headers, **kw)
    return httpx.post(f"{gateway.url}{path}", json=body, headers=headers, **kw)


def test_missing_or_wrong_token_is_401(gateway, rollout):
    for token in (None, "wrong"):
        r = post(gateway, "/v1/chat/completions", {"model": "m", "messages": MESSAGES}, token=token)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    with (
        openai.OpenAI(base_url=gateway.base_url, api_key="wrong", max_retries=0) as c,
        pytest.raises(openai.AuthenticationError),
    ):
        c.chat.completions.create(model="m", messages=MESSAGES)


def test_unknown_rollout_is_404_and_nothing_is_recorded(gateway, store):
    r = post(gateway, "/rollouts/nope/v1/chat/completions", {"model": "m", "messages": MESSAGES})
    assert r.status_code == 404 and r.json()["error"]["code"] == "rollout_not_found"
    assert "nope" in r.json()["error"]["message"]
    assert post(gateway, "/rollouts/nope/v1/models", b"").status_code in (404, 405)
    new_rollout(store, "nope")  # enqueued a moment later: found on the next call
    assert post(gateway, "/rollouts/nope/v1/chat/completions", {"model": "m", "messages": MESSAGES}).status_code == 200


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"model": "m", "messages": MESSAGES, "temperature": "hot"}, "temperature"),
        ({"model": "m", "messages": MESSAGES, "n": 0}, "n"),
        ({"model": "m", "messages": MESSAGES, "max_tokens": -1}, "max_tokens"),
        ({"model": "m", "messages": MESSAGES, "stop": [1]}, "stop"),
        (
            {"model": "m", "messages": MESSAGES, "tools": [{"type": "function", "function": {}}]},
            "tools[0].function.name",
        ),
        (
            {"model": "m", "messages": MESSAGES, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"model": 5, "messages": MESSAGES}, "model"),
        ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ],
)
def test_malformed_chat_request_is_400_naming_the_field(gateway, rollout, body, param):
    r = post(gateway, f"/rollouts/{rollout}/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and param in err["message"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "m"}, "prompt"),
        ({"model": "m", "prompt": ["a", "b"]}, "prompt"),
        ({"model": "m", "prompt": [1, -2]}, "prompt"),
        ({"model": "m", "prompt": "x", "logprobs": 99}, "logprobs"),
    ],
)
def test_malformed_completion_request_is_400(gateway, body, param):
    r = post(gateway, "/v1/completions", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_body_that_is_not_json_is_400(gateway):
    r = post(gateway, "/v1/chat/completions", b"{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert post(gateway, "/v1/chat/completions", b"[1]").status_code == 400


def test_prompt_over_the_context_length_passes_the_engines_400(store, rollout):
    with FakeEngine(max_model_len=64) as eng, Gateway(store, [eng.url], token=TOKEN) as gw:
        r = post(
            gw,
            f"/rollouts/{rollout}/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "x" * 100}], "max_tokens": 10},
        )
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "maximum context length is 64" in message and "121 in the messages" in message


def test_engine_down_is_502_and_nothing_is_recorded(store, rollout):
    with Gateway(store, [f"http://127.0.0.1:{free_port()}/v1"], token=TOKEN) as gw:
        r = post(gw, f"/rollouts/{rollout}/v1/chat/completions", {"model": "m", "messages": MESSAGES})
        assert r.status_code == 502 and r.json()["error"]["code"] == "engine_unavailable"
        assert calls_of(gw, store, rollout) == []


def test_engine_503_on_every_replica_is_503(store, rollout, engine):
    engine.fail_next.extend([503, 503])
    with Gateway(store, [engine.url], token=TOKEN) as gw:
        r = post(gw, f"/rollouts/{rollout}/v1/chat/completions", {"model": "m", "messages": MESSAGES})
    assert r.status_code == 503


def test_engine_without_token_ids_is_a_clear_502(store, rollout, engine):
    engine.fail_next.append(200)  # the fake answers its error body with status 200: no ids in it
    with Gateway(store, [engine.url], token=TOKEN) as gw:
        r = post(gw, f"/rollouts/{rollout}/v1/chat/completions", {"model": "m", "messages": MESSAGES})
    assert r.status_code == 502 and r.json()["error"]["code"] == "engine_without_token_ids"


def test_ended_rollout_still_records_late_calls_of_the_admin(gateway, store, rollout):
    """The rollout's key dies with it (tests/gateway/test_rollout_keys.py); the admin token's calls are recorded."""
    store.finish(rollout, RolloutStatus.SUCCEEDED)
    r = post(gateway, f"/rollouts/{rollout}/v1/chat/completions", {"model": "m", "messages": MESSAGES})
    assert r.status_code == 401 and r.json()["error"]["code"] == "rollout_key_expired"
    r = post(gateway, f"/rollouts/{rollout}/v1/chat/completions", {"model": "m", "messages": MESSAGES}, ADMIN_TOKEN)
    assert r.status_code == 200
    assert [c.call_id for c in calls_of(gateway, store, rollout)] == [r.json()["id"]]


def test_response_format_json_schema(store, rollout):
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    body = {"model": "m", "messages": MESSAGES, "response_format": fmt}
    with FakeEngine(structured_output=False) as eng, Gateway(store, [eng.url], token=TOKEN) as gw:
        r = post(gw, f"/rollouts/{rollout}/v1/chat/completions", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
        assert "cannot honour" in r.json()["error"]["message"]
        bad = post(gw, "/v1/chat/completions", dict(body, response_format={"type": "xml"}))
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_format"
    with FakeEngine(structured_output=True) as eng, Gateway(store, [eng.url], token=TOKEN) as gw:
        r = post(gw, f"/rollouts/{rollout}/v1/chat/completions", body)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == '{"echo": "hi"}'
        assert eng.requests[-1]["response_format"] == fmt


def test_unknown_route_is_404(gateway):
    assert post(gateway, "/v2/chat", {}).status_code == 404
    assert post(gateway, "/rollouts/ro-1/v2/x", {}).status_code == 404
