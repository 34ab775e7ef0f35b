"""Behaviour log-probs: what each token was sampled with, recorded beside the raw model's.

The transformers engine samples from ``softmax(logits / T)`` (then top-p, renormalised);
the behaviour log-prob of a sampled token is the log of that probability, the raw one the
model's ``log_softmax(logits)``. Both are checked against a separate fp32 forward pass of
the tiny model (1e-4 absolute, as in test_engine_exactness), and through a real gateway
into the store, streamed or not.
"""

from __future__ import annotations

import json
import math

import httpx
import pytest
import torch

from tests.verl.conftest import GATEWAY_TOKEN as TOKEN
from tests.verl.conftest import reference_logprobs

TOL = 1e-4
ENGINE_KEY = "engine-secret"  # tests/verl/conftest.py's tiny_engine
MESSAGES = [{"role": "user", "content": "what is 12 + 34 ?"}]


@pytest.fixture(scope="module")
def ref_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture(scope="module")
def gateway(tiny_gateway):
    return tiny_gateway


def chat(base_url: str, key: str, **fields) -> dict:
    body = {"model": "m", "messages": MESSAGES, "logprobs": True, "return_token_ids": True, **fields}
    response = httpx.post(f"{base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    return response.json()


def top_p_logprobs(model, prompt_ids: list[int], ids: list[int], temperature: float, top_p: float) -> list[float]:
    """log of each token's probability after temperature and top-p (renormalised), from a forward pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + ids])).logits[0].float()
    probs = torch.softmax(logits[len(prompt_ids) - 1 : -1] / temperature, dim=-1)
    out = []
    for row, token in zip(probs, ids, strict=True):
        ordered, order = torch.sort(row, descending=True)
        keep = (ordered.cumsum(0) - ordered) <= top_p
        kept = set(order[keep].tolist())
        assert token in kept  # a token top-p dropped cannot have been sampled
        out.append(math.log(row[token].item() / ordered[keep].sum().item()))
    return out


def test_sampled_tokens_carry_log_softmax_at_the_temperature(tiny_engine, ref_model):
    out = chat(tiny_engine.urls[0], ENGINE_KEY, max_tokens=16, temperature=0.7, seed=3, ignore_eos=True)
    choice = out["choices"][0]
    ids, prompt = choice["token_ids"], out["prompt_token_ids"]
    behaviour = choice["behaviour_logprobs"]
    assert len(behaviour) == len(ids) == 16
    assert behaviour == pytest.approx(reference_logprobs(ref_model, prompt, ids, temperature=0.7), abs=TOL)
    raw = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert raw == pytest.approx(reference_logprobs(ref_model, prompt, ids), abs=TOL)
    assert max(abs(a - b) for a, b in zip(raw, behaviour, strict=True)) > 100 * TOL  # two different things


def test_top_p_renormalises_what_was_kept(tiny_engine, ref_model):
    out = chat(tiny_engine.urls[0], ENGINE_KEY, max_tokens=16, temperature=1.3, top_p=0.6, seed=5, ignore_eos=True)
    choice = out["choices"][0]
    expected = top_p_logprobs(ref_model, out["prompt_token_ids"], choice["token_ids"], 1.3, 0.6)
    assert choice["behaviour_logprobs"] == pytest.approx(expected, abs=TOL)


def test_greedy_and_forced_tokens_had_probability_one(tiny_engine):
    out = chat(tiny_engine.urls[0], ENGINE_KEY, max_tokens=6, temperature=0, ignore_eos=True)
    assert out["choices"][0]["behaviour_logprobs"] == [0.0] * 6


def test_the_gateway_records_both_and_strips_the_extra_field(gateway, ref_model):
    fields = {"max_tokens": 12, "temperature": 0.8, "seed": 11, "ignore_eos": True}
    out = chat(gateway.base_url, TOKEN, **fields, return_token_ids=False)
    assert "behaviour_logprobs" not in out["choices"][0]  # an extra of the token-id dialect, like token_ids
    gateway.flush()
    (call,) = [c for c in gateway.store.query_llm_calls(production=True) if c.call_id == out["id"]]
    expected = reference_logprobs(ref_model, list(call.prompt_ids), list(call.response_ids), temperature=0.8)
    assert list(call.behaviour_logprobs) == pytest.approx(expected, abs=TOL)
    raw = reference_logprobs(ref_model, list(call.prompt_ids), list(call.response_ids))
    assert list(call.response_logprobs) == pytest.approx(raw, abs=TOL)


def test_a_streamed_call_records_the_same_behaviour_logprobs(gateway):
    fields = {"max_tokens": 10, "temperature": 0.9, "seed": 2, "ignore_eos": True}
    plain = chat(gateway.base_url, TOKEN, **fields)
    body = {"model": "m", "messages": MESSAGES, "stream": True, **fields}
    with httpx.stream(
        "POST", f"{gateway.base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
    ) as response:
        assert response.status_code == 200
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert all("behaviour_logprobs" not in c for chunk in chunks for c in chunk["choices"])
    gateway.flush()
    calls = {c.call_id: c for c in gateway.store.query_llm_calls(production=True)}
    streamed, unstreamed = calls[chunks[0]["id"]], calls[plain["id"]]
    assert list(streamed.response_ids) == list(unstreamed.response_ids)
    assert list(streamed.behaviour_logprobs) == pytest.approx(list(unstreamed.behaviour_logprobs), abs=TOL)


def test_an_engine_of_behaviour_logprobs_only_records_them_as_such(tmp_path):
    """vLLM in processed_logprobs mode answers one kind: its ``logprobs`` are the behaviour ones."""
    from agl.capture.writer import BufferedWriter
    from agl.store.sqlite import SqliteStore
    from agl_trainer.gateway.recorder import CallMeta, ChoiceTokens, Recorder

    with SqliteStore(tmp_path / "store.db") as store:
        writer = BufferedWriter(store)
        for kind, call_id in (("behaviour", "c-processed"), ("raw", "c-raw")):
            meta = CallMeta(call_id, None, [0], "chat.completions", "m", {})
            choice = ChoiceTokens(0, [5, 6], [-0.5, -1.5])
            Recorder(writer, kind).record(meta, [1, 2], [choice], {"id": call_id})
        writer.flush()
        calls = {c.call_id: c for c in store.query_llm_calls(production=True)}
    assert calls["c-processed"].response_logprobs is None
    assert list(calls["c-processed"].behaviour_logprobs) == [-0.5, -1.5]
    assert list(calls["c-raw"].response_logprobs) == [-0.5, -1.5]
    assert calls["c-raw"].behaviour_logprobs is None
