"""Continuous batching: rows join and leave the running batch at every step, with exact logprobs."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import pytest

from tests.conftest import wait_until
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


class GatedForward:
    """The served model, paused after its ``pause_after``-th one-row decode step until released.

    It records the rows of every forward pass, so a test reads the batch's history from the
    model's point of view rather than from the clock.
    """

    def __init__(self, model, pause_after: int) -> None:
        self.model, self.pause_after = model, pause_after
        self.passes: list[tuple[int, int]] = []  # (rows, tokens fed per row)
        self.lone_decodes = 0
        self.paused, self.release = threading.Event(), threading.Event()

    def __call__(self, **kwargs):
        rows, width = kwargs["input_ids"].shape
        self.passes.append((rows, width))
        self.lone_decodes += (rows, width) == (1, 1)
        if self.lone_decodes == self.pause_after:
            self.paused.set()
            assert self.release.wait(timeout=30), "the test never released the model"
        return self.model(**kwargs)


def test_short_request_joins_and_leaves_a_running_long_one(engine, tiny_model_dir):
    url, batcher = engine.urls[0], engine.batchers[0]
    long_prompt = "the weather in paris is sunny today , said the assistant ."
    wait_until(lambda: batcher.running_rows == 0, "no row runs", 5)
    model, version = batcher.slot.get()
    gate = GatedForward(model, pause_after=20)
    batcher.slot.set(gate, version)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            long = pool.submit(ask, url, long_prompt, 200)
            assert gate.paused.wait(timeout=30), "the long request never started decoding"
            short = pool.submit(ask, url, "hi", 5)
            wait_until(lambda: batcher.queued_rows == 1, "one row is queued", 10)
            gate.release.set()
            short, long_out = short.result(timeout=60), long.result(timeout=60)
    finally:
        gate.release.set()
        batcher.slot.set(model, version)
    decode_rows = [rows for rows, width in gate.passes if width == 1]
    prefills = [rows for rows, width in gate.passes if width > 1]
    # the long row decoded alone, the short one was prefilled into it after 20 steps, the two
    # decoded together for the short one's 4 further tokens, and the long one went on alone
    assert len(prefills) == 2
    assert decode_rows == [1] * 20 + [2] * 4 + [1] * (199 - 24)
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
    wait_until(lambda: engine.batchers[0].running_rows == 0, "no row runs")
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
        wait_until(lambda: batcher.running_rows == 1, "one row runs", 5)
        doomed = batcher.submit([Sequence(prompt_ids=[6, 7], params=SamplingParams(max_tokens=5))])
        with pytest.raises(ValueError, match="prefill failed"):
            doomed.result(timeout=10)
        (row,) = running.result(timeout=30)
        assert row.finish_reason == "length" and len(row.token_ids) == 200
        wait_until(lambda: batcher.running_rows == 0, "no row runs")
    finally:
        batcher.close()
