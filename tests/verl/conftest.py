"""Fixtures for the agl-verl engine tests: a tiny model (fast) and SmolLM2 (slow), one of each per session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY_CORPUS = [
    "what is 12 + 34 ? the answer is 46 .",
    "the weather in paris is sunny today , said the assistant .",
    "call the add tool with a = 2 and b = 3 , then report the sum .",
    "hello world ! how are you ? fine , thanks .",
]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from agl_verl.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TINY_CORPUS, vocab_size=200, seed=0)


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir):
    from agl_verl.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_dir, max_batch_size=32, max_model_len=1024, api_key="engine-secret")
    engine.start()
    yield engine
    engine.stop()


TINY_LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def tiny_run_config(model_dir, tmp_path, *, backend: dict, concurrency: int, **run) -> dict:
    """A trainer config of a short run on the tiny model: the transformers engine, the verl backend with a
    LoRA adapter (``backend``: its settings over the model and workdir), no plots, no validation before."""
    return {
        "workdir": str(tmp_path / "run"),
        "store": f"sqlite:///{tmp_path / 'agl.db'}",
        "progress": False,
        "plot": False,
        "val_before": False,
        "rollout": {"concurrency": concurrency, "max_response_tokens": 6},
        "engine": {"name": "transformers", "config": {"model_path": str(model_dir), "max_model_len": 1024}},
        "backend": {
            "name": "verl",
            "config": {"model_path": str(model_dir), "workdir": str(tmp_path / "verl"), "lora": TINY_LORA, **backend},
        },
        **run,
    }


GATEWAY_TOKEN = "gateway-token"
"""The production token of :func:`tiny_gateway`."""


@pytest.fixture(scope="module")
def tiny_gateway(tiny_engine, tmp_path_factory):
    """A real gateway (SQLite store) in front of :func:`tiny_engine`, taking :data:`GATEWAY_TOKEN`."""
    from agl.store.sqlite import SqliteStore
    from agl_trainer.gateway import Gateway

    with (
        SqliteStore(tmp_path_factory.mktemp("store") / "store.db") as store,
        Gateway(store, [tiny_engine.urls[0]], token=GATEWAY_TOKEN, upstream_api_key="engine-secret") as gw,
    ):
        yield gw


@pytest.fixture(scope="session")
def smollm2_path():
    from agl_verl.models import smollm2_dir

    return smollm2_dir()


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_path):
    from agl_verl.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine(smollm2_path, max_batch_size=16)
    engine.start()
    yield engine
    engine.stop()


def reference_logprobs(model, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0) -> list[float]:
    """Logprobs of ``response_ids`` after ``prompt_ids`` from one fp32 forward pass, as training computes
    them: ``log_softmax(logits / temperature)`` at each response token."""
    import torch

    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt_ids) - 1 : -1] / temperature, dim=-1)
    return logp.gather(1, torch.tensor(response_ids).unsqueeze(1)).squeeze(1).tolist()
