"""Continuous batching: rows join and leave the running batch at every step, with exact logprobs."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest

from tests.verl.conftest import reference_logprobs

TOL = 1e-4


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from agl_verl.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_dir, max_batch_size=8, max_model_len=1024)
    engine.start()
    yield engine
    engine.stop()


def ask(url: str, content: str, max_tokens: int) -> dict:
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": True,
        "return_token_ids": True,
    }
    response = httpx.post(url + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def tokens_and_logprobs(out: dict) -> tuple[list[int], list[float]]:
    choice = out["choices"][0]
    return choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]


def wait_for(condition, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.005)


def test_short_request_joins_and_leaves_a_running_long_one(engine, tiny_model_dir):
    url, batcher = engine.urls[0], engine.batchers[0]
    long_prompt = "the weather in paris is sunny today , said the assistant ."
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        long_started = time.monotonic()
        long = pool.submit(ask, url, long_prompt, 200)
        wait_for(lambda: batcher.running_rows == 1, timeout=5)
        time.sleep(0.2)  # the long row is well into decoding, its cache wider than the new prompt
        started = time.monotonic()
        short = ask(url, "hi", 5)
        short_s = time.monotonic() - started
        assert not long.done(), "the short request waited for the long one"
        long_out = long.result(timeout=60)
        long_s = time.monotonic() - long_started
    # with waves the short request would wait for the whole long one
    assert short_s < long_s / 2
    # both rows decode exactly as alone, and their logprobs are a training forward pass's
    assert tokens_and_logprobs(short)[0] == tokens_and_logprobs(ask(url, "hi", 5))[0]
    assert tokens_and_logprobs(long_out)[0] == tokens_and_logprobs(ask(url, long_prompt, 200))[0]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    for out in (short, long_out):
        ids, logprobs = tokens_and_logprobs(out)
        assert logprobs == pytest.approx(reference_logprobs(model, out["prompt_token_ids"], ids), abs=TOL)


def test_staggered_requests_keep_exact_logprobs(engine, tiny_model_dir):
    """Rows of many lengths join at different steps and leave at different steps."""
    url = engine.urls[0]
    prompts = [("hello world !", 40), ("what is 12 + 34 ?", 7), ("call the add tool", 25), ("fine", 1)] * 2
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = []
        for content, max_tokens in prompts:
            futures.append(pool.submit(ask, url, content, max_tokens))
            time.sleep(0.03)
        outs = [f.result(timeout=60) for f in futures]
    wait_for(lambda: engine.batchers[0].running_rows == 0, timeout=1)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    for out, (_, max_tokens) in zip(outs, prompts, strict=True):
        ids, logprobs = tokens_and_logprobs(out)
        assert len(ids) == max_tokens
        assert logprobs == pytest.approx(reference_logprobs(model, out["prompt_token_ids"], ids), abs=TOL)


def test_a_failed_prefill_fails_only_its_newcomers(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from agl_verl.engines.batching import Batcher, SamplingParams, Sequence, WeightSlot

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()

    def flaky(input_ids, **kwargs):
        if input_ids.shape[1] > 1 and bool((input_ids == 7).any()):
            raise ValueError("prefill failed")
        return model(input_ids=input_ids, **kwargs)

    batcher = Batcher(WeightSlot(flaky, "v0"), None, eos_token_ids=[], pad_token_id=0, max_model_len=1024)
    try:
        running = batcher.submit([Sequence(prompt_ids=[3, 4, 5], params=SamplingParams(max_tokens=200))])
        wait_for(lambda: batcher.running_rows == 1, timeout=5)
        doomed = batcher.submit([Sequence(prompt_ids=[6, 7], params=SamplingParams(max_tokens=5))])
        with pytest.raises(ValueError, match="prefill failed"):
            doomed.result(timeout=10)
        (row,) = running.result(timeout=30)
        assert row.finish_reason == "length" and len(row.token_ids) == 200
        wait_for(lambda: batcher.running_rows == 0, timeout=1)
    finally:
        batcher.close()
