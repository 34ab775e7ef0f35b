"""Requests OpenAI refuses are refused by the gateway too (issue 16): a 400 in OpenAI's error
shape naming the ``param``; bodies past the limit get a 413; a 5xx names no engine URL."""

from __future__ import annotations

import gzip
import json
import time

import httpx
import pytest

from agl_trainer.gateway import Gateway
from tests.fake_engine import FakeEngine
from tests.gateway.conftest import ADMIN_TOKEN, TOKEN, calls_of

USER = {"role": "user", "content": "hello"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture
def http(gateway):
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
        yield c


def _refused(answer: httpx.Response, param: str | None, status: int = 400) -> str:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    return error["message"]


def _chat(http, messages, **extra) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"model": "m", "messages": messages, "tools": TOOLS, **extra})


def _responses(http, items, **extra) -> httpx.Response:
    return http.post("/v1/responses", json={"model": "m", "input": items, **extra})


def test_a_tool_result_must_answer_an_earlier_tool_call(http):
    stray = {"role": "tool", "tool_call_id": "call_9", "content": "3"}
    message = _refused(_chat(http, [USER, stray]), "messages[1].tool_call_id")
    assert "'call_9'" in message
    answered = [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}, dict(stray, tool_call_id="call_1")]
    assert _chat(http, answered).status_code == 200
    wrong = [*answered[:2], stray]
    _refused(_chat(http, wrong), "messages[2].tool_call_id")
    no_id = [USER, {"role": "assistant", "tool_calls": [{k: v for k, v in CALL.items() if k != "id"}]}]
    _refused(_chat(http, no_id), "messages[1].tool_calls[0].id")


def test_a_function_call_output_must_answer_an_earlier_function_call(http):
    output = {"type": "function_call_output", "call_id": "call_9", "output": "3"}
    message = _refused(_responses(http, [USER, output]), "input[1].call_id")
    assert "'call_9'" in message
    call = {"type": "function_call", "call_id": "call_9", "name": "add", "arguments": "{}"}
    assert _responses(http, [USER, call, output]).status_code == 200
    _refused(_responses(http, [USER, output, call]), "input[1].call_id")  # the call must come first


def test_tool_call_arguments_must_be_json_text(http):
    as_object = dict(CALL, function={"name": "add", "arguments": {"a": 1}})
    message = _refused(
        _chat(http, [USER, {"role": "assistant", "tool_calls": [as_object]}]),
        "messages[1].tool_calls[0].function.arguments",
    )
    assert "must be a string" in message
    call = {"type": "function_call", "call_id": "c", "name": "add", "arguments": {"a": 1}}
    _refused(_responses(http, [USER, call]), "input[1].arguments")


@pytest.mark.parametrize("seed", [2**80, 2**63, -(2**63) - 1, "7", 1.5])
def test_a_seed_outside_64_bits_is_refused(http, seed):
    _refused(_chat(http, [USER], seed=seed), "seed")
    _refused(_responses(http, "hi", seed=seed), "seed")


def test_extreme_seeds_inside_64_bits_are_passed_on(http, engine):
    for seed in (2**63 - 1, -(2**63)):
        assert _chat(http, [USER], seed=seed).status_code == 200
        assert engine.requests[-1]["seed"] == seed


@pytest.mark.parametrize("value", [0, -3, "100", 2.5, 2**70])
def test_a_bad_max_output_tokens_is_named_as_the_client_named_it(http, value):
    message = _refused(_responses(http, "hi", max_output_tokens=value), "max_output_tokens")
    assert "max_tokens" not in message


def test_numbers_json_cannot_hold_and_deep_nesting_are_400s(http, engine):
    sent = len(engine.requests)
    nan = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    _refused(http.post("/v1/chat/completions", content=nan), "temperature")
    huge = {"model": "m", "messages": [USER], "metadata": {"n": 2**70}}
    _refused(http.post("/v1/chat/completions", json=huge), "metadata.n")
    for depth in (70, 5000):
        nested = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": ' + b"[" * depth
        nested += b"]" * depth + b"}"
        for path in ("/v1/chat/completions", "/v1/responses", "/v1/completions"):
            answer = http.post(path, content=nested)
            assert answer.status_code == 400, (depth, path, answer.text)
            assert "nests" in answer.json()["error"]["message"]
    assert len(engine.requests) == sent  # nothing reached the engine
    assert _chat(http, [USER]).status_code == 200


def test_bodies_past_the_limit_get_413_and_compressed_ones_415(store, engine):
    with (
        Gateway(store, [engine.url], token=TOKEN, admin_token=ADMIN_TOKEN, max_body_bytes=4096) as gw,
        httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http,
    ):
        big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}).encode()

        def chunks():
            for i in range(0, len(big), 1000):
                yield big[i : i + 1000]

        for content in (big, chunks()):
            for path in ("/v1/chat/completions", "/v1/responses", "/admin/pause"):
                token = ADMIN_TOKEN if path.startswith("/admin/") else TOKEN
                answer = http.post(
                    path,
                    content=content if isinstance(content, bytes) else chunks(),
                    headers={"Authorization": f"Bearer {token}"},
                )
                assert answer.status_code == 413, (path, answer.text)
                assert answer.json()["error"]["code"] == "request_too_large"
        small = json.dumps({"model": "m", "messages": [USER]}).encode()
        packed = http.post("/v1/chat/completions", content=gzip.compress(small), headers={"Content-Encoding": "gzip"})
        assert packed.status_code == 415 and packed.json()["error"]["code"] == "unsupported_encoding"
        assert http.post("/v1/chat/completions", content=small).status_code == 200


