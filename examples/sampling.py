"""Sampling a split several times (what a GRPO group of that size would see on it), and the
evaluation scripts' options for it.

An evaluation with ``samples`` above 1 runs every item of a split that many times, each
as its own task (``<task id>#sample<k>``), at a temperature above 0. Grouping the scores
back by item tells how many items a group of that size would learn from: GRPO's
advantage is zero in a group whose rewards are all equal.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from agl.schema import Task

SAMPLE_SEPARATOR = "#sample"


def item_id(task_id: str) -> str:
    """The item a (possibly sampled) task id stands for: ``calc-val-003#sample2`` -> ``calc-val-003``."""
    return task_id.split(SAMPLE_SEPARATOR, 1)[0]


def sampled_tasks(items: list[dict], *, samples: int, split: str) -> list[Task]:
    """``samples`` tasks for each item (its own id when ``samples`` is 1); refuses fewer than 1."""
    if samples < 1:
        raise ValueError(f"samples: must be at least 1, got {samples}")
    suffixes = [f"{SAMPLE_SEPARATOR}{k}" for k in range(samples)] if samples > 1 else [""]
    return [Task(task_id=t["task_id"] + s, input=t["input"], split=split) for t in items for s in suffixes]


def group_by_item(scores: dict[str, float]) -> dict[str, list[float]]:
    """Scores by task id, grouped by the item each task samples."""
    groups: dict[str, list[float]] = {}
    for task_id, score in scores.items():
        groups.setdefault(item_id(task_id), []).append(score)
    return groups


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """An evaluation script's ``--temperature`` and ``--samples``."""
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: greedy)")
    parser.add_argument("--samples", type=int, default=1, help="runs per item of the split")


def check_sampling_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse ``--samples`` below 1, or above 1 when greedy (every run would be the same)."""
    if args.samples < 1:
        parser.error(f"--samples: must be at least 1, got {args.samples}")
    if args.samples > 1 and args.temperature == 0:
        parser.error("--samples: more than one sample needs a --temperature above 0 (greedy runs are all the same)")


def evaluation_facts(args: argparse.Namespace, checkpoint: Path | None, started: float) -> dict[str, Any]:
    """What an evaluation script records beside its summary: its options and wall seconds since ``started``."""
    return {
        "split": args.split,
        "limit": args.limit,
        "temperature": args.temperature,
        "samples": args.samples,
        "checkpoint": str(checkpoint) if checkpoint else None,
        "max_response_tokens": args.max_response_tokens,
        "wall_s": round(time.monotonic() - started, 1),
    }
