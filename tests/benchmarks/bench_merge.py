"""Merged rows (``transitions.merge="prefix"``) against one row per call: how many calls merge, the
tokens the learner processes and its update time, in the same run on the same model.

Batches:

* the recorded steps of the examples (``data/steps/``, see :mod:`tests.benchmarks.step_fixtures`):
  the retrieval, SQL and calculator agents' transitions as their backend got them, merged rollout
  by rollout with the builder's own merge (:func:`agl_trainer.transitions.merge.merge_prefix`).
  Besides the trained calls, every recorded call of a rollout is checked against the one before it
  (the SQL agent's checker calls are recorded but not trained);
* ``tool8``: a synthetic tool agent, one GRPO group of ``--rollouts`` rollouts of 8 turns, each
  prompt the previous prompt, its response and a tool result (SmolLM2 token ids drawn at random,
  lengths below): every call extends the one before it.

The learner is the examples' (SmolLM2-135M-Instruct + LoRA, gradient checkpointing, micro-batch 8,
temperature 0.5). Each timed batch gets a fresh learner, one untimed warm-up step, then ``--steps``
timed ones; a batch with no call merged is the same batch both ways and is timed once.

    .venv/bin/python -m tests.benchmarks.bench_merge [--batches rag_agent sql_agent calc_agent tool8] [--no-time]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests.benchmarks.smollm2_learner import lora_backend, smollm2_vocab
from tests.benchmarks.step_fixtures import fixtures_of, load_fixture

TOOL_AGENT = {"system": 200, "response": (15, 40), "tool_result": (20, 60), "turns": 8}
"""The synthetic agent's lengths in tokens: a system and task prompt, then per turn a response and a
tool result (each drawn uniformly from its range)."""


def merge_rollouts(transitions):
    """The transitions merged rollout by rollout (in step order); with the build report's counts."""
    from agl_trainer.transitions.config import BuildReport
    from agl_trainer.transitions.merge import merge_prefix

    report = BuildReport()
    by_rollout: dict[str, list] = {}
    for t in transitions:
        by_rollout.setdefault(t.rollout_id, []).append(t)
    rows = []
    for calls in by_rollout.values():
        rows.extend(merge_prefix(sorted(calls, key=lambda t: t.step), report))
    return rows, report


def recorded_extensions(fixture) -> Counter:
    """Of each recorded call after the first of its rollout (trained or not): does its prompt begin
    with the previous call's prompt and response ids?"""
    out: Counter = Counter()
    for calls in fixture.rollouts:
        for previous, following in zip(calls, calls[1:], strict=False):
            prefix = previous.prompt_ids + previous.response_ids
            out["extends" if following.prompt_ids[: len(prefix)] == prefix else "does not"] += 1
    return out


def tool_agent_batch(vocab: list[int], rollouts: int, seed: int = 0):
    """Per-call transitions of ``rollouts`` runs of the synthetic 8-turn tool agent, one task (one group)."""
    from agl.schema import Transition

    rng = random.Random(seed)
    shape = TOOL_AGENT
    system = rng.choices(vocab, k=shape["system"])
    out = []
    for r in range(rollouts):
        prompt, reward = list(system), rng.random()
        for turn in range(shape["turns"]):
            response = rng.choices(vocab, k=rng.randint(*shape["response"]))
            out.append(
                Transition(
                    rollout_id=f"tool8-r{r}",
                    task_id="tool8",
                    step=turn,
                    agent="assistant",
                    prompt_ids=prompt,
                    response_ids=response,
                    response_logprobs=[-2.0] * len(response),
                    reward=reward,
                    weight=1 / shape["turns"],
                )
            )
            prompt = prompt + response + rng.choices(vocab, k=rng.randint(*shape["tool_result"]))
    return out


def tokens(batch) -> int:
    """Prompt and response tokens over the batch's rows: what the learner's forward passes attend to."""
    return sum(len(t.prompt_ids) + len(t.response_ids) for t in batch)


def time_update(model_dir: Path, batch, steps: int, workdir: Path) -> float:
    """Seconds per train step (after a warm-up step) of a fresh learner as the examples run it."""
    backend = lora_backend(model_dir, workdir, 8, gradient_checkpointing=True)
    backend.train_step(batch, 0)
    started = time.perf_counter()
    for step in range(steps):
        backend.train_step(batch, step + 1)
    return (time.perf_counter() - started) / steps


def batches(names: list[str], vocab: list[int], rollouts: int):
    """``(name, per-call transitions, recorded extensions or None)`` of each batch asked for."""
    for name in names:
        if name == "tool8":
            yield f"tool8 ({rollouts} rollouts x 8 turns)", tool_agent_batch(vocab, rollouts), None
            continue
        paths = fixtures_of(name)
        if not paths:
            raise SystemExit(f"--batches: no recorded step of {name!r} in {paths}")
        fixture = load_fixture(paths[0])
        yield f"{name} step {fixture.step}", fixture.build_transitions(), recorded_extensions(fixture)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", nargs="+", default=["rag_agent", "sql_agent", "calc_agent", "tool8"])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts of the synthetic tool agent")
    parser.add_argument("--no-time", action="store_true", help="count merges and tokens only")
    args = parser.parse_args()

    import torch

    from agl_verl.models import smollm2_dir

    torch.set_num_threads(os.cpu_count() or 1)
    model_dir = smollm2_dir()
    vocab = smollm2_vocab(model_dir)
    work = Path(tempfile.mkdtemp(prefix="agl-bench-merge-"))
    print(
        f"SmolLM2-135M + LoRA, gradient checkpointing, micro-batch 8; {args.steps} timed step(s) after a warm-up; "
        f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    for name, calls, recorded in batches(args.batches, vocab, args.rollouts):
        rows, report = merge_rollouts(calls)
        breaks = ", ".join(f"{k} {v}" for k, v in sorted(report.merge_breaks.items())) or "none"
        after_first = report.merged_calls + sum(report.merge_breaks.values())
        line = (
            f"{name}: {len(calls)} calls -> {len(rows)} rows; {report.merged_calls} of {after_first} calls after "
            f"their rollout's first merged ({report.merged_calls / max(1, after_first):.0%}), breaks: {breaks}"
        )
        if recorded is not None:
            line += f"; every recorded call against the one before: {dict(recorded)}"
        print(line, flush=True)
        per_call, merged = tokens(calls), tokens(rows)
        print(f"  tokens the learner processes: per call {per_call}, merged {merged} ({merged / per_call:.2f}x)")
        if args.no_time:
            continue
        seconds = time_update(model_dir, calls, args.steps, work / f"{name}-calls")
        if len(rows) == len(calls):
            print(f"  update: {seconds:.1f} s/step (no call merged: the same batch both ways)", flush=True)
            continue
        merged_s = time_update(model_dir, rows, args.steps, work / f"{name}-rows")
        print(f"  update: per call {seconds:.1f} s/step, merged {merged_s:.1f} s/step ({merged_s / seconds:.2f}x)")


if __name__ == "__main__":
    main()
