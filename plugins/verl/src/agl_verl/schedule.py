"""The local learner's learning-rate schedule, built by verl's own functions as verl's actor builds it.

verl's FSDP engine (``verl.workers.engine.fsdp.transformer_impl``, ``_build_lr_scheduler``)
takes ``lr_warmup_steps`` (0 or less: ``int(lr_warmup_steps_ratio * total_training_steps)``)
and calls ``verl.utils.torch_functional.get_constant_schedule_with_warmup`` or
``get_cosine_schedule_with_warmup``; its worker steps the scheduler once per training step,
after the step's last mini-batch, whether or not that mini-batch's optimizer step was taken
(``verl.workers.engine_workers``, ``update_lr_scheduler``). :func:`build_lr_scheduler` builds
the same ``LambdaLR``; :class:`agl_verl.local.LocalLearner` steps it at the same place.
"""

from __future__ import annotations

import warnings

import torch
from torch.optim.lr_scheduler import LambdaLR
from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from agl.errors import ConfigError
from agl_verl.config import VerlSettings


def warmup_steps(settings: VerlSettings, total_steps: int | None) -> int:
    """verl's number of warmup steps: ``lr_warmup_steps``, or, at 0 or less, the ratio of the total (rounded down)."""
    if settings.lr_warmup_steps > 0:
        return settings.lr_warmup_steps
    if settings.lr_warmup_steps_ratio == 0:
        return 0
    return int(settings.lr_warmup_steps_ratio * _required(total_steps, settings))


def build_lr_scheduler(optimizer: torch.optim.Optimizer, settings: VerlSettings, total_steps: int | None) -> LambdaLR:
    """verl's scheduler for ``settings`` over ``total_steps`` training steps (None: not known, which only a
    schedule that does not depend on it accepts). Building it sets the optimizer's lr to the first step's."""
    warmup = warmup_steps(settings, total_steps)
    if settings.lr_scheduler_type == "constant":
        return get_constant_schedule_with_warmup(optimizer=optimizer, num_warmup_steps=warmup)
    return get_cosine_schedule_with_warmup(
        optimizer=optimizer,
        num_warmup_steps=warmup,
        num_training_steps=_required(total_steps, settings),
        min_lr_ratio=settings.min_lr_ratio,
        num_cycles=settings.num_cycles,
        zero_indexed_step=settings.zero_indexed_step,
    )


def advance(scheduler: LambdaLR) -> None:
    """One schedule step. torch warns when a scheduler steps before any optimizer step; verl's schedule
    steps then too (a first update that took no optimizer step), so that warning says nothing here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
        scheduler.step()


def _required(total_steps: int | None, settings: VerlSettings) -> int:
    if total_steps is None:
        what = (
            f"lr_scheduler_type {settings.lr_scheduler_type!r}"
            if settings.lr_scheduler_type == "cosine"
            else f"lr_warmup_steps_ratio {settings.lr_warmup_steps_ratio:g}"
        )
        raise ConfigError(
            f"{what} needs the run's total training steps, which this backend was not told "
            "(BackendContext.total_steps: the trainer's steps); set lr_warmup_steps instead, or train through a "
            "trainer that tells it"
        )
    return total_steps
