"""Exactness of the transformers engine on a tiny random model: ids, text and logprobs.

Tolerance: recorded logprobs equal a separate fp32 forward pass over prompt + response ids
within 1e-4 (absolute) on CPU; batched and one-at-a-time runs agree on ids exactly and on
logprobs within 1e-4.
"""

from __future__ import annotations

import concurrent.futures
import gzip
import http.client
import json
import socket

import httpx
import pytest

from agl_trainer.http import DEFAULT_MAX_BODY_BYTES
from tests.verl.conftest import reference_logprobs

TOL = 1e-4
AUTH = {"Authorization": "Bearer engine-secret"}


@pytest.fixture(scope="module")
def client(tiny_engine):
    with httpx.Client(base_url=tiny_engine.urls[0], headers=AUTH, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def ref_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def chat(client, messages, **fields):
    body = {"model": "anything", "messages": messages, "logprobs": True, "return_token_ids": True, **fields}
    response = client.post("/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


MESSAGES = [
    {"role": "system", "content": "you are a helpful assistant ."},
    {"role": "user", "content": "what is 12 + 34 ?"},
]


def test_prompt_ids_are_the_chat_template_ids(client, tokenizer):
    out = chat(client, MESSAGES, max_tokens=4, temperature=0)
    expected = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert out["prompt_token_ids"] == list(expected)
    assert out["usage"]["prompt_tokens"] == len(expected)


def test_response_ids_decode_to_text_and_logprobs_match_forward(client, tokenizer, ref_model):
    out = chat(client, MESSAGES, max_tokens=24, temperature=1.0, seed=7, ignore_eos=True)
    choice = out["choices"][0]
    ids = choice["token_ids"]
    assert len(ids) == 24 and choice["finish_reason"] == "length"
    assert tokenizer.decode(ids, skip_special_tokens=True) == choice["message"]["content"]
    recorded = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    expected = reference_logprobs(ref_model, out["prompt_token_ids"], ids)
    assert max(abs(a - b) for a, b in zip(recorded, expected, strict=False)) < TOL


def test_logprobs_ignore_temperature(client, ref_model):
    # the same sampled ids give the same logprobs at any temperature: raw-logit log-softmax
    cold = chat(client, MESSAGES, max_tokens=6, temperature=0.0)
    ids = cold["choices"][0]["token_ids"]
    expected = reference_logprobs(ref_model, cold["prompt_token_ids"], ids)
    recorded = [e["logprob"] for e in cold["choices"][0]["logprobs"]["content"]]
    assert max(abs(a - b) for a, b in zip(recorded, expected, strict=False)) < TOL


def test_batched_and_one_at_a_time_agree(client, tiny_engine):
    prompts = [[{"role": "user", "content": f"what is {i} + {i + 3} ?"}] for i in range(8)]
    alone = [chat(client, m, max_tokens=12, temperature=0, ignore_eos=True) for m in prompts]
    before = tiny_engine.batchers[0].max_rows_seen
    tiny_engine.batchers[0].max_rows_seen = 0
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda m: chat(client, m, max_tokens=12, temperature=0, ignore_eos=True), prompts))
    assert tiny_engine.batchers[0].max_rows_seen > 1, "concurrent requests were never batched"
    tiny_engine.batchers[0].max_rows_seen = max(before, tiny_engine.batchers[0].max_rows_seen)
    for a, b in zip(alone, together, strict=False):
        assert a["prompt_token_ids"] == b["prompt_token_ids"]
        assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
        la = [e["logprob"] for e in a["choices"][0]["logprobs"]["content"]]
        lb = [e["logprob"] for e in b["choices"][0]["logprobs"]["content"]]
        assert max(abs(x - y) for x, y in zip(la, lb, strict=False)) < TOL


