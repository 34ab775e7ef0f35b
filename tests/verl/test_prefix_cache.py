"""Prefix caching in the transformers engine: the same tokens and logprobs as computing every
prompt whole, with fewer prompt tokens computed."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
import torch

from agl_verl.engines.prefix_cache import BLOCK_TOKENS, PrefixCache, shared_blocks
from tests.verl.conftest import reference_logprobs

TOL = 1e-4
SHARED = [(7 * i + 3) % 190 + 5 for i in range(5 * BLOCK_TOKENS + 3)]
"""A long beginning every prompt below shares, as a system message and tool schemas are."""


def prompts() -> list[list[int]]:
    """Prompts with a shared beginning, different endings and repeats (a GRPO group)."""
    endings = [[11, 12, 13], [21, 22, 23, 24, 25, 26, 27], list(range(30, 30 + 2 * BLOCK_TOKENS + 1)), [11, 12, 13]]
    return [SHARED + ending for ending in endings] + [SHARED[:BLOCK_TOKENS], [9, 8, 7]]


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    from agl_verl.engines.transformers_engine import TransformersEngine

    cached = TransformersEngine(tiny_model_dir, max_batch_size=16, max_model_len=1024, prefix_cache_mb=64)
    whole = TransformersEngine(tiny_model_dir, max_batch_size=16, max_model_len=1024, prefix_cache_mb=0)
    cached.start()
    whole.start()
    yield cached, whole
    cached.stop()
    whole.stop()


def complete(url: str, prompt: list[int], *, n: int = 1, seed: int | None = None, temperature: float = 0.0) -> list:
    body = {
        "prompt": prompt,
        "max_tokens": 6,
        "temperature": temperature,
        "n": n,
        "ignore_eos": True,
        "logprobs": 0,
        "return_token_ids": True,
    }
    if seed is not None:
        body["seed"] = seed
    response = httpx.post(url + "/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return [(c["token_ids"], c["logprobs"]["token_logprobs"]) for c in response.json()["choices"]]


def all_at_once(url: str, requests: list[dict]) -> list:
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda kw: complete(url, **kw), requests))


def test_same_tokens_and_logprobs_as_computing_every_prompt_whole(engines):
    cached, whole = engines
    requests = [{"prompt": p, "n": 3, "seed": 40 + i, "temperature": 1.0} for i, p in enumerate(prompts())]
    requests += [{"prompt": p} for p in prompts()]
    for _round in range(2):  # the second round finds every prompt's blocks cached
        got = all_at_once(cached.urls[0], requests)
        want = all_at_once(whole.urls[0], requests)
        for mine, theirs in zip(got, want, strict=True):
            for (tokens, logprobs), (want_tokens, want_logprobs) in zip(mine, theirs, strict=True):
                assert tokens == want_tokens
                assert logprobs == pytest.approx(want_logprobs, abs=TOL)


def test_logprobs_match_a_training_forward_pass_after_a_cache_hit(engines, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    cached, _ = engines
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompt = SHARED + [40, 41, 42]
    complete(cached.urls[0], SHARED + [50])  # leaves SHARED's blocks in the cache
    before = cached.counters()
    [(tokens, logprobs)] = complete(cached.urls[0], prompt)
    after = cached.counters()
    assert after["prompt_tokens_cached"] - before["prompt_tokens_cached"] == 5 * BLOCK_TOKENS
    assert logprobs == pytest.approx(reference_logprobs(model, prompt, tokens), abs=TOL)


def test_counters_show_a_group_computed_once_and_the_shared_beginning_reused(tiny_model_dir):
    from agl_verl.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_dir, max_batch_size=16, max_model_len=1024, prefix_cache_mb=64)
    engine.start()
    try:
        first = SHARED + [11, 12, 13]
        complete(engine.urls[0], first, n=8, temperature=1.0, seed=1)
        group = engine.counters()
        assert group["prompt_tokens"] == 8 * len(first)
        assert group["prompt_tokens_computed"] == len(first)  # one row computed for the eight
        complete(engine.urls[0], SHARED + [60, 61], n=8, temperature=1.0, seed=2)
        second = engine.counters()
        computed = second["prompt_tokens_computed"] - group["prompt_tokens_computed"]
        assert computed == len(SHARED) + 2 - 5 * BLOCK_TOKENS  # all but the shared whole blocks
        assert second["prompt_tokens_cached"] == second["prompt_tokens"] - second["prompt_tokens_computed"]
        assert second["generated_tokens"] == 16 * 6
    finally:
        engine.stop()


def test_prompts_sharing_uncached_blocks_arrive_together_and_compute_them_once(tiny_model_dir):
    from agl_verl.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine(
        tiny_model_dir, max_batch_size=16, max_model_len=1024, prefix_cache_mb=64, batch_wait_ms=500
    )
    engine.start()
    try:
        endings = [[11, 12], [21, 22, 23], [31]]
        all_at_once(engine.urls[0], [{"prompt": SHARED + e} for e in endings])
        counts = engine.counters()
        assert engine.batchers[0].batches == 1  # one admission...
        assert counts["prompt_tokens_computed"] == len(SHARED) + 2 + 2 * (len(SHARED) - 5 * BLOCK_TOKENS) + 4
    finally:
        engine.stop()


def test_new_weights_drop_the_blocks_of_the_old(tiny_model_dir):
    from agl.schema import ModelVersion
    from agl_verl.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_dir, max_batch_size=4, max_model_len=1024, prefix_cache_mb=64)
    engine.start()
    try:
        prompt = SHARED + [11]
        complete(engine.urls[0], prompt)
        engine.load_version(ModelVersion(version="v1", path=str(tiny_model_dir)))
        before = engine.counters()["prompt_tokens_computed"]
        complete(engine.urls[0], prompt)
        assert engine.counters()["prompt_tokens_computed"] - before == len(prompt)
    finally:
        engine.stop()


def layers_for(tokens: list[int], n_layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys and values whose entries are the token ids, so a test can read which tokens a block holds."""
    k = torch.tensor(tokens, dtype=torch.float32).view(1, -1, 1).expand(2, -1, 4).clone()
    return [(k.clone(), -k.clone()) for _ in range(n_layers)]


