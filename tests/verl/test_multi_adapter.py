"""Several policies on one base model in the transformers engine (mixed mode): rows of different
LoRA adapters decoded in the same batch give what each adapter gives served alone (merged)."""

from __future__ import annotations

import concurrent.futures
import json
import re
import time

import httpx
import pytest
import torch

from agl.schema import ModelVersion
from agl_verl.engines.prefix_cache import BLOCK_TOKENS

TOL = 1e-4
"""Log-prob tolerance (absolute): an adapter applied unmerged (x·W + x·A·B) rounds differently
from the same adapter merged into W, by about 1e-6 in float32."""

DEFAULT = "tiny"
"""The served model name: requests for it (or any name no policy has) go to the default policy."""

PROMPTS = [
    [(5 * i + 7) % 190 + 5 for i in range(3 * BLOCK_TOKENS + 2)],
    [11, 12, 13, 14],
    [40, 41, 42, 43, 44, 45, 46, 47, 48],
]


def make_adapter(model_dir, path, seed: int) -> str:
    """A random LoRA adapter with non-zero B (so it changes the outputs), saved at ``path``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {name: make_adapter(tiny_model_dir, root / name, seed) for name, seed in (("a", 1), ("b", 2), ("c", 3))}


def engine_on(model_dir, adapter: str | None = None, **kwargs):
    """A started engine serving ``adapter`` (merged) as its one default policy, or the base model."""
    from agl_verl.engines.transformers_engine import TransformersEngine

    options = {"max_batch_size": 16, "max_model_len": 1024, "served_model_name": DEFAULT, "prefix_cache_mb": 64}
    engine = TransformersEngine(model_dir, **{**options, **kwargs})
    engine.start()
    if adapter is not None:
        engine.load_version(ModelVersion(version="alone", path=adapter))
    return engine


@pytest.fixture(scope="module")
def alone(tiny_model_dir, adapters):
    """Reference engines: each adapter merged as the only policy, and the plain base model."""
    engines = {name: engine_on(tiny_model_dir, path) for name, path in adapters.items()}
    engines["base"] = engine_on(tiny_model_dir)
    yield engines
    for engine in engines.values():
        engine.stop()


@pytest.fixture(scope="module")
def mixed(tiny_model_dir, adapters):
    """The default policy on adapter a, policy ``writer`` on b, policy ``checker`` frozen at the base."""
    engine = engine_on(tiny_model_dir, batch_wait_ms=300)
    engine.load_version(ModelVersion(version="a-1", path=adapters["a"]))
    engine.load_version(ModelVersion(version="b-1", path=adapters["b"], policy="writer"))
    engine.load_version(ModelVersion(version="frozen", path=None, policy="checker"))
    yield engine
    engine.stop()


def complete(url: str, model: str, prompt: list[int], *, max_tokens: int = 8, seed: int | None = None) -> dict:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0 if seed is None else 1.0,
        "ignore_eos": True,
        "logprobs": 0,
        "return_token_ids": True,
    }
    if seed is not None:
        body["seed"] = seed
    response = httpx.post(url + "/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def ids_and_logprobs(answer: dict) -> tuple[list[int], list[float]]:
    choice = answer["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def assert_same(got: dict, want: dict) -> None:
    tokens, logprobs = ids_and_logprobs(got)
    want_tokens, want_logprobs = ids_and_logprobs(want)
    assert tokens == want_tokens
    assert logprobs == pytest.approx(want_logprobs, abs=TOL)


ROUTES = {DEFAULT: "a", "writer": "b", "checker": "base", "no-such-policy": "a"}
"""Which reference engine each model name of :func:`mixed` must agree with."""


def test_one_batch_of_mixed_adapters_matches_each_adapter_alone(mixed, alone):
    requests = [
        {"model": model, "prompt": prompt, "seed": seed} for model in ROUTES for prompt in PROMPTS for seed in (None, 7)
    ]
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        with mixed.adapters.lock:  # no forward pass until every request waits in the queue
            pending = [pool.submit(complete, mixed.urls[0], **kw) for kw in requests]
            time.sleep(1.0)
        got = [future.result(timeout=120) for future in pending]
    assert mixed.adapters.mixed_passes > 0  # rows of different policies went through the same passes
    assert mixed.batchers[0].max_rows_seen >= len(ROUTES)
    for request, answer in zip(requests, got, strict=True):
        reference = alone[ROUTES[request["model"]]]
        assert_same(answer, complete(reference.urls[0], DEFAULT, request["prompt"], seed=request["seed"]))
    versions = {request["model"]: answer["model_version"] for request, answer in zip(requests, got, strict=True)}
    assert versions == {DEFAULT: "a-1", "writer": "b-1", "checker": "frozen", "no-such-policy": "a-1"}
    first = {}  # each model's first answer: the longest prompt, greedy
    for request, answer in zip(requests, got, strict=True):
        first.setdefault(request["model"], ids_and_logprobs(answer)[1])
    for one, other in (("writer", DEFAULT), ("checker", DEFAULT), ("checker", "writer")):
        assert first[one] != pytest.approx(first[other], abs=0.01)  # the adapters differ: the test could fail


def test_models_lists_every_policy_with_its_version(mixed):
    listed = httpx.get(mixed.urls[0] + "/models", timeout=10).json()["data"]
    assert [(m["id"], m["model_version"]) for m in listed] == [
        (DEFAULT, "a-1"),
        ("writer", "b-1"),
        ("checker", "frozen"),
    ]
    assert mixed.model_version == "a-1"
    assert mixed.policy_model("writer") == "writer"


def test_prefix_cache_keeps_adapters_apart(mixed, alone):
    prompt = [(3 * i + 1) % 190 + 5 for i in range(4 * BLOCK_TOKENS + 1)]
    start = mixed.counters()
    assert_same(complete(mixed.urls[0], DEFAULT, prompt), complete(alone["a"].urls[0], DEFAULT, prompt))
    after_a = mixed.counters()
    assert after_a["prompt_tokens_computed"] - start["prompt_tokens_computed"] == len(prompt)
    # the same prompt on another adapter finds none of a's blocks, and answers as b does
    assert_same(complete(mixed.urls[0], "writer", prompt), complete(alone["b"].urls[0], DEFAULT, prompt))
    after_b = mixed.counters()
    assert after_b["prompt_tokens_computed"] - after_a["prompt_tokens_computed"] == len(prompt)
    assert after_b["prompt_tokens_cached"] == after_a["prompt_tokens_cached"]
    # b's own blocks are found the second time
    assert_same(complete(mixed.urls[0], "writer", prompt), complete(alone["b"].urls[0], DEFAULT, prompt))
    again = mixed.counters()
    assert again["prompt_tokens_cached"] - after_b["prompt_tokens_cached"] == 4 * BLOCK_TOKENS
    assert again["generated_tokens"] - start["generated_tokens"] == 3 * 8


def test_a_new_version_leaves_requests_in_flight_on_their_adapter(tiny_model_dir, adapters, alone):
    engine = engine_on(tiny_model_dir, prefix_cache_mb=0)
    try:
        engine.load_version(ModelVersion(version="b-1", path=adapters["b"], policy="writer"))
        loaded = set(engine.adapters.adapters)
        prompt = PROMPTS[1]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            early = pool.submit(complete, engine.urls[0], "writer", prompt, max_tokens=300)
            while engine.batchers[0].running_rows == 0 and not early.done():
                time.sleep(0.001)
            with engine.adapters.lock:  # decoding waits while the new version loads
                assert engine.batchers[0].running_rows == 1
                engine.load_version(ModelVersion(version="b-2", path=adapters["c"], policy="writer"))
            assert len(engine.adapters.adapters) == 2  # b-1 stays while its row runs
            late = complete(engine.urls[0], "writer", prompt)
            early = early.result(timeout=120)
        assert early["model_version"] == "b-1" and late["model_version"] == "b-2"
        assert_same(early, complete(alone["b"].urls[0], DEFAULT, prompt, max_tokens=300))
        assert_same(late, complete(alone["c"].urls[0], DEFAULT, prompt))
        assert set(engine.adapters.adapters).isdisjoint(loaded)  # b-1's adapter is gone once unused
        assert len(engine.adapters.adapters) == 1
    finally:
        engine.stop()


def test_base_weights_policy_matches_the_plain_engine(tiny_model_dir, alone):
    engine = engine_on(tiny_model_dir)
    try:
        engine.load_version(ModelVersion(version="frozen", policy="checker"))
        for prompt in PROMPTS:
            for model in ("checker", DEFAULT):
                assert_same(complete(engine.urls[0], model, prompt), complete(alone["base"].urls[0], DEFAULT, prompt))
    finally:
        engine.stop()


def test_a_full_model_default_policy_refuses_named_policies(tiny_model_dir, adapters, tmp_path):
    from transformers import AutoModelForCausalLM

    engine = engine_on(tiny_model_dir)
    try:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        torch.save(model.state_dict(), tmp_path / "step1.pt")
        engine.load_version(ModelVersion(version="full-1", path=str(tmp_path / "step1.pt")))
        with pytest.raises(ValueError, match=rf"version.path: {re.escape(adapters['b'])} .*full model or state dict"):
            engine.load_version(ModelVersion(version="b-1", path=adapters["b"], policy="writer"))
        with pytest.raises(ValueError, match=r"version.path: .*step1.pt is a full model or state dict"):
            engine.load_version(ModelVersion(version="w", path=str(tmp_path / "step1.pt"), policy="writer"))
        assert engine.adapters is None and engine.model_version == "full-1"
        assert complete(engine.urls[0], "writer", PROMPTS[1])["model_version"] == "full-1"
    finally:
        engine.stop()


def test_replicas_share_the_adapters_and_a_policy_moves_back_to_the_base(tiny_model_dir, adapters, alone):
    engine = engine_on(tiny_model_dir, replicas=2)
    try:
        engine.load_version(ModelVersion(version="w-1", path=adapters["a"], policy="writer"))
        engine.load_version(ModelVersion(version="w-2", policy="writer"))  # frozen at the base from now on
        assert len(engine.adapters.adapters) == 1  # peft keeps its last adapter, unused
        assert_same(
            complete(engine.urls[1], "writer", PROMPTS[0]), complete(alone["base"].urls[0], DEFAULT, PROMPTS[0])
        )
        engine.load_version(ModelVersion(version="w-3", path=adapters["b"], policy="writer"))
        assert len(engine.adapters.adapters) == 1  # the unused one went when b came
        requests = [(engine.urls[i % 2], ("writer", DEFAULT)[i % 2], PROMPTS[i % 3]) for i in range(12)]
        with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
            got = list(pool.map(lambda r: complete(*r, max_tokens=20), requests))
        for (_, model, prompt), answer in zip(requests, got, strict=True):
            reference = alone["b" if model == "writer" else "base"]
            assert_same(answer, complete(reference.urls[0], DEFAULT, prompt, max_tokens=20))
            assert answer["model_version"] == ("w-3" if model == "writer" else "base")
    finally:
        engine.stop()


def test_a_stream_names_its_policys_version_and_decodes_on_its_adapter(mixed, alone):
    body = {"model": "writer", "messages": [{"role": "user", "content": "hello world !"}], "max_tokens": 6}
    body |= {"temperature": 0, "ignore_eos": True, "stream": True, "return_token_ids": True}
    chunks = []
    with httpx.stream("POST", mixed.urls[0] + "/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line.removeprefix("data: ")))
    assert {chunk["model_version"] for chunk in chunks} == {"b-1"}
    streamed = [t for chunk in chunks for choice in chunk["choices"] for t in choice.get("token_ids", [])]
    reference = httpx.post(alone["b"].urls[0] + "/chat/completions", json={**body, "stream": False}, timeout=120)
    assert streamed == reference.json()["choices"][0]["token_ids"]