def test_seeded_sampling_is_reproducible_and_n_gives_distinct_choices(client):
    a = chat(client, MESSAGES, max_tokens=10, seed=3, n=3, ignore_eos=True)
    b = chat(client, MESSAGES, max_tokens=10, seed=3, n=3, ignore_eos=True)
    ids_a = [c["token_ids"] for c in a["choices"]]
    assert ids_a == [c["token_ids"] for c in b["choices"]]
    assert len(a["choices"]) == 3 and len({tuple(x) for x in ids_a}) > 1
    assert a["usage"]["completion_tokens"] == 30


def test_stop_string_cuts_text_but_keeps_sampled_ids(client, tokenizer):
    sampling = {"max_tokens": 30, "temperature": 1.0, "seed": 11, "ignore_eos": True}
    text = chat(client, MESSAGES, **sampling)["choices"][0]["message"]["content"]
    stop = next(text[i : i + 2] for i in range(4, len(text) - 2) if text[i : i + 2].strip())
    out = chat(client, MESSAGES, **sampling, stop=[stop])
    choice = out["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == text[: text.find(stop)]
    decoded = tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert decoded.startswith(choice["message"]["content"]) and stop in decoded


def test_stream_carries_the_same_ids_text_and_usage(client):
    plain = chat(client, MESSAGES, max_tokens=10, temperature=0, ignore_eos=True)
    body = {
        "messages": MESSAGES,
        "max_tokens": 10,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "logprobs": True,
    }
    ids, text, prompt_ids, usage, finish, logprobs = [], "", None, None, None, []
    with client.stream("POST", "/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    for raw in lines[:-1]:
        chunk = json.loads(raw)
        prompt_ids = chunk.get("prompt_token_ids", prompt_ids)
        usage = chunk.get("usage", usage)
        for c in chunk["choices"]:
            ids += c.get("token_ids", [])
            text += c["delta"].get("content") or ""
            finish = c["finish_reason"] or finish
            logprobs += [e["logprob"] for e in (c["logprobs"] or {}).get("content", [])]
    assert prompt_ids == plain["prompt_token_ids"]
    assert ids == plain["choices"][0]["token_ids"]
    assert text == plain["choices"][0]["message"]["content"]
    assert logprobs == pytest.approx([e["logprob"] for e in plain["choices"][0]["logprobs"]["content"]], abs=TOL)
    assert finish == "length"
    assert usage == {"prompt_tokens": len(prompt_ids), "completion_tokens": 10, "total_tokens": len(prompt_ids) + 10}


def test_completions_take_token_ids_and_text(client, tokenizer, ref_model):
    prompt = tokenizer.encode("hello world !")
    out = client.post(
        "/completions",
        json={
            "prompt": prompt,
            "max_tokens": 5,
            "temperature": 0,
            "logprobs": 0,
            "return_token_ids": True,
            "ignore_eos": True,
        },
    ).json()
    choice = out["choices"][0]
    assert choice["prompt_token_ids"] == prompt
    assert tokenizer.decode(choice["token_ids"], skip_special_tokens=True) == choice["text"]
    expected = reference_logprobs(ref_model, prompt, choice["token_ids"])
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected, abs=TOL)
    by_text = client.post(
        "/completions",
        json={
            "prompt": "hello world !",
            "max_tokens": 5,
            "temperature": 0,
            "return_token_ids": True,
            "ignore_eos": True,
        },
    ).json()
    assert by_text["choices"][0]["token_ids"] == choice["token_ids"]


def test_tools_are_rendered_into_the_prompt_by_the_convention(client, tokenizer):
    from agl_verl.engines.tools import ToolChoice, render_messages

    tools = [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "add two numbers",
                "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
            },
        }
    ]
    history = MESSAGES + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 12}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "46"},
    ]
    out = chat(client, history, tools=tools, max_tokens=3, temperature=0)
    rendered = render_messages([{**m} for m in history], tools, ToolChoice("auto"))
    expected = tokenizer.apply_chat_template(rendered, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert out["prompt_token_ids"] == list(expected)
    prompt_text = tokenizer.decode(out["prompt_token_ids"])
    assert "<tools>" in prompt_text and '"name": "add"' in prompt_text
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 12}}\n</tool_call>' in prompt_text
    assert "<tool_response>\n46\n</tool_response>" in prompt_text


