"""``--logger tensorboard|wandb``: switch the trainer's experiment-tracker loggers on from the
command line, in every example (first_digit's ``train`` and the shared runner's).

Each adds an entry to the trainer config's ``loggers`` (see :mod:`agl_trainer.loggers`):
TensorBoard event files in ``<workdir>/tensorboard``, an offline W&B run in ``<workdir>/wandb``.
Their libraries are agl-trainer's extras: ``pip install 'agl-trainer[tensorboard,wandb]'``.
"""

from __future__ import annotations

import argparse
from typing import Any

LOGGERS = ("tensorboard", "wandb")
"""The loggers the option offers (agl-trainer's own)."""


def add_logger_argument(parser: argparse.ArgumentParser) -> None:
    """``--logger NAME`` (repeat it for both)."""
    parser.add_argument(
        "--logger",
        action="append",
        choices=LOGGERS,
        default=[],
        help="also log every step to TensorBoard (<workdir>/tensorboard) or W&B (offline, <workdir>/wandb); "
        "repeat for both",
    )


def with_loggers(config: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``config`` with the loggers ``--logger`` named added to its ``loggers`` (each once)."""
    if not args.logger:
        return config
    have = list(config.get("loggers") or [])
    named = {entry if isinstance(entry, str) else entry.get("name") for entry in have}
    return {**config, "loggers": have + [name for name in dict.fromkeys(args.logger) if name not in named]}
