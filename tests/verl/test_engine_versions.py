"""Weight swaps in the transformers engine: full weights, state dicts and LoRA adapters."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
import torch

from agl.schema import ModelVersion
from tests.verl.conftest import reference_logprobs

TOL = 1e-4
MESSAGES = [{"role": "user", "content": "hello world ! how are you ?"}]


@pytest.fixture
def engine(tiny_model_dir):
    from agl_verl.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_dir, max_batch_size=8, max_model_len=1024, version="v0")
    engine.start()
    yield engine
    engine.stop()


def ask(url: str, max_tokens: int = 8) -> dict:
    body = {
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": True,
        "return_token_ids": True,
    }
    response = httpx.post(url + "/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def logprobs_of(out: dict) -> list[float]:
    return [e["logprob"] for e in out["choices"][0]["logprobs"]["content"]]


def perturbed(model_dir, seed: int):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.5)
    return model


def test_state_dict_version_swaps_weights(engine, tiny_model_dir, tmp_path):
    url = engine.urls[0]
    before = ask(url)
    assert before["model_version"] == "v0" and engine.model_version == "v0"
    new = perturbed(tiny_model_dir, 1)
    torch.save(new.state_dict(), tmp_path / "step1.pt")
    engine.load_version(ModelVersion(version="v1", path=str(tmp_path / "step1.pt")))
    after = ask(url)
    assert engine.model_version == "v1" and after["model_version"] == "v1"
    assert logprobs_of(after) != pytest.approx(logprobs_of(before), abs=TOL)
    expected = reference_logprobs(new, after["prompt_token_ids"], after["choices"][0]["token_ids"])
    assert logprobs_of(after) == pytest.approx(expected, abs=TOL)
    models = httpx.get(url + "/models", timeout=10).json()
    assert models["data"][0]["model_version"] == "v1"


def test_model_directory_version(engine, tiny_model_dir, tmp_path):
    new = perturbed(tiny_model_dir, 2)
    new.save_pretrained(tmp_path / "ckpt")
    engine.load_version(ModelVersion(version="dir-1", path=str(tmp_path / "ckpt")))
    out = ask(engine.urls[0])
    assert out["model_version"] == "dir-1"
    expected = reference_logprobs(new, out["prompt_token_ids"], out["choices"][0]["token_ids"])
    assert logprobs_of(out) == pytest.approx(expected, abs=TOL)


def test_lora_adapter_version(engine, tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft_model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    peft_model.save_pretrained(tmp_path / "adapter")
    engine.load_version(ModelVersion(version="lora-1", path=str(tmp_path / "adapter"), base_model=str(tiny_model_dir)))
    out = ask(engine.urls[0])
    assert out["model_version"] == "lora-1"
    expected = reference_logprobs(peft_model.eval(), out["prompt_token_ids"], out["choices"][0]["token_ids"])
    assert logprobs_of(out) == pytest.approx(expected, abs=TOL)


def test_requests_in_flight_survive_a_swap(engine, tiny_model_dir, tmp_path):
    new = perturbed(tiny_model_dir, 3)
    torch.save(new.state_dict(), tmp_path / "step3.pt")
    url = engine.urls[0]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        early = [pool.submit(ask, url, 200) for _ in range(6)]
        engine.load_version(ModelVersion(version="v3", path=str(tmp_path / "step3.pt")))
        late = [pool.submit(ask, url, 20) for _ in range(6)]
        results = [f.result(timeout=120) for f in early + late]
    assert all(r["choices"][0]["finish_reason"] == "length" for r in results)
    assert {r["model_version"] for r in results[6:]} == {"v3"}
    # each answer came wholly from the weights it names
    from transformers import AutoModelForCausalLM

    old = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    for r in results:
        model = new if r["model_version"] == "v3" else old
        ids = r["choices"][0]["token_ids"]
        assert logprobs_of(r) == pytest.approx(reference_logprobs(model, r["prompt_token_ids"], ids), abs=TOL)


def test_bad_versions_are_refused_and_the_old_weights_stay(engine, tmp_path):
    with pytest.raises(FileNotFoundError, match="version.path"):
        engine.load_version(ModelVersion(version="x", path=str(tmp_path / "missing.pt")))
    torch.save({"not.a.weight": torch.zeros(1)}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="version.path"):
        engine.load_version(ModelVersion(version="x", path=str(tmp_path / "bad.pt")))
    assert engine.model_version == "v0"
    assert ask(engine.urls[0])["model_version"] == "v0"