def test_named_tool_choice_forces_the_call_prefix(client, tokenizer):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    out = chat(
        client,
        MESSAGES,
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "add"}},
        max_tokens=60,
        temperature=0,
    )
    text = tokenizer.decode(out["choices"][0]["token_ids"], skip_special_tokens=True)
    assert text.startswith('<tool_call>\n{"name": "add", "arguments": ')
    # the random tiny model cannot finish the JSON: content comes back, never a made-up call
    assert out["choices"][0]["finish_reason"] in ("length", "stop")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0].type"),
        ({"messages": MESSAGES, "temperature": 5}, "temperature"),
        ({"messages": MESSAGES, "n": 0}, "n"),
        ({"messages": MESSAGES, "max_tokens": "ten"}, "max_tokens"),
        ({"messages": MESSAGES, "top_p": 1.5}, "top_p"),
        ({"messages": MESSAGES, "stop": 3}, "stop"),
        ({"messages": MESSAGES, "tool_choice": "required"}, "tool_choice"),
        ({"messages": MESSAGES, "response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"messages": MESSAGES, "response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": MESSAGES, "frequency_penalty": 0.5}, "frequency_penalty"),
        ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages[0].role"),
        ({"messages": MESSAGES, "max_tokens": 100000}, "max_tokens"),
    ],
)
def test_bad_chat_fields_get_400_naming_the_field(client, body, param):
    response = client.post("/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and error["message"]


def test_context_overflow_names_the_lengths(client):
    long = " ".join(["hello"] * 600)
    response = client.post("/chat/completions", json={"messages": [{"role": "user", "content": long}]})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "1024" in message and "prompt has" in message


def test_completion_prompt_ids_out_of_vocab_is_400(client, tokenizer):
    response = client.post("/completions", json={"prompt": [1, len(tokenizer) + 5]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"


def test_bearer_token_is_required(tiny_engine):
    response = httpx.post(tiny_engine.urls[0] + "/chat/completions", json={"messages": MESSAGES}, timeout=10)
    assert response.status_code == 401
    models = httpx.get(tiny_engine.urls[0] + "/models", headers=AUTH, timeout=10).json()
    assert models["data"][0]["max_model_len"] == 1024


def test_bodies_past_the_limit_get_413_and_gzip_ones_are_inflated(tiny_engine, client):
    url = httpx.URL(tiny_engine.urls[0])
    with socket.create_connection((url.host, url.port), timeout=10) as sock:
        # a declared length past the limit is refused before any of the body is sent
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.host}\r\nAuthorization: Bearer engine-secret\r\n"
            f"Content-Type: application/json\r\nContent-Length: {DEFAULT_MAX_BODY_BYTES + 1}\r\n\r\n"
        )
        sock.sendall(head.encode())
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        error = json.loads(answer.read())["error"]
    assert answer.status == 413 and error["code"] == 413 and str(DEFAULT_MAX_BODY_BYTES) in error["message"]
    packed = gzip.compress(json.dumps({"messages": MESSAGES, "max_tokens": 2}).encode())
    gzipped = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    assert client.post("/chat/completions", content=packed, headers=gzipped).status_code == 200
    bomb = gzip.compress(b'{"messages": "' + b"x" * DEFAULT_MAX_BODY_BYTES + b'"}')  # small, inflates past the limit
    assert len(bomb) < 1 << 20
    refused = client.post("/chat/completions", content=bomb, headers=gzipped)
    assert refused.status_code == 413 and refused.json()["error"]["type"] == "invalid_request_error"
    other = client.post("/chat/completions", content=packed, headers={"Content-Encoding": "br"})
    assert other.status_code == 415 and "Content-Encoding" in other.json()["error"]["message"]
