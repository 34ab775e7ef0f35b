"""What the fuzzer found, pinned: each case it once answered with a 5xx, now a clear 4xx."""

from __future__ import annotations

import logging

import httpx

from tests.reliability.fuzz import FuzzRequest
from tests.reliability.targets import MODEL, gateway_target, store_target


def test_a_lone_surrogate_is_a_400_naming_the_field_and_a_surrogate_pair_is_fine(tmp_path):
    # was: json.loads accepts "\ud800" alone, the engine cannot encode the prompt, the gateway answered 502
    with gateway_target(tmp_path) as (target, _gateway):
        headers = {"Authorization": f"Bearer {target.credentials['key']}", "Content-Type": "application/json"}
        url = f"{target.url}/rollouts/ro-gw/v1"
        lone = b'{"model": "%s", "messages": [{"role": "user", "content": "hi \\ud800"}], "max_tokens": 4}'
        answer = httpx.post(f"{url}/chat/completions", content=lone % MODEL.encode(), headers=headers, timeout=30)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "messages[0].content"
        assert "lone surrogate" in answer.json()["error"]["message"]

        lone = b'{"model": "%s", "input": [{"role": "user", "content": "x"}], "metadata": {"\\udfff": 1}}'
        answer = httpx.post(f"{url}/responses", content=lone % MODEL.encode(), headers=headers, timeout=30)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "metadata", answer.text

        pair = b'{"model": "%s", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "max_tokens": 64}'
        answer = httpx.post(f"{url}/chat/completions", content=pair % MODEL.encode(), headers=headers, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "echo: \N{GRINNING FACE}"


def test_a_client_hanging_up_mid_body_is_not_logged_as_a_server_error(tmp_path, caplog):
    # was: starlette's ClientDisconnect reached the store server's catch-all, which logged an
    # internal error with a traceback (and answered 500 to no one) for every such client
    with store_target(tmp_path) as (target, _store):
        body = b'{"spans": [{"span_id": "cut", "rollout_id": "ro-run", "name": "step"}]}'
        for path in ("/v1/spans", "/v1/cancellations", "/v1/batch"):
            cut = FuzzRequest(0, "cut", "POST", path, "good", "admin", {"Content-Type": "application/json"})
            cut.body, cut.declared_length = body[:20], len(body)
            assert target.send(cut) in (None, 400), path
        assert httpx.get(f"{target.url}/healthz", timeout=10).status_code == 200
    # Only the server's own loggers: an OpenAI client an earlier test left unclosed may be
    # collected while the server's loop runs here, and asyncio logs its failed close as an error.
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith(("agl", "uvicorn"))]
    assert not errors, [r.getMessage() for r in errors]


def test_a_role_that_is_not_a_string_and_an_empty_prompt_are_400s(tmp_path):
    # were: a list as role raised TypeError (unhashable) in validation, a 500; an empty text
    # prompt reached the engine, whose prompt_token_ids [] the gateway took for none, a 502
    with gateway_target(tmp_path) as (target, _gateway):
        headers = {"Authorization": f"Bearer {target.credentials['key']}"}
        url = f"{target.url}/rollouts/ro-gw/v1"
        for role in ([], {"a": 1}):
            body = {"model": MODEL, "messages": [{"role": role, "content": "hi"}], "max_tokens": 4}
            answer = httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=30)
            assert answer.status_code == 400 and answer.json()["error"]["param"] == "messages[0].role", answer.text
        answer = httpx.post(f"{url}/completions", json={"model": MODEL, "prompt": ""}, headers=headers, timeout=30)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "prompt" and "empty" in answer.json()["error"]["message"]
        answer = httpx.post(
            f"{url}/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}, headers=headers
        )
        assert answer.status_code == 200, answer.text


def test_a_tool_call_without_arguments_is_a_400_naming_them(tmp_path):
    # was: passed to the engine, whose chat template needs them (the fake engine's KeyError: a 502)
    with gateway_target(tmp_path) as (target, _gateway):
        call = {"id": "call_1", "type": "function", "function": {"name": "lookup"}}
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        ]
        answer = httpx.post(
            f"{target.url}/rollouts/ro-gw/v1/chat/completions",
            json={"model": MODEL, "messages": messages, "max_tokens": 4},
            headers={"Authorization": f"Bearer {target.credentials['key']}"},
            timeout=30,
        )
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "messages[1].tool_calls[0].function.arguments"
        assert answer.json()["error"]["code"] == "missing_required_parameter"


def test_admin_bodies_with_a_lone_surrogate_are_400s_and_later_calls_are_still_recorded(tmp_path):
    # were: /admin/rollout_keys looked the id up in SQLite (UnicodeEncodeError: a 500), and
    # /admin/model_version took it, after which every call's record failed to serialize and was dropped
    with gateway_target(tmp_path) as (target, gateway):
        admin = {"Authorization": f"Bearer {target.credentials['admin']}", "Content-Type": "application/json"}
        for action, body in (
            ("model_version", b'{"model_version": "\\ud800"}'),
            ("rollout_keys", b'{"rollout_id": "\\ud800"}'),
        ):
            answer = httpx.post(f"{target.url}/admin/{action}", content=body, headers=admin, timeout=30)
            assert answer.status_code == 400, (action, answer.text)
            assert answer.json()["error"]["param"] == body.split(b'"')[1].decode(), answer.text
        assert gateway.model_version == "v1"
        answer = httpx.post(
            f"{target.url}/rollouts/ro-gw/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            headers={"Authorization": f"Bearer {target.credentials['key']}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        gateway.flush()
        assert [c.model_version for c in gateway.store.query_llm_calls(rollout_id="ro-gw")] == ["v1"]
