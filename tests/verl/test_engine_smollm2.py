"""The transformers engine on SmolLM2-135M-Instruct (slow: one model load per session).

Tolerance: logprobs within 1e-4 of a separate fp32 transformers forward pass.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.verl.conftest import reference_logprobs

pytestmark = pytest.mark.slow
TOL = 1e-4

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def hf(smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path), AutoModelForCausalLM.from_pretrained(smollm2_path).eval()


def chat(engine, messages, **fields) -> dict:
    body = {"model": "gpt-4o", "messages": messages, "logprobs": True, "return_token_ids": True, **fields}
    response = httpx.post(engine.urls[0] + "/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def test_ids_text_and_logprobs(smollm2_engine, hf):
    tokenizer, model = hf
    messages = [{"role": "user", "content": "Name three colours."}]
    out = chat(smollm2_engine, messages, max_tokens=20, temperature=0.7, seed=2, n=2)
    assert out["prompt_token_ids"] == list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    )
    for choice in out["choices"]:
        ids = choice["token_ids"]
        assert tokenizer.decode(ids, skip_special_tokens=True) == choice["message"]["content"]
        recorded = [e["logprob"] for e in choice["logprobs"]["content"]]
        assert recorded == pytest.approx(reference_logprobs(model, out["prompt_token_ids"], ids), abs=TOL)


def test_tool_choice_required_yields_a_parseable_call(smollm2_engine, hf):
    tokenizer, _ = hf
    out = chat(smollm2_engine, QUESTION, tools=[WEATHER], tool_choice="required", max_tokens=64, temperature=0)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"]), dict)
    assert tokenizer.decode(choice["token_ids"], skip_special_tokens=True).startswith('<tool_call>\n{"name": "')
    prompt_text = tokenizer.decode(out["prompt_token_ids"])
    assert "<tools>" in prompt_text and "get_weather" in prompt_text


def test_named_tool_and_history_round_trip(smollm2_engine, hf):
    tokenizer, model = hf
    first = chat(
        smollm2_engine,
        QUESTION,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
        temperature=0,
    )
    message = first["choices"][0]["message"]
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    history = QUESTION + [
        message,
        {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "sunny, 21 C"},
    ]
    second = chat(smollm2_engine, history, tools=[WEATHER], max_tokens=20, temperature=0)
    prompt_text = tokenizer.decode(second["prompt_token_ids"])
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt_text
    assert '<tool_call>\n{"name": "get_weather"' in prompt_text
    ids = second["choices"][0]["token_ids"]
    recorded = [e["logprob"] for e in second["choices"][0]["logprobs"]["content"]]
    assert recorded == pytest.approx(reference_logprobs(model, second["prompt_token_ids"], ids), abs=TOL)
