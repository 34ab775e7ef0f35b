"""The calculator agent as the shared runner runs it (:class:`examples.spec.ExampleSpec`).

Arms: the config's lr, optimizer steps and step count make ``calc_agent``; another ``--lr``,
``--steps-without-signal skip``, ``--max-staleness``, ``--filter-groups``, ``--operand-credit``, other
``--operations``, ``--curriculum`` or ``--steps`` is named in the arm (``calc_agent-lr0.001``,
``calc_agent-skip``, ``calc_agent-async1``, ``calc_agent-filter``, ``calc_agent-operands0.5``,
``calc_agent-ops2-3-4``, ``calc_agent-ops2-3from31``, ``calc_agent-steps60``).
"""

from __future__ import annotations

import argparse
from typing import Any

from examples.spec import ExampleSpec, Subset

from .config import LR, STEPS, TRAIN_OPERATIONS, trainer_config
from .curriculum import Curriculum
from .problems import load_split, of_operations
from .rewards import OperandCredit
from .tool_calls import tool_call_figures

NAME = "calc_agent"


def arm(
    lr: float,
    steps_without_signal: str,
    max_staleness: int = 0,
    steps: int = STEPS,
    curriculum: Curriculum | None = None,
    filter_groups: bool = False,
    operand_credit: float = 0.0,
    operations: tuple[int, ...] = TRAIN_OPERATIONS,
) -> str:
    """The run's name in its results file: ``calc_agent``, plus what differs from the config."""
    name = NAME if lr == LR else f"{NAME}-lr{lr:g}"
    name = name if steps_without_signal == "step" else f"{name}-{steps_without_signal}"
    name = name if max_staleness == 0 else f"{name}-async{max_staleness}"
    name = f"{name}-filter" if filter_groups else name
    name = f"{name}-operands{operand_credit:g}" if operand_credit else name
    ops = tuple(sorted(set(operations)))
    name = name if ops == TRAIN_OPERATIONS else f"{name}-ops{'-'.join(map(str, ops))}"
    name = name if curriculum is None else f"{name}-{curriculum.name}"
    return name if steps == STEPS else f"{name}-steps{steps}"


def train_options(parser: argparse.ArgumentParser) -> None:
    """``--lr`` and ``--steps-without-signal``."""
    parser.add_argument(
        "--lr", type=float, default=LR, help=f"LoRA learning rate (not {LR:g}: named in the results file)"
    )
    parser.add_argument(
        "--steps-without-signal",
        choices=["step", "skip"],
        default="step",
        help="on a step where no group has signal: step (AdamW on zero gradients, as verl) or skip "
        "(no optimizer step); skip is named in the results file",
    )
    parser.add_argument(
        "--max-staleness",
        type=int,
        default=0,
        help="asynchronous training: the next k steps' rollouts run while a step trains (0: lockstep; "
        "another k is named in the results file, calc_agent-async1)",
    )
    parser.add_argument(
        "--filter-groups",
        action="store_true",
        help="verl's DAPO dynamic sampling: a step trains only on groups whose rewards differ, running more "
        "batches of new problems until it has batch-size of them (named in the results file, calc_agent-filter)",
    )
    parser.add_argument(
        "--operand-credit",
        type=float,
        default=0.0,
        metavar="W",
        help="partial credit for a wrong answer: W (above 0, below 1) times the F1 of its calculator "
        "expression's numbers against the problem's (named in the results file, calc_agent-operands0.5)",
    )
    parser.add_argument(
        "--curriculum",
        type=Curriculum.parse,
        metavar="STEP:OPERATIONS",
        help="from step STEP on, train on the problems of these numbers of operations (31:2,3); the steps "
        "before it take the --operations ones (named in the results file, calc_agent-ops2-3from31)",
    )


def check_options(args: argparse.Namespace) -> None:
    """A curriculum whose second stage would start after the last step is a usage error, and so is one with
    ``--filter-groups``, whose steps take more problems than batch-size (the curriculum orders by step),
    and an ``--operand-credit`` outside (0, 1)."""
    if getattr(args, "operand_credit", 0.0):
        OperandCredit(args.operand_credit)
    if getattr(args, "curriculum", None) is not None:
        if getattr(args, "filter_groups", False):
            raise ValueError("--curriculum: cannot be used with --filter-groups (a step may take several batches)")
        args.curriculum.check(args.steps)


def task_order(args: argparse.Namespace, train: list[dict]) -> list[dict] | None:
    """With ``--curriculum``, the training problems in the order the steps take them; else None (shuffled)."""
    if args.curriculum is None:
        return None
    return args.curriculum.order(train, steps=args.steps, batch_size=args.batch_size, seed=args.seed)


def reward(args: argparse.Namespace) -> tuple[str, OperandCredit] | None:
    """With ``--operand-credit W``, the numeric match with partial credit; else None (the plain match)."""
    weight = getattr(args, "operand_credit", 0.0)
    return (f"calc-operand-credit-{weight:g}", OperandCredit(weight)) if weight else None


def train_figures(store: Any, rollouts: list) -> dict[str, Any]:
    """The training rollouts' count and tool-call figures."""
    ids = [r.rollout_id for r in rollouts]
    return {
        "train_rollouts": len(ids),
        "train_tool_calls": tool_call_figures(store.query_llm_calls(rollout_ids=ids), len(ids)),
    }


SPEC = ExampleSpec(
    __package__,
    noun="problems",
    trainer_config=lambda args, **run: trainer_config(
        **run,
        lr=args.lr,
        steps_without_signal=args.steps_without_signal,
        max_staleness=args.max_staleness,
        filter_groups=args.filter_groups,
    ),
    reward_plugin="calc-numeric-match",
    load_split=load_split,
    train_figures=train_figures,
    subset=Subset("operations", "numbers of operations", TRAIN_OPERATIONS, of_operations),
    arm=lambda args: arm(
        args.lr,
        args.steps_without_signal,
        args.max_staleness,
        args.steps,
        args.curriculum,
        args.filter_groups,
        args.operand_credit,
        tuple(args.operations),
    ),
    record_extras=lambda args, train: {
        "train_operations": list(args.operations),
        "steps_without_signal": args.steps_without_signal,
        "max_staleness": args.max_staleness,
        "filter_groups": args.filter_groups,
        "operand_credit": args.operand_credit,
        **({"curriculum": vars(args.curriculum)} if args.curriculum else {}),
    },
    train_options=train_options,
    reward=reward,
    prepare=check_options,
    task_order=task_order,
)
