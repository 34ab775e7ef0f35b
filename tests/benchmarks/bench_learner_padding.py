"""The local learner's update on a retrieval agent's batch: micro-batches cut to their rows, against the
whole batch's padding (the learner before it trimmed), same run, same batch, same model.

The batch has the shape of a retrieval-agent step (``examples/rag_agent``): 8 rollouts of two calls
each, with the lengths of the calls the base model made on that example's test split (first calls:
prompts of 250-261 tokens, responses of 15-50; second calls: prompts of 304-410, responses of
28-77). Padded to the batch's longest, 26% of this one is padding.

The model is the bundled SmolLM2-135M-Instruct with the examples' LoRA adapter, at the examples'
temperature, so old log-probs are recomputed as in their runs. Each configuration trains a fresh
learner for ``--steps`` timed steps after one untimed warm-up step.

    .venv/bin/python -m tests.benchmarks.bench_learner_padding [--steps 2] [--micro 16 8 4]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import tempfile
import time
from pathlib import Path

FIRST_CALLS = ((250, 261), (15, 50))
SECOND_CALLS = ((304, 410), (28, 77))
ROLLOUTS = 8


def rag_batch(vocab: list[int], seed: int = 0):
    """16 transitions in one group: each rollout's two calls, with rewards that give signal."""
    from agl.schema import Transition

    rng = random.Random(seed)
    out = []
    for i in range(ROLLOUTS):
        reward = rng.random()
        for step, ((p_lo, p_hi), (r_lo, r_hi)) in enumerate((FIRST_CALLS, SECOND_CALLS)):
            r_len = rng.randint(r_lo, r_hi)
            out.append(
                Transition(
                    rollout_id=f"r{i}",
                    task_id="q0",
                    step=step,
                    prompt_ids=rng.choices(vocab, k=rng.randint(p_lo, p_hi)),
                    response_ids=rng.choices(vocab, k=r_len),
                    response_logprobs=[-2.0] * r_len,
                    reward=reward,
                )
            )
    return out


def padding_share(transitions) -> float:
    p = max(len(t.prompt_ids) for t in transitions)
    r = max(len(t.response_ids) for t in transitions)
    used = sum(len(t.prompt_ids) + len(t.response_ids) for t in transitions)
    return 1 - used / (len(transitions) * (p + r))


@contextlib.contextmanager
def whole_batch_padding():
    """The learner as it was: every forward pass over all columns, rows in the batch's order."""
    import torch

    import agl_verl.local as local

    saved = local.columns_in_use, local.by_length
    local.columns_in_use = lambda mask, width: (0, width)
    local.by_length = lambda data: torch.arange(len(data))
    try:
        yield
    finally:
        local.columns_in_use, local.by_length = saved


def time_updates(model_dir: Path, batch, micro: int, steps: int, workdir: Path) -> float:
    """Seconds per train step (after a warm-up step) of a fresh LoRA learner."""
    from agl_verl.backend import VerlBackend

    backend = VerlBackend(
        model_path=str(model_dir),
        lr=3e-4,
        micro_batch_size=micro,
        seed=0,
        workdir=str(workdir),
        temperature=0.5,
        lora={"r": 16, "alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
    )
    backend.setup(None)
    backend.train_step(batch, 0)
    started = time.perf_counter()
    for step in range(steps):
        backend.train_step(batch, step + 1)
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--micro", type=int, nargs="+", default=[16, 8, 4], help="micro-batch sizes to time")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    from agl_verl.models import smollm2_dir

    torch.set_num_threads(os.cpu_count() or 1)
    model_dir = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab = sorted(set(tokenizer.get_vocab().values()) - set(tokenizer.all_special_ids))
    batch = rag_batch(vocab)
    tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in batch)
    print(
        f"SmolLM2-135M + LoRA, {len(batch)} transitions, {tokens} tokens, "
        f"{padding_share(batch):.0%} of the padded batch is padding; "
        f"{args.steps} timed steps each, CPU, {torch.get_num_threads()} threads"
    )
    work = Path(tempfile.mkdtemp(prefix="agl-bench-padding-"))
    with whole_batch_padding():
        baseline = time_updates(model_dir, batch, 16, args.steps, work / "baseline")
    print(f"{'whole-batch padding, micro 16 (baseline)':<44}{baseline:>8.1f} s/step")
    for micro in args.micro:
        seconds = time_updates(model_dir, batch, micro, args.steps, work / f"trimmed-{micro}")
        print(f"{f'trimmed, sorted by length, micro {micro}':<44}{seconds:>8.1f} s/step  {baseline / seconds:.2f}x")


if __name__ == "__main__":
    main()
