"""What the learner benchmarks share: the bundled SmolLM2-135M-Instruct, its ordinary token ids, and
a local learner with the examples' LoRA adapter at their temperature."""

from __future__ import annotations

from pathlib import Path

LORA = {"r": 16, "alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
"""The examples' adapter (``examples/learner.py``)."""


def smollm2_vocab(model_dir: Path) -> list[int]:
    """The model's token ids, special ones left out: what random prompts and responses are drawn from."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return sorted(set(tokenizer.get_vocab().values()) - set(tokenizer.all_special_ids))


def lora_backend(model_dir: Path, workdir: Path | str, micro: int, **settings):
    """A set-up local learner as the examples run it (lr 3e-4, temperature 0.5, so old log-probs
    come from the policy, not the engine), with ``settings`` on top."""
    from agl_verl.backend import VerlBackend

    backend = VerlBackend(
        model_path=str(model_dir),
        lr=3e-4,
        micro_batch_size=micro,
        seed=0,
        workdir=str(workdir),
        temperature=0.5,
        lora=dict(LORA),
        **settings,
    )
    backend.setup(None)
    return backend
