"""The SQL agent as the shared runner runs it (:class:`examples.spec.ExampleSpec`).

Its arms are the experiment's (``--arm``, :data:`examples.sql_agent.config.ARMS`): the
results file of one is ``<arm>-seed<N>.json`` (``<arm>-steps<K>-seed<N>.json`` for another ``--steps``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from examples.spec import ExampleSpec, Subset

from .config import ARMS, STEPS, TRAIN_TIERS, trainer_config
from .database import DB_ENV, DEFAULT_DB, db_path
from .evaluation import agent_calls
from .questions import TIERS, load_split, of_tiers


def db_option(parser: argparse.ArgumentParser) -> None:
    """``--db``: the database file."""
    default = DEFAULT_DB.relative_to(Path(__file__).resolve().parents[2])
    parser.add_argument("--db", help=f"Chinook.db (default: ${DB_ENV} or {default})")


def use_db(args: argparse.Namespace) -> None:
    """Point the agent and the rewards at ``--db``; no database, no rewards: say so now, not as a run of zeros."""
    path = db_path(args.db)
    if args.db:
        os.environ[DB_ENV] = str(path)


def train_figures(store: Any, rollouts: list) -> dict[str, Any]:
    """The training rollouts' LLM calls per agent, and their count."""
    ids = [r.rollout_id for r in rollouts]
    return {"train_agent_calls": agent_calls(store, ids), "train_rollouts": len(ids)}


SPEC = ExampleSpec(
    __package__,
    noun="questions",
    trainer_config=lambda args, **run: trainer_config(args.arm, **run),
    reward_plugin="sql-execution-match",
    load_split=load_split,
    train_figures=train_figures,
    subset=Subset("tiers", "tiers", TRAIN_TIERS, of_tiers, type=str, choices=TIERS),
    arm=lambda args: args.arm if args.steps == STEPS else f"{args.arm}-steps{args.steps}",
    arm_key="arm",
    record_extras=lambda args, train: {"train_tiers": list(args.tiers)},
    options=db_option,
    train_options=lambda parser: parser.add_argument("--arm", choices=sorted(ARMS), default="main"),
    prepare=use_db,
)
