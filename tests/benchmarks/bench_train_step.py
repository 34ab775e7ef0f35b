"""Training tokens/s of agl-verl's local backend against TRL's GRPOTrainer, same tiny model, same batch.

Both train on one fixed GRPO batch (8 prompts × 8 completions, fixed token ids and
rewards): TRL gets it through ``rollout_func`` so neither side generates, and the
timed part is the update (log-probs, GRPO advantages, clipped loss, backward, AdamW).

    .venv/bin/python -m tests.benchmarks.bench_train_step [--steps 10]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

PROMPTS, GROUP, PROMPT_LEN, RESPONSE_LEN = 8, 8, 32, 32


def fixed_batch(vocab: list[int], seed: int = 0):
    """(prompt ids per prompt, completion ids per sample, logprobs per sample, reward per sample)."""
    rng = random.Random(seed)
    prompts = [rng.choices(vocab, k=PROMPT_LEN) for _ in range(PROMPTS)]
    completions = [rng.choices(vocab, k=RESPONSE_LEN) for _ in range(PROMPTS * GROUP)]
    logprobs = [[-3.0] * RESPONSE_LEN for _ in completions]
    rewards = [float(rng.random() < 0.5) for _ in completions]
    return prompts, completions, logprobs, rewards


def bench_agl(model_dir: Path, batch, steps: int, workdir: Path) -> float:
    from agl.schema import Transition
    from agl_verl.backend import VerlBackend

    prompts, completions, logprobs, rewards = batch
    transitions = [
        Transition(
            rollout_id=f"r{i}",
            task_id=f"t{i // GROUP}",
            step=0,
            prompt_ids=prompts[i // GROUP],
            response_ids=c,
            response_logprobs=lp,
            reward=r,
        )
        for i, (c, lp, r) in enumerate(zip(completions, logprobs, rewards, strict=False))
    ]
    backend = VerlBackend(
        model_path=str(model_dir), lr=1e-5, micro_batch_size=PROMPTS * GROUP, workdir=str(workdir)
    )  # old log-probs: the engine's, as in TRL with num_iterations=1
    backend.setup(None)
    backend.train_step(transitions, 0)  # warm-up
    started = time.perf_counter()
    for step in range(steps):
        backend.train_step(transitions, step + 1)
    elapsed = time.perf_counter() - started
    return steps * PROMPTS * GROUP * (PROMPT_LEN + RESPONSE_LEN) / elapsed


def bench_trl(model_dir: Path, batch, steps: int, workdir: Path) -> float:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    prompts, completions, logprobs, rewards = batch
    texts = [f"prompt {i}" for i in range(PROMPTS)]
    index = {text: i for i, text in enumerate(texts)}

    def rollout(prompt_list, trainer):
        # TRL passes each prompt once per generation (its sampler repeats them): one completion each.
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "reward": []}
        seen: dict[int, int] = {}
        for text in prompt_list:
            i = index[text]
            j = i * GROUP + seen.get(i, 0) % GROUP
            seen[i] = seen.get(i, 0) + 1
            out["prompt_ids"].append(prompts[i])
            out["completion_ids"].append(completions[j])
            out["logprobs"].append(logprobs[j])
            out["reward"].append(rewards[j])
        return out

    def reward_fn(completions, reward, **_):
        return list(reward)

    class Timer(TrainerCallback):
        def __init__(self):
            self.starts: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.starts.append(time.perf_counter())

    timer = Timer()
    config = GRPOConfig(
        output_dir=str(workdir),
        use_cpu=True,
        per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP,
        gradient_accumulation_steps=1,
        max_steps=steps + 1,
        learning_rate=1e-5,
        beta=0.0,
        num_iterations=1,
        logging_steps=1000,
        save_strategy="no",
        report_to=[],
        max_completion_length=RESPONSE_LEN,
        seed=0,
        dataloader_num_workers=0,
        bf16=False,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=reward_fn,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": texts * (steps + 2)}),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        rollout_func=rollout,
        callbacks=[timer],
    )
    trainer.train()
    elapsed = time.perf_counter() - timer.starts[1]  # from the second step: the first is warm-up
    return steps * PROMPTS * GROUP * (PROMPT_LEN + RESPONSE_LEN) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from agl_verl.models import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="agl-bench-train-"))
    corpus = [" ".join(random.Random(i).choices("abcdefghij0123456789", k=12)) for i in range(200)]
    model_dir = build_tiny_model(
        work / "model", corpus, vocab_size=256, hidden_size=args.hidden, layers=args.layers, seed=0
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab = sorted(set(tokenizer.get_vocab().values()) - set(tokenizer.all_special_ids))
    batch = fixed_batch(vocab)
    tokens = PROMPTS * GROUP * (PROMPT_LEN + RESPONSE_LEN)
    print(
        f"tiny Llama: hidden {args.hidden}, {args.layers} layers, vocab {len(tokenizer)}; "
        f"batch {PROMPTS}x{GROUP} samples x {PROMPT_LEN}+{RESPONSE_LEN} tokens = {tokens} tokens/step; "
        f"{args.steps} timed steps, CPU, {os.cpu_count()} cores"
    )
    agl_tps = bench_agl(model_dir, batch, args.steps, work / "agl")
    trl_tps = bench_trl(model_dir, batch, args.steps, work / "trl")
    print(f"{'agl-verl local backend':<28}{agl_tps:>12,.0f} training tokens/s")
    print(f"{'TRL GRPOTrainer (baseline)':<28}{trl_tps:>12,.0f} training tokens/s")
    print(f"{'ratio agl / TRL':<28}{agl_tps / trl_tps:>12.2f}x")


if __name__ == "__main__":
    main()
