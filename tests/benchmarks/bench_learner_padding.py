"""The local learner's update on a retrieval agent's batch: micro-batches cut to their rows and logits
for the response alone, against the learner before (the whole batch's padding, the LM head over every
position), same run, same batch, same model.

The batch has the lengths of a real retrieval-agent step (``examples/rag_agent``, seed 0, step 2):
8 rollouts of two calls each, prompts of 251 and 304-361 tokens, responses of 15-96. Padded to the
batch's longest, 27% of it is padding.

The model is the bundled SmolLM2-135M-Instruct with the examples' LoRA adapter, at the examples'
temperature, where old log-probs come from the policy (the update's own forward pass since
``bench_old_log_probs``'s change; a pass of their own before it). Each configuration trains a fresh
learner for ``--steps`` timed steps after one untimed warm-up step.

    .venv/bin/python -m tests.benchmarks.bench_learner_padding [--steps 1] [--runs padded-16 trimmed-8 current-8]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import tempfile
import time
from pathlib import Path

from tests.benchmarks.smollm2_learner import lora_backend, smollm2_vocab

STEP_LENGTHS = [
    ((251, 31), (342, 35)),
    ((251, 44), (311, 15)),
    ((251, 52), (318, 15)),
    ((251, 37), (304, 15)),
    ((251, 50), (342, 52)),
    ((251, 58), (325, 15)),
    ((251, 96), (361, 85)),
    ((251, 50), (361, 42)),
]
"""(prompt, response) lengths of each rollout's two calls in a real step: seed 0's second step of
``python -m examples.rag_agent.train --steps 15``."""


def rag_batch(vocab: list[int], seed: int = 0):
    """16 transitions in one group, of the step's lengths, with rewards that give signal."""
    from agl.schema import Transition

    rng = random.Random(seed)
    out = []
    for i, calls in enumerate(STEP_LENGTHS):
        reward = rng.random()
        for step, (p_len, r_len) in enumerate(calls):
            out.append(
                Transition(
                    rollout_id=f"r{i}",
                    task_id="q0",
                    step=step,
                    prompt_ids=rng.choices(vocab, k=p_len),
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


def time_updates(model_dir: Path, batch, micro: int, steps: int, workdir: Path, *, all_logits: bool) -> float:
    """Seconds per train step (after a warm-up step) of a fresh LoRA learner; ``all_logits``: the LM
    head over every position, as before the learner asked the model for the response's alone."""
    backend = lora_backend(model_dir, workdir, micro)
    if all_logits:
        backend.learner.keeps_logits = False
    backend.train_step(batch, 0)
    started = time.perf_counter()
    for step in range(steps):
        backend.train_step(batch, step + 1)
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument(
        "--runs",
        nargs="+",
        default=["padded-16", "current-8"],
        help="what to time, in order: padded-<micro> (the baseline), trimmed-<micro> or current-<micro>",
    )
    args = parser.parse_args()

    import torch

    from agl_verl.models import smollm2_dir

    torch.set_num_threads(os.cpu_count() or 1)
    model_dir = smollm2_dir()
    batch = rag_batch(smollm2_vocab(model_dir))
    tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in batch)
    print(
        f"SmolLM2-135M + LoRA, {len(batch)} transitions, {tokens} tokens, "
        f"{padding_share(batch):.0%} of the padded batch is padding; "
        f"{args.steps} timed steps each, CPU, {torch.get_num_threads()} threads"
    )
    work = Path(tempfile.mkdtemp(prefix="agl-bench-padding-"))
    labels = {
        "padded": "the learner before: whole-batch padding, all logits",
        "trimmed": "trimmed, sorted by length, all logits",
        "current": "trimmed, sorted, the response's logits alone",
    }
    for i, run in enumerate(args.runs):
        kind, _, micro = run.partition("-")
        padding = whole_batch_padding() if kind == "padded" else contextlib.nullcontext()
        with padding:
            seconds = time_updates(
                model_dir, batch, int(micro), args.steps, work / f"{i}-{run}", all_logits=kind != "current"
            )
        print(f"{labels[kind]}, micro {micro:<4}{seconds:>8.1f} s/step", flush=True)


if __name__ == "__main__":
    main()
