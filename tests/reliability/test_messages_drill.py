"""Drill: the gateway's Anthropic routes under bad input and cut streams.

Malformed blocks, wrong types, a missing ``max_tokens``, huge bodies and streams cut by
either side: each is a 4xx in Anthropic's error shape naming the field (or, for a cut
stream, an aborted record or an ``error`` event), never a 5xx from the gateway itself,
and the gateway goes on serving. The seeded fuzzer covers the same routes at random
(``test_fuzz_servers.py``); these are the cases named in the issue, one by one.
"""

from __future__ import annotations

import logging

import anthropic
import httpx
import pytest

from tests.fake_engine import FakeEngine
from tests.reliability.fuzz import FuzzRequest
from tests.reliability.targets import gateway_target

OK = {"model": "claude-sonnet-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def _post(target, *, path: str = "/rollouts/ro-gw/v1/messages", **kwargs) -> httpx.Response:
    """POST to a Messages route with the rollout's key in ``x-api-key``, as the anthropic SDK sends it."""
    headers = {"x-api-key": target.credentials["key"], "content-type": "application/json"}
    return httpx.post(f"{target.url}{path}", headers=headers, timeout=30, **kwargs)


def _still_serving(target) -> None:
    answer = _post(target, json=OK)
    assert answer.status_code == 200 and answer.json()["content"][0]["text"] == "echo: hi", answer.text


def _own_errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("agl")]


@pytest.mark.parametrize(
    "messages, field",
    [
        ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "messages[0].content[0].text"),
        ([{"role": "user", "content": [{"text": "no type"}]}], "messages[0].content[0]"),
        ([{"role": "user", "content": [42]}], "messages[0].content[0]"),
        (
            [{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}],
            "messages[0].content[0].source.type",
        ),
        (
            [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": "not an object"}],
                },
            ],
            "messages[1].content[0].input",
        ),
        (
            [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": "yes"}]}],
            "messages[0].content[0].is_error",
        ),
        ([{"role": "user", "content": {"type": "text", "text": "an object, not a list"}}], "messages[0].content"),
        ([], "messages"),
        ("hello", "messages"),
    ],
)
def test_malformed_blocks_and_wrong_types_are_400s_naming_the_field(tmp_path, caplog, messages, field):
    with gateway_target(tmp_path) as (target, _gw):
        answer = _post(target, json=OK | {"messages": messages})
        assert answer.status_code == 400, answer.text
        err = answer.json()
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
        assert err["error"]["message"].startswith(f"{field}: ") or err["error"]["message"].startswith(f"{field}."), err
        _still_serving(target)
    assert not _own_errors(caplog)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 16.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"model": 7}, "model"),
        ({"stream": "yes"}, "stream"),
        ({"top_k": -1}, "top_k"),
        ({"stop_sequences": "\n"}, "stop_sequences"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"system": {"text": "x"}}, "system"),
    ],
)
def test_wrong_types_and_a_missing_max_tokens_are_400s(tmp_path, change, field):
    body = {k: v for k, v in (OK | change).items() if v is not None}
    with gateway_target(tmp_path) as (target, _gw):
        answer = _post(target, json=body)
        assert answer.status_code == 400 and answer.json()["error"]["message"].startswith(f"{field}"), answer.text


def test_huge_bodies(tmp_path):
    with gateway_target(tmp_path) as (target, gw):
        big = OK | {"messages": [{"role": "user", "content": "x" * 1_000_000}]}
        long = _post(target, json=big)  # a megabyte of prompt: past the engine's context, its 400 passed on
        assert long.status_code == 400 and "maximum context length" in long.json()["error"]["message"], long.text
        huge = b'{"messages": [{"role": "user", "content": "' + b"x" * (gw.app.max_body_bytes + 10) + b'"}]}'
        answer = _post(target, content=huge)
        assert answer.status_code == 413 and answer.json()["error"]["type"] == "request_too_large"
        counted = _post(target, path="/rollouts/ro-gw/v1/messages/count_tokens", content=huge)
        assert counted.status_code == 413
        _still_serving(target)


def test_a_stream_cut_by_its_client_is_recorded_aborted_and_the_gateway_serves_on(tmp_path, caplog):
    # the engine takes 50 ms a chunk, so the client hangs up while the answer still streams
    with FakeEngine(chunk_delay_s=0.05) as engine, gateway_target(tmp_path, engine) as (target, gw):
        cut = FuzzRequest(0, "cut", "POST", "/rollouts/ro-gw/v1/messages", "good", "key", auth_header="x-api-key")
        cut.body = httpx.Request("POST", "/", json=OK | {"stream": True, "max_tokens": 4000}).content
        cut.headers["Content-Type"] = "application/json"
        cut.read_then_hang_up = 1
        assert target.send(cut) == 200
        _still_serving(target)
        gw.flush()
        calls = sorted(gw.store.query_llm_calls(rollout_id="ro-gw"), key=lambda c: c.seq)
        assert [(c.endpoint, c.aborted) for c in calls] == [("messages", True), ("messages", False)]
        assert len(calls[0].response_ids) == 0 and len(calls[1].response_ids) > 0
    assert not _own_errors(caplog)


def test_a_stream_the_engine_drops_ends_with_an_error_event(tmp_path):
    with FakeEngine() as engine, gateway_target(tmp_path, engine) as (target, _gw):
        engine.break_stream_after = 2
        client = anthropic.Anthropic(
            base_url=f"{target.url}/rollouts/ro-gw", api_key=target.credentials["key"], max_retries=0
        )
        with pytest.raises(anthropic.APIStatusError) as caught, client.messages.stream(**OK | {"max_tokens": 400}) as s:
            s.get_final_message()
        assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "api_error"
        assert "engine dropped the stream" in caught.value.body["error"]["message"]
        _still_serving(target)