def test_lookup_stops_at_the_first_miss_and_keeps_the_last_token_to_compute():
    cache = PrefixCache(2**20, block_tokens=4)
    prompt = list(range(12))
    cache.insert(prompt, layers_for(prompt), start=0)
    assert cache.blocks == 2  # 11 reusable tokens: two whole blocks; the third holds the last token
    assert len(cache.lookup(prompt)) == 2
    assert len(cache.lookup(list(range(8)) + [99, 9, 10, 11, 12])) == 2
    assert len(cache.lookup([0, 1, 2, 3, 99, 5, 6, 7, 8])) == 1
    assert len(cache.lookup([5, 1, 2, 3, 4, 5, 6, 7, 8])) == 0
    keys, values = cache.gather(cache.lookup(prompt), layer=1)
    assert keys[0, :, 0].tolist() == list(range(8))
    assert torch.equal(values, -keys)


def test_eviction_keeps_the_cache_within_bounds_and_drops_later_blocks_first():
    block_bytes = 2 * 2 * 2 * 4 * 4 * 4  # layers × (keys, values) × heads × tokens × dim × fp32
    cache = PrefixCache(3 * block_bytes, block_tokens=4)
    first = list(range(13))
    cache.insert(first, layers_for(first), start=0)
    assert cache.blocks == 3 and cache.nbytes == 3 * block_bytes
    other = [50, 51, 52, 53, 54]
    cache.insert(other, layers_for(other), start=0)
    assert cache.nbytes <= cache.max_bytes and cache.evicted_blocks == 1
    assert len(cache.lookup(first)) == 2  # its last block went; its beginning stays reachable
    assert len(cache.lookup(other)) == 1


def test_new_weights_empty_the_cache_and_sizes_are_checked():
    cache = PrefixCache(2**20, block_tokens=4)
    cache.use("weights-a")
    cache.insert(list(range(9)), layers_for(list(range(9))), start=0)
    cache.use("weights-a")
    assert cache.blocks == 2
    cache.use("weights-b")
    assert cache.blocks == 0 and cache.nbytes == 0
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixCache(0)


def test_shared_blocks_counts_whole_blocks_the_first_prompt_could_reuse():
    assert shared_blocks(list(range(40)), list(range(40)), 16) == 2
    assert shared_blocks(list(range(33)), list(range(40)), 16) == 2
    assert shared_blocks(list(range(32)), list(range(40)), 16) == 1  # its last token is computed
    assert shared_blocks([1] + list(range(40)), list(range(40)), 16) == 0


def test_metrics_report_the_cache_hits_behind_the_token(tiny_model_dir):
    from agl_verl.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_dir, max_model_len=1024, prefix_cache_mb=64, api_key="engine-secret")
    engine.start()
    try:
        url = engine.urls[0].removesuffix("/v1")
        assert httpx.get(url + "/metrics", timeout=10).status_code == 401
        body = {"prompt": SHARED + [1], "max_tokens": 2, "n": 4, "temperature": 1.0, "ignore_eos": True}
        headers = {"Authorization": "Bearer engine-secret"}
        assert httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=60).status_code == 200
        text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
        values = dict(line.split() for line in text.splitlines() if not line.startswith("#"))
        assert values["agl_engine_prompt_tokens_total"] == str(4 * 84)
        assert values["agl_engine_prefix_cache_hit_tokens_total"] == str(3 * 84)
        assert values["agl_engine_generation_tokens_total"] == "8"
        assert values["agl_engine_prefix_cache_blocks"] == "5"
    finally:
        engine.stop()


def test_a_next_turn_finds_the_last_answer_cached(engines):
    cached, whole = engines
    first = SHARED[:44] + [77]  # 2 whole blocks, and a third once the 6-token answer is in
    [(answer, _)] = complete(cached.urls[0], first)
    assert complete(whole.urls[0], first)[0][0] == answer
    next_turn = first + answer + [5, 6, 7] + SHARED[: 2 * BLOCK_TOKENS]
    before = cached.counters()
    got = complete(cached.urls[0], next_turn)
    reused = cached.counters()["prompt_tokens_cached"] - before["prompt_tokens_cached"]
    assert reused == (len(first) + len(answer) - 1) // BLOCK_TOKENS * BLOCK_TOKENS  # past the first prompt
    assert reused > (len(first) - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    [(tokens, logprobs)] = complete(whole.urls[0], next_turn)
    assert got[0][0] == tokens
    assert got[0][1] == pytest.approx(logprobs, abs=TOL)