def test_a_502_names_no_engine_url_and_gives_a_request_id(store, rollout, engine, caplog):
    with (
        Gateway(store, [engine.url], token=TOKEN) as gw,
        httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http,
    ):
        engine.fail_next.append(500)
        failed = http.post("/v1/chat/completions", json={"model": "m", "messages": [USER]})
    assert failed.status_code == 502, failed.text
    error = failed.json()["error"]
    request_id = failed.headers["X-Request-Id"]
    assert f"(request id {request_id})" in error["message"]
    assert "127.0.0.1" not in failed.text and str(engine.url) not in failed.text
    assert any(request_id in r.getMessage() for r in caplog.records)
    assert calls_of(gw, store, rollout) == []


def test_an_unreachable_engine_is_a_502_without_its_url(store):
    with (
        Gateway(store, ["http://127.0.0.1:9/v1"], token=TOKEN) as gw,
        httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http,
    ):
        answer = http.post("/v1/chat/completions", json={"model": "m", "messages": [USER]})
    assert answer.status_code == 502 and answer.json()["error"]["code"] == "engine_unavailable"
    assert "127.0.0.1" not in answer.text and "request id" in answer.json()["error"]["message"]


@pytest.mark.parametrize("prompt", [[1, 2**31], [2**40], [-1], [[1, 2], [3]]])
def test_prompt_token_ids_the_store_cannot_keep_are_refused(http, engine, prompt):
    sent = len(engine.requests)
    _refused(http.post("/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 2}), "prompt")
    assert len(engine.requests) == sent


def test_agl_gateway_serve_names_a_bad_body_limit():
    import subprocess
    import sys

    agl = [sys.executable, "-c", "import sys; from agl_trainer.cli import main; sys.exit(main(sys.argv[1:]))"]
    out = subprocess.run(
        [*agl, "gateway", "serve", "--upstream", "http://127.0.0.1:1/v1", "--max-body-mb", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "--max-body-mb: must be positive" in out.stderr


GATEWAY_BAD_BODIES = [
    b"",
    b"null",
    b"[1]",
    b"{nope",
    b'{"model": 1, "messages": "x", "input": 7, "prompt": {}}',
    b'{"messages": [{"role": "user", "content": "hi"}], "n": 1e400, "stop": [1], "tools": {}}',
    b'{"input": [{"type": "function_call_output"}], "text": 1, "tool_choice": []}',
    b"[" * 3000 + b"]" * 3000,
]


def test_no_bad_body_gets_a_5xx_on_any_route(store, engine):
    with (
        Gateway(store, [engine.url], token=TOKEN, admin_token=ADMIN_TOKEN) as gw,
        httpx.Client(base_url=gw.url, timeout=30) as http,
    ):
        routes = [(p, TOKEN) for p in ("/v1/chat/completions", "/v1/completions", "/v1/responses")]
        routes += [(f"/admin/{a}", ADMIN_TOKEN) for a in ("pause", "resume", "model_version", "upstreams", "flush")]
        for path, token in routes:
            for body in GATEWAY_BAD_BODIES:
                answer = http.post(path, content=body, headers={"Authorization": f"Bearer {token}"})
                assert answer.status_code < 500, (path, body[:60], answer.text)
        for query in ("timeout_s=nan", "timeout_s=-1", "timeout_s=inf", "timeout_s=x"):
            answer = http.post(f"/admin/pause?{query}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            assert answer.status_code == 400 and answer.json()["error"]["param"] == "timeout_s", answer.text
        assert gw.paused is False
        auth = {"Authorization": f"Bearer {TOKEN}"}
        ok = http.post("/v1/chat/completions", json={"model": "m", "messages": [USER]}, headers=auth)
        assert ok.status_code == 200


class _InfiniteLogprobEngine(FakeEngine):
    """An engine whose answers hold a -Infinity logprob, as Python's json writes it."""

    def chat(self, req: dict) -> tuple[int, dict]:
        status, out = super().chat(req)
        for choice in out.get("choices", []):
            content = (choice.get("logprobs") or {}).get("content") or []
            if content:
                content[0]["logprob"] = float("-inf")
                content[0]["top_logprobs"] = [{"token": "x", "logprob": float("nan"), "bytes": [120]}]
        return status, out


def test_non_finite_numbers_from_the_engine_are_made_finite_for_client_and_store(store, rollout):
    with (
        _InfiniteLogprobEngine() as eng,
        Gateway(store, [eng.url], token=TOKEN) as gw,
        httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {gw.rollout_key(rollout, 1)}"}) as http,
    ):
        answer = http.post(
            f"/rollouts/{rollout}/v1/chat/completions", json={"model": "m", "messages": [USER], "logprobs": True}
        )
        assert answer.status_code == 200, answer.text
        assert "Infinity" not in answer.text and "NaN" not in answer.text  # strict JSON
        first = answer.json()["choices"][0]["logprobs"]["content"][0]
        assert first["logprob"] == -9999.0 and first["top_logprobs"][0]["logprob"] is None
        [call] = calls_of(gw, store, rollout)
        assert call.response_logprobs[0] == -9999.0


def test_a_store_outage_is_a_503_without_the_store_url(tmp_path, engine):
    from agl.credentials import new_token
    from agl.schema import Rollout, Task
    from agl.store.http import HttpStore
    from agl.store.sqlite import SqliteStore
    from agl_trainer.store_server import ServerThread

    store_token = new_token(16)
    with SqliteStore(tmp_path / "backing.db") as backing:
        backing.add_tasks([Task(task_id="t", input=1)])
        backing.enqueue([Rollout(rollout_id="ro-out", task_id="t")])
        backing.claim("r1")
        server = ServerThread(backing, token=store_token).start()
        with (
            HttpStore(server.url, token=store_token, retries=0, timeout_s=5) as remote,
            Gateway(remote, [engine.url], token=TOKEN, status_ttl_s=0) as gw,  # asks the store on every call
            httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {gw.rollout_key('ro-out', 1)}"}) as http,
        ):
            body = {"model": "m", "messages": [USER]}
            assert http.post("/rollouts/ro-out/v1/chat/completions", json=body).status_code == 200
            gw.flush()  # the call is written before the store goes away (else stopping waits on it)
            server.stop()
            answer = http.post("/rollouts/ro-out/v1/chat/completions", json=body)
            assert answer.status_code == 503, answer.text
            assert answer.headers["Retry-After"] == "1" and "request id" in answer.json()["error"]["message"]
            assert server.url not in answer.text and "127.0.0.1" not in answer.text


def test_admin_flush_gives_up_on_a_store_that_is_away(tmp_path, engine):
    """POST /admin/flush waits for the store at most its timeout_s (20 s by default), then answers
    503 with the calls still buffered, instead of hanging."""
    from agl.capture import BufferedWriter
    from agl.credentials import new_token
    from agl.store.http import HttpStore
    from agl.store.sqlite import SqliteStore
    from agl_trainer.store_server import ServerThread

    store_token = new_token(16)
    with SqliteStore(tmp_path / "backing.db") as backing:
        server = ServerThread(backing, token=store_token).start()
        with HttpStore(server.url, token=store_token, retries=0, timeout_s=5) as remote:
            writer = BufferedWriter(remote, retry_for_s=3)
            with Gateway(remote, [engine.url], token=TOKEN, admin_token=ADMIN_TOKEN, writer=writer) as gw:
                server.stop()
                production = {"Authorization": f"Bearer {TOKEN}"}
                body = {"model": "m", "messages": [USER]}
                assert httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=production).status_code == 200
                admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
                started = time.monotonic()
                answer = httpx.post(f"{gw.url}/admin/flush", json={"timeout_s": 0.5}, headers=admin, timeout=10)
                assert answer.status_code == 503 and time.monotonic() - started < 3, answer.text
                assert answer.headers["Retry-After"] == "1"
                bad = httpx.post(f"{gw.url}/admin/flush", json={"timeout_s": -1}, headers=admin, timeout=10)
                assert bad.status_code == 400 and bad.json()["error"]["param"] == "timeout_s"
            writer.close(timeout_s=5)
