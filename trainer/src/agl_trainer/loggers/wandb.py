"""Weights & Biases, offline by default: the run is written under ``<workdir>/wandb``.

``wandb sync <workdir>/wandb/offline-run-*`` uploads it later (or ``mode: online``
logs straight to the server, for machines that reach it). Why offline by default:
training machines often have no internet, a run must never wait on a server, and
nothing leaves the machine unless the user asks. So offline, the logger also turns
off W&B's own error reporting (``WANDB_ERROR_REPORTING=false``) unless that variable
is set already. A resumed agl run logs to the same W&B run id (a new offline folder,
which ``wandb sync`` adds to the same run).

What goes in: the config (secrets replaced by ``***``) as the run's config, the
agl run id as the W&B run's name, and every numeric value of each step record at
the step's number, named by :func:`~agl_trainer.loggers.base.metric_name`
(``train/reward_mean``, ``val/success_rate``, …), which W&B shows as sections.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from agl_trainer.loggers.base import Logger, LoggerOptions, RunInfo


class WandbOptions(LoggerOptions):
    """Options of the ``wandb`` logger."""

    project: str = Field(default="agl", min_length=1, description="the W&B project")
    entity: str | None = Field(default=None, description="the W&B team or user (default: yours)")
    name: str | None = Field(default=None, description="the run's display name (default: agl's run id)")
    group: str | None = Field(default=None, description="a W&B group to put the run in")
    tags: list[str] = Field(default_factory=list, description="W&B tags")
    dir: str | None = Field(default=None, description="where the wandb/ folder goes (default: the workdir)")
    mode: Literal["offline", "online"] = Field(default="offline", description="'online' logs to the server")
    system_metrics: bool = Field(default=True, description="W&B's CPU, GPU and memory charts")


class WandbLogger(Logger):
    """Logs to a W&B run (see the module docstring)."""

    name = "wandb"
    options_model = WandbOptions
    package = "wandb"
    extra = "wandb"
    options: WandbOptions
    _run: Any = None

    @property
    def run_dir(self) -> Path | None:
        """The W&B run's own folder (``.../wandb/offline-run-<time>-<id>``), once open."""
        return None if self._run is None else Path(self._run.dir).parent

    def open(self, run: RunInfo) -> None:
        o = self.options
        if o.mode == "offline":
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # read when W&B's service starts
        import wandb

        directory = Path(o.dir) if o.dir else run.workdir
        directory.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(
            console="off",  # the trainer's own output stays where it was
            quiet=True,
            x_disable_stats=not o.system_metrics,
            x_save_requirements=False,
            save_code=False,
            disable_git=True,
        )
        self._run = wandb.init(
            project=o.project,
            entity=o.entity,
            name=o.name or run.run_id,
            id=run.run_id,
            resume="allow",
            group=o.group,
            tags=o.tags or None,
            dir=str(directory),
            mode=o.mode,
            config={**run.config, "agl_run_id": run.run_id},
            reinit="create_new",  # one W&B run per Trainer.fit, even several in one process
            settings=settings,
        )

    def write(self, step: int, values: dict[str, float]) -> None:
        self._run.log(values, step=step)

    def close(self, failed: bool = False) -> None:
        if self._run is not None:
            run, self._run = self._run, None
            run.finish(exit_code=1 if failed else 0)


__all__ = ["WandbLogger", "WandbOptions"]
