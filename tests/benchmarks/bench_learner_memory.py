"""The local learner's peak memory in an update, with and without gradient checkpointing, same run.

The batch has the lengths of a real calculator-agent step (``examples/calc_agent``, seed 0,
step 1, its first group): 8 rollouts of one call, a 342-token prompt and
responses of 37 to 64 tokens; one micro-batch of 8, as in the example's config. The model
is the bundled SmolLM2-135M-Instruct with the examples' LoRA adapter, at their temperature,
where old log-probs come from the policy, as in their runs (from the update's own forward pass:
``bench_old_log_probs``).

Each configuration runs in a fresh process, which reports its resident memory once the
learner is set up, its peak (``ru_maxrss``) over an untimed warm-up update and ``--steps``
timed ones, and their mean seconds. Each runs twice: with glibc's allocator as it comes, and
with ``MALLOC_MMAP_THRESHOLD_=65536``, which hands every large block back to the system when
it is freed, so that the peak counts only the memory the update holds at once.

    .venv/bin/python -m tests.benchmarks.bench_learner_memory [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.benchmarks.smollm2_learner import lora_backend, smollm2_vocab

PROMPT = 342
RESPONSES = [64, 41, 41, 41, 41, 41, 37, 41]
"""The step's lengths: ``python -m examples.calc_agent.train --seed 0``, step 1, group 0."""


def calc_batch(vocab: list[int], seed: int = 0):
    """One group of 8 transitions of the step's lengths, with rewards that give every one signal."""
    from agl.schema import Transition

    rng = random.Random(seed)
    prompt = rng.choices(vocab, k=PROMPT)
    return [
        Transition(
            rollout_id=f"r{i}",
            task_id="p0",
            step=0,
            prompt_ids=prompt,
            response_ids=rng.choices(vocab, k=length),
            response_logprobs=[-2.0] * length,
            reward=float(i % 2),
        )
        for i, length in enumerate(RESPONSES)
    ]


def rss_mib() -> float:
    """This process's resident memory now."""
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return kib / 1024


def child(checkpointing: bool, steps: int) -> None:
    """Set up a learner, run ``steps`` updates, print one JSON line of figures."""
    import torch

    from agl_verl.models import smollm2_dir

    torch.set_num_threads(os.cpu_count() or 1)
    model_dir = smollm2_dir()
    workdir = tempfile.mkdtemp(prefix="agl-bench-memory-")
    backend = lora_backend(model_dir, workdir, 8, gradient_checkpointing=checkpointing)
    batch = calc_batch(smollm2_vocab(model_dir))
    set_up = rss_mib()
    backend.train_step(batch, 0)
    started = time.perf_counter()
    for step in range(steps):
        backend.train_step(batch, step + 1)
    seconds = (time.perf_counter() - started) / steps
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"set_up_mib": set_up, "peak_mib": peak, "update_s": seconds}))


ALLOCATORS = {"glibc": {}, "mmap 64K": {"MALLOC_MMAP_THRESHOLD_": "65536"}}
"""glibc's allocator as it comes, and with large blocks returned to the system as they are freed."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--child", choices=["off", "on"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child == "on", args.steps)
        return
    tokens = len(RESPONSES) * PROMPT + sum(RESPONSES)
    print(
        f"SmolLM2-135M + LoRA, {len(RESPONSES)} transitions ({tokens} tokens) in one micro-batch, "
        f"a warm-up and {args.steps} timed update(s) each, CPU, a fresh process per row"
    )
    print(f"{'checkpointing':<15}{'allocator':<11}{'set up MiB':>11}{'peak MiB':>10}{'update MiB':>12}{'s/update':>10}")
    for allocator, env in ALLOCATORS.items():
        for mode in ("off", "on"):  # off, the learner's default, is the baseline
            command = [sys.executable, "-m", "tests.benchmarks.bench_learner_memory", "--child", mode]
            out = subprocess.run(
                [*command, "--steps", str(args.steps)],
                check=True,
                capture_output=True,
                text=True,
                cwd=Path(__file__).parents[2],
                env={**os.environ, **env},
            ).stdout
            figures = json.loads(out.strip().splitlines()[-1])
            grown = figures["peak_mib"] - figures["set_up_mib"]
            print(
                f"{mode:<15}{allocator:<11}{figures['set_up_mib']:>11.0f}{figures['peak_mib']:>10.0f}{grown:>12.0f}"
                f"{figures['update_s']:>10.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
