"""The local learner's update with the PPO old log-probs taken from the loss forward pass (``old_log_probs=
"auto"``) against a forward pass of their own first (``"recompute"``, the learner before), same run, same
batches, same model.

The model is the bundled SmolLM2-135M-Instruct with the examples' LoRA adapter and gradient
checkpointing, at their temperature (0.5) and micro-batch size (8), one mini-batch and one epoch as
in their runs: at 0.5 the engine's log-probs are not the sampling policy's, so the old log-probs
come from the policy. The batches have the lengths of real steps: a calculator-agent group
(``bench_learner_memory``: 8 transitions, a 342-token prompt, responses of 37-64 tokens) and a
retrieval-agent step (``bench_learner_padding``: 16 transitions of 266-446 tokens). Each
configuration trains a fresh learner: one untimed warm-up step, then ``--steps`` timed ones, the two
learners' steps alternating; the figure is the least of the learner's own ``update_s`` (advantages,
old log-probs, forward, backward, AdamW), the least disturbed by anything else on the machine.

    .venv/bin/python -m tests.benchmarks.bench_old_log_probs [--steps 1] [--batches calc rag]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from tests.benchmarks.bench_learner_memory import calc_batch
from tests.benchmarks.bench_learner_padding import rag_batch
from tests.benchmarks.smollm2_learner import lora_backend, smollm2_vocab

MODES = {
    "recompute": "old log-probs in a pass of their own (before)",
    "auto": "old log-probs from the loss forward pass",
}


def update_seconds(model_dir: Path, batch, steps: int, workdir: Path) -> dict[str, list[float]]:
    """Each mode's ``update_s`` of ``steps`` timed steps, after a warm-up step, of a fresh learner
    per mode; the two learners' steps alternate, so that whatever else the machine does falls on
    both alike."""
    backends = {
        mode: lora_backend(model_dir, workdir / mode, 8, gradient_checkpointing=True, old_log_probs=mode)
        for mode in MODES
    }
    for backend in backends.values():
        backend.train_step(batch, 0)
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    for step in range(steps):
        for mode, backend in backends.items():
            seconds[mode].append(backend.train_step(batch, step + 1)["update_s"])
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--batches", nargs="+", choices=["calc", "rag"], default=["calc", "rag"])
    args = parser.parse_args()

    import torch

    from agl_verl.models import smollm2_dir

    torch.set_num_threads(os.cpu_count() or 1)
    model_dir = smollm2_dir()
    vocab = smollm2_vocab(model_dir)
    batches = {"calc": calc_batch(vocab), "rag": rag_batch(vocab)}
    print(
        f"SmolLM2-135M + LoRA, gradient checkpointing, temperature 0.5, micro-batch 8; a warm-up and "
        f"{args.steps} timed step(s) each, CPU, {torch.get_num_threads()} threads"
    )
    work = Path(tempfile.mkdtemp(prefix="agl-bench-old-log-probs-"))
    for name in args.batches:
        batch = batches[name]
        tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in batch)
        print(f"{name}: {len(batch)} transitions, {tokens} tokens", flush=True)
        seconds = update_seconds(model_dir, batch, args.steps, work / name)
        for mode, label in MODES.items():
            times = " ".join(f"{t:.1f}" for t in seconds[mode])
            print(f"  {label:<44}{min(seconds[mode]):>7.1f} s/update (least of: {times})", flush=True)
        print(f"  saved {1 - min(seconds['auto']) / min(seconds['recompute']):.0%}", flush=True)


if __name__ == "__main__":
    main()
