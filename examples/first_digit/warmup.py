"""A format-only warm-up for the tiny model, before any reinforcement learning.

A randomly initialised model almost never answers with a digit, so every reward
in a group is 0 and GRPO has nothing to learn from. A few supervised steps nudge
it towards the *format* (a digit, then end of turn) on answers drawn at random,
which carry no information about which digit is right: after the warm-up its
sampled answers are right a few times in a hundred, its greedy answer never.
Reading the first digit is left to reinforcement learning. The warm-up is kept
short on purpose: a model drilled longer on random answers learns to ignore its
input, and RL then barely moves it.
"""

from __future__ import annotations

import random
from pathlib import Path


def warm_up(model_dir: Path, out_dir: Path, prompts: list[list[dict]], *, steps: int = 8, seed: int = 0) -> Path:
    """Teach ``model_dir`` to answer ``prompts`` with one random digit; save to ``out_dir``."""
    if (out_dir / "config.json").exists():
        return out_dir
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.train()
    for _ in range(steps):
        rows, masks = [], []
        for messages in rng.sample(prompts, k=min(32, len(prompts))):
            encoded = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=True
            )
            prompt = list(encoded["input_ids"])
            answer = tokenizer.encode(str(rng.randrange(10)), add_special_tokens=False) + [end]
            rows.append(prompt + answer)
            masks.append([0] * len(prompt) + [1] * len(answer))
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [end] * (width - len(r)) for r in rows])
        target_mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.bool)
        attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        labels = ids[:, 1:].masked_fill(~target_mask[:, 1:], -100)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
