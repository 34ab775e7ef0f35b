"""The retrieval agent as the shared runner runs it (:class:`examples.spec.ExampleSpec`).

Arms: the config's hops, batch size and steps make ``rag_agent``; others are named in
the arm (``rag_agent-hops1-2-batch2``, ``rag_agent-steps15``).
"""

from __future__ import annotations

from typing import Any

from examples.spec import ExampleSpec, Subset

from .config import BATCH_SIZE, STEPS, TRAIN_HOPS, trainer_config
from .evaluation import summarize
from .questions import load_split, of_hops

NAME = "rag_agent"


def arm(hops: tuple[int, ...], batch_size: int, steps: int = STEPS) -> str:
    """The run's name in its results file: ``rag_agent``, plus what differs from the config."""
    parts = [NAME]
    if tuple(hops) != TRAIN_HOPS:
        parts.append("hops" + "-".join(str(n) for n in sorted(hops)))
    if batch_size != BATCH_SIZE:
        parts.append(f"batch{batch_size}")
    if steps != STEPS:
        parts.append(f"steps{steps}")
    return "-".join(parts)


def train_figures(store: Any, rollouts: list) -> dict[str, Any]:
    """The training rollouts' summary (F1, endings, tool calls) over the tasks the run stored."""
    tasks = {t.task_id: t.input for t in store.query_tasks()}
    return {"train": summarize(rollouts, tasks, store) if rollouts else None}


SPEC = ExampleSpec(
    __package__,
    noun="questions",
    trainer_config=lambda args, **run: trainer_config(**run),
    reward_plugin="rag-token-f1",
    load_split=load_split,
    train_figures=train_figures,
    subset=Subset("hops", "numbers of hops (1, 2)", TRAIN_HOPS, of_hops),
    arm=lambda args: arm(tuple(args.hops), args.batch_size, args.steps),
    score="f1",
    curve=("train_f1_by_step", "reward_mean"),
    record_extras=lambda args, train: {"train_hops": sorted(args.hops), "train_questions": len(train)},
)
